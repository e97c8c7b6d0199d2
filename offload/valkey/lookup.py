"""How many leading pages of a prompt the pool holds: for the engine and for routers.

``PrefixProbe`` asks every node at once, in one round trip where the server
runs scripts: a small read-only Lua script per node (``layout.COUNTS``)
reads, for that node's keys in prompt order, how many pages the value under
each key holds, and stops at its first boundary key without a value; the
walk over the answers (``layout.leading``) gives the prefix. Keys go in
ARGV with the ``allow-cross-slot-keys`` flag, so on a cluster each node
checks all of its keys in one call. Where scripts are refused (an ACL, a
managed service) it falls back to pipelined ``GETRANGE`` in at most two
round trips (the first ``lookup_first_round`` keys, then the rest), and
says so once in the log. A node that is down answers nothing: its keys
count as missing, the prefix ends before the first of them.

``PoolLookup`` is the router's side: it turns a request's tokens into the
engines' page keys with a function the caller injects (the engines' chained
storage keys, which live above this layer) and asks the probe. It never
raises: a failed query is ``None``, which the router treats as "no pool";
its warnings are rate-limited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage import ModelFingerprint, StorageError
from radixcache.offload.storage import chunk
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.offload.valkey.layout import COUNTS, Cuts, leading
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable

log = logging.getLogger(__name__)


class PrefixProbe:
    """Counts the leading pages present in the pool (see the module docstring)."""

    def __init__(self, link: PoolLink, cuts: Cuts) -> None:
        self._link = link
        self._cuts = cuts
        self._key_prefix = link.config.key_prefix  # pool key = key prefix + record key
        self._scripts = True  # until the server refuses them
        self.round_trips = 0  # of the last call
        self.unavailable = False  # the last call met a node that could not answer

    def counts(self, rkeys: list[bytes], flags: Sequence[bool]) -> list[int]:
        """Per record key, the pages its value holds (0: none, or not asked:
        past a node's first boundary key without a value, or its node down)."""
        self.round_trips = 0
        self.unavailable = False
        out = [0] * len(rkeys)
        if not rkeys:
            return out
        pkeys = [self._key_prefix + k for k in rkeys]
        if self._scripts:
            marks = "".join("1" if f else "0" for f in flags)

            def command(positions: list[int]) -> tuple[Any, ...]:
                mine = "".join(marks[i] for i in positions)
                return ("EVAL", COUNTS, 0, mine, *(pkeys[i] for i in positions))

            replies = self._link.per_node(pkeys, command)
            refused = [r for _p, r in replies if _is_refusal(r)]
            if not refused:
                self.round_trips = 1
                for positions, reply in replies:
                    self._file(out, positions, reply)
                return out
            self._scripts = False
            log.info("pool lookups fall back to pipelined GETRANGE: %s", refused[0])
        return self._pipelined(pkeys, flags, out)

    def _file(self, out: list[int], positions: list[int], reply: Any) -> None:
        if isinstance(reply, PoolUnavailable):
            self.unavailable = True
            return
        if not isinstance(reply, list):
            return
        for i, n in zip(positions, reply):
            out[i] = int(n)

    def _pipelined(self, pkeys: list[bytes], flags: Sequence[bool], out: list[int]) -> list[int]:
        cut = self._link.config.lookup_first_round
        for start, part in ((0, pkeys[:cut]), (cut, pkeys[cut:])):
            if not part:
                break
            replies = self._link.run([("GETRANGE", k, 0, chunk.PREFIX_BYTES - 1) for k in part])
            self.round_trips += 1
            for i, reply in enumerate(replies):
                if isinstance(reply, PoolUnavailable):
                    self.unavailable = True
                elif isinstance(reply, bytes):
                    out[start + i] = chunk.value_count(reply) if reply else 0
                elif isinstance(reply, Exception):
                    out[start + i] = 1  # a key of another type: there (its read refuses it)
            if leading(out[: start + len(part)], flags[: start + len(part)]) < start + len(part):
                break
        return out

    def leading(self, rkeys: list[bytes], raw: bool = False) -> tuple[int, list[int]]:
        """Leading pages of record keys ``rkeys`` present, and each key's count
        (``raw``: pages keyed by an engine, one page per value)."""
        flags = [True] * len(rkeys) if raw else self._cuts.flags(rkeys)
        counts = self.counts(rkeys, flags)
        return leading(counts, flags), counts


def _is_refusal(reply: Any) -> bool:
    """A script refused (an ACL, NOSCRIPT, a managed service), not a node down."""
    return isinstance(reply, Exception) and not isinstance(reply, PoolUnavailable)


class PoolLookup:
    """The router's view of the pool: leading pages of a request it holds.

    ``keys_of(tokens, block_size, lora_id, lora_name, cache_salt,
    extra_keys)`` returns the engines' page keys for the request's full pages
    under the namespace those fields name (``radixcache.keys.routing_keys``
    builds one for radixcache engines). ``page_bytes``: the engines' page
    size in bytes, which (with the config) says how pages are grouped into
    values. Thread-safe.
    """

    def __init__(
        self,
        config: ValkeyConfig,
        fingerprint: ModelFingerprint,
        keys_of: Callable[..., list[bytes]],
        page_bytes: int,
    ) -> None:
        self._link = PoolLink(config)
        self._probe = PrefixProbe(self._link, Cuts(config.pages_per_value(page_bytes)))
        self._digest = fingerprint.digest()  # record key = digest + page key
        self._keys_of = keys_of
        self._warn = RateLimitedLog(log)

    def __call__(
        self,
        tokens: Sequence[int],
        block_size: int,
        lora_id: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        extra_keys: Sequence[Any] | None = None,
    ) -> int | None:
        """Leading full blocks of ``tokens`` in the pool under the namespace
        the wire fields name; None if the pool cannot answer."""
        try:
            keys = self._keys_of(tokens, block_size, lora_id, lora_name, cache_salt, extra_keys)
            found, _counts = self._probe.leading([self._digest + key for key in keys])
            if self._probe.unavailable and found == 0:
                why = self._link.last_error
                raise PoolUnavailable(f"pool {self._link.config.describe()}: {why}")
            return found
        except (StorageError, ValueError, TypeError) as exc:
            self._warn.warning("pool query failed (%s); routing on the index alone", exc)
            return None

    def close(self) -> None:
        self._link.close()

    def __repr__(self) -> str:
        return f"PoolLookup({self._link.config.describe()})"

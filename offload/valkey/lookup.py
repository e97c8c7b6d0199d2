"""How many leading pages of a prompt the pool holds: for the engine and for routers.

``PrefixProbe`` answers in one round trip where the server runs scripts: a
small read-only Lua script per node walks that node's keys in prompt order
and returns where its first missing key is; the answer is the earliest of
those positions. Keys go in ARGV with the ``allow-cross-slot-keys`` flag, so
on a cluster each node checks all of its keys in one call, and every node is
asked at once. Where scripts are refused (an ACL, a managed service), it
falls back to pipelined ``EXISTS`` in at most two round trips (the first
``lookup_first_round`` keys, then the rest), and says so once in the log.

``PoolLookup`` is the router's side: it turns a request's tokens into the
engines' page keys with a function the caller injects (the engines' chained
storage keys, which live above this layer) and asks the probe. It never
raises: a failed query is ``None``, which the router treats as "no pool".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from radixcache.offload.storage import ModelFingerprint, StorageError
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable

log = logging.getLogger(__name__)

# Index (0-based) of the first key in ARGV that does not exist, or #ARGV.
FIRST_MISSING = """#!lua flags=no-writes,allow-cross-slot-keys
for i = 1, #ARGV do
  if redis.call('EXISTS', ARGV[i]) == 0 then return i - 1 end
end
return #ARGV
"""


class PrefixProbe:
    """Counts the leading keys present in the pool (see the module docstring)."""

    def __init__(self, link: PoolLink) -> None:
        self._link = link
        self._scripts = True  # until the server refuses them
        self.round_trips = 0  # of the last call

    def leading(self, rkeys: list[bytes]) -> int:
        """Leading ``rkeys`` (pool keys) present. Raises ``PoolUnavailable``."""
        self.round_trips = 0
        if not rkeys:
            return 0
        if self._scripts:
            try:
                replies = self._link.scatter(rkeys, lambda keys: ("EVAL", FIRST_MISSING, 0, *keys))
            except PoolUnavailable:
                raise
            except StorageError as exc:
                self._scripts = False
                log.info("pool lookups fall back to pipelined EXISTS: %s", exc)
            else:
                self.round_trips = 1
                first_missing = len(rkeys)
                for positions, reply in replies:
                    if int(reply) < len(positions):
                        first_missing = min(first_missing, positions[int(reply)])
                return first_missing
        return self._pipelined(rkeys)

    def _pipelined(self, rkeys: list[bytes]) -> int:
        cut = self._link.config.lookup_first_round
        found = 0
        for part in (rkeys[:cut], rkeys[cut:]):
            if not part:
                break
            replies = self._link.run(lambda pipe: [pipe.exists(k) for k in part])
            self.round_trips += 1
            for reply in replies:
                if reply != 1:
                    return found
                found += 1
        return found


class PoolLookup:
    """The router's view of the pool: leading pages of a request it holds.

    ``keys_of(tokens, block_size, lora_id, lora_name, cache_salt,
    extra_keys)`` returns the engines' page keys for the request's full pages
    under the namespace those fields name (``radixcache.keys.routing_keys``
    builds one for radixcache engines). Thread-safe.
    """

    def __init__(
        self,
        config: ValkeyConfig,
        fingerprint: ModelFingerprint,
        keys_of: Callable[..., list[bytes]],
    ) -> None:
        self._link = PoolLink(config)
        self._probe = PrefixProbe(self._link)
        self._prefix = config.key_prefix + fingerprint.digest()
        self._keys_of = keys_of

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
            return self._probe.leading([self._prefix + key for key in keys])
        except (StorageError, ValueError, TypeError) as exc:
            log.warning("pool query failed (%s); routing on the index alone", exc)
            return None

    def close(self) -> None:
        self._link.close()

    def __repr__(self) -> str:
        return f"PoolLookup({self._link.config.describe()})"

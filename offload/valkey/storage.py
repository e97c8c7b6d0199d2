"""ValkeyStorage: the storage tier as a pool on a Valkey server or cluster, shared by engines.

Keys and values in the pool::

    <key_prefix><fingerprint digest (8)><page key>  ->  storage record (one page)
    <key_prefix>ns:<namespace tag (16)>             ->  set of the record keys put
                                                        under that namespace

A page key already binds its namespace and its whole prefix; the fingerprint
digest binds the model, KV layout and rank (invariant 8), so engines of one
model share pages and engines of another never see them. Every record
carries its full key, token ids and a checksum, and is verified on every
read: a value that is corrupt, truncated, or was copied under another key is
a miss (deleted and counted as corrupt), never a hit.

Memory: the pool is bounded on the server (``maxmemory``) and evicts least
recently used keys (see the README's "Shared pool" section for the settings
and why ``volatile-lru`` with the records' TTL keeps the namespace index from
being evicted). A record can therefore vanish between ``longest_prefix`` and
``get``: ``get`` then serves the leading pages it found and the rest is a
miss, which the engine recomputes.

Removals (``take_removed``): observed through keyspace notifications where the
server sends them (offload/valkey/removals.py); otherwise only this process's
own deletions are reported and the server's evictions are unknown.

Failures: the pool being down, slow (``socket_timeout_s``) or refusing the
credentials makes every call a miss (``longest_prefix`` 0, ``get`` short,
``put`` short), counted, never raised; after ``retry_after_s`` the next call
reconnects (offload/valkey/link.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from radixcache.events.types import EXTERNAL, Medium
from radixcache.offload.storage import (
    HeldRemovalLog,
    ModelFingerprint,
    RecordMeta,
    StorageBase,
    StorageError,
    StoreSizes,
)
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable
from radixcache.offload.valkey.lookup import PrefixProbe
from radixcache.offload.valkey.reader import DirectPoolReader, PoolReader
from radixcache.offload.valkey.removals import KeyspaceObserver, notifications_cover_removals
from radixcache.offload.valkey.writer import PoolWriter
from radixcache.transfer.layout import KVSpec

log = logging.getLogger(__name__)

_SIZES_EVERY_S = 1.0  # refresh of the pool's record count and memory figures


@dataclass(frozen=True, slots=True)
class PoolStats:
    """The pool's own figures, beside the ``StorageStats`` every backend has."""

    round_trips: int  # pipelines sent (each one round trip)
    lookup_round_trips: int  # round trips of the last longest_prefix call
    unavailable: int  # calls answered as misses because the pool was down or slow
    connects: int  # clients created (1 + reconnects)
    removals_observed: bool  # keyspace notifications feed take_removed()
    maxmemory: int  # the server's memory bound (0: none or unknown)
    policy: str  # the server's maxmemory-policy ("" when unknown)


class ValkeyStorage(StorageBase):
    """The ``Storage`` protocol on a Valkey pool (see the module docstring).

    Its transport: the link (one client, its health), the prefix probe, the
    pool reader and writer, and the keyspace observer; the calls themselves
    are ``StorageBase``'s. Public methods are called by the owner thread;
    ``longest_prefix`` is the only one that waits on the network (at most two
    round trips).
    """

    medium: Medium = EXTERNAL  # the event medium of its pages (SGLang's name for a shared pool)
    pages_name = "pool"
    _writer: PoolWriter

    def __init__(self, config: ValkeyConfig, spec: KVSpec, fingerprint: ModelFingerprint) -> None:
        if not isinstance(config, ValkeyConfig):
            raise TypeError(f"config must be a ValkeyConfig, got {type(config).__name__}")
        super().__init__(spec, fingerprint, config.keys)  # keys first: a bad key opens nothing
        self.config = config
        self._prefix = config.key_prefix + self._digest  # + page key = pool key
        self._link = PoolLink(config)
        self._probe = PrefixProbe(self._link)
        self._held = HeldRemovalLog()
        self._removals = self._held
        self._records = 0  # pool-wide figures, refreshed by the writer thread
        self._used_memory = 0
        self._sizes_at = 0.0
        self._lookup_unavailable = 0
        self._maxmemory, self._policy, flags = self._server_settings()
        self._writer = PoolWriter(
            self.where, self._counters, self._held, self._link, after_job=self._refresh_sizes
        )
        reader = PoolReader if config.cluster else DirectPoolReader  # one server: into the pages
        self._reader = reader(self._link, self._writer)
        self._observer: KeyspaceObserver | None = None
        if config.observe_removals and flags is not None and notifications_cover_removals(flags):
            self._observer = KeyspaceObserver(
                self._link.node_clients(), config.db, self._prefix, self._held
            )
        elif config.observe_removals:
            log.info(
                "pool %s: keyspace notifications %s; evictions by the server are unknown "
                "to this engine until it reads",
                config.describe(),
                "unreadable" if flags is None else f"are {flags!r} (need E with g, x, e)",
            )

    @property
    def where(self) -> str:
        return f"storage {self.config.describe()}"

    def _server_settings(self) -> tuple[int, str, str | None]:
        """(maxmemory, maxmemory-policy, notify-keyspace-events); unknowns: 0, "", None."""
        names = ("maxmemory", "maxmemory-policy", "notify-keyspace-events")
        values: dict[str, str] = {}
        try:
            for name in names:
                reply = self._link.direct(lambda client: client.config_get(name))
                if isinstance(reply, dict):
                    values.update((_text(k), _text(v)) for k, v in reply.items())
        except PoolUnavailable:
            return 0, "", None  # down at start: every call is a miss until it returns
        except StorageError as exc:  # CONFIG refused (e.g. a managed service): unknown
            log.info("pool %s: server settings unreadable (%s)", self.config.describe(), exc)
            return 0, "", None
        maxmemory = int(values.get("maxmemory", "0") or 0)
        policy = values.get("maxmemory-policy", "")
        if maxmemory == 0 or policy in ("", "noeviction"):
            log.warning(
                "pool %s: maxmemory=%d, maxmemory-policy=%r: the pool is not bounded with "
                "LRU eviction; puts fail once it is full",
                self.config.describe(),
                maxmemory,
                policy,
            )
        return maxmemory, policy, values.get("notify-keyspace-events")

    # -- keys ------------------------------------------------------------------
    def pool_keys(self, keys: Sequence[bytes]) -> list[bytes]:
        """The pool keys of page keys (validated: bytes of 1 to 256)."""
        key_prefix = self.config.key_prefix
        return [key_prefix + rkey for rkey in self.record_keys(keys)]

    # -- Storage protocol ----------------------------------------------------------
    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` in the pool, in one round trip (at most two where
        the server refuses scripts; offload/valkey/lookup.py); 0 while the
        pool is down. Mutates nothing (the server's LRU clock aside)."""
        self._check_open()
        rkeys = self.pool_keys(keys)
        try:
            return self._probe.leading(rkeys)
        except PoolUnavailable:
            self._lookup_unavailable += 1
            return 0

    def scan(self) -> Iterator[RecordMeta]:
        """Nothing: the pool's records belong to every engine that uses it, so an
        engine announces only the pages it wrote (as it writes them)."""
        return iter(())

    def _sizes(self) -> StoreSizes:
        return StoreSizes(
            records=self._records, stored_bytes=self._used_memory, capacity_bytes=self._maxmemory
        )

    def pool_stats(self) -> PoolStats:
        """The pool's own figures (see ``PoolStats``)."""
        return PoolStats(
            round_trips=self._link.round_trips,
            lookup_round_trips=self._probe.round_trips,
            unavailable=self._reader.unavailable
            + self._writer.unavailable
            + self._lookup_unavailable,
            connects=self._link.connects,
            removals_observed=self._observer is not None,
            maxmemory=self._maxmemory,
            policy=self._policy,
        )

    def _release(self) -> None:
        if self._observer is not None:
            self._observer.close()
        self._link.close()

    def __repr__(self) -> str:
        return f"ValkeyStorage({self.config.describe()}, {self.fingerprint.describe()!r})"

    # -- helpers --------------------------------------------------------------------
    def _refresh_sizes(self) -> None:
        """Pool-wide record count and memory, at most once a second (writer thread)."""
        now = time.monotonic()
        if now - self._sizes_at < _SIZES_EVERY_S or not self._link.available():
            return
        self._sizes_at = now
        try:
            client = self._link.client()
            self._records = int(client.dbsize())
            info = client.info("memory")
            if isinstance(info, dict) and "used_memory" in info:
                self._used_memory = int(info["used_memory"])
            elif isinstance(info, dict):  # a cluster client answers per node
                self._used_memory = sum(
                    int(v.get("used_memory", 0)) for v in info.values() if isinstance(v, dict)
                )
        except Exception:  # figures only; the next data call notices a dead pool
            pass


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

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
server sends them (offload/valkey_removals.py); otherwise only this process's
own deletions are reported and the server's evictions are unknown.

Failures: the pool being down, slow (``socket_timeout_s``) or refusing the
credentials makes every call a miss (``longest_prefix`` 0, ``get`` short,
``put`` short), counted, never raised; after ``retry_after_s`` the next call
reconnects (offload/valkey_link.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


from radixcache.events.types import EXTERNAL, Medium
from radixcache.offload import record as rec
from radixcache.offload.storage import (
    MAX_KEY_BYTES,
    Counters,
    HostPages,
    ModelFingerprint,
    PageBuffer,
    PutMeta,
    StorageError,
    StorageStats,
    TokenPages,
    check_pages,
)
from radixcache.offload.valkey_config import ValkeyConfig
from radixcache.offload.valkey_reader import PoolReader
from radixcache.offload.valkey_writer import DeleteJob, ForgetJob, PoolWriter, PutJob
from radixcache.offload.valkey_link import PoolLink, PoolUnavailable
from radixcache.offload.valkey_lookup import PrefixProbe
from radixcache.offload.valkey_removals import (
    KeyspaceObserver,
    RemovalLog,
    notifications_cover_removals,
)
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.ticket import FutureTicket, Ticket

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


class ValkeyStorage:
    """The ``Storage`` protocol on a Valkey pool (see the module docstring).

    Public methods are called by the owner thread; ``longest_prefix`` is the
    only one that waits on the network (at most two round trips).
    """

    medium: Medium = EXTERNAL  # the event medium of its pages (SGLang's name for a shared pool)

    def __init__(self, config: ValkeyConfig, spec: KVSpec, fingerprint: ModelFingerprint) -> None:
        if not isinstance(config, ValkeyConfig):
            raise TypeError(f"config must be a ValkeyConfig, got {type(config).__name__}")
        if fingerprint.spec != spec.describe():
            raise ValueError(
                f"fingerprint spec {fingerprint.spec!r} does not describe the KV spec "
                f"{spec.describe()!r}"
            )
        self.config = config
        self.spec = spec
        self.fingerprint = fingerprint
        self._digest = fingerprint.digest()
        self._prefix = config.key_prefix + self._digest  # + page key = pool key
        self._counters = Counters()
        self._link = PoolLink(config)
        self._probe = PrefixProbe(self._link)
        self._removals = RemovalLog()
        self._records = 0  # pool-wide figures, refreshed by the writer thread
        self._used_memory = 0
        self._sizes_at = 0.0
        self._lookup_unavailable = 0
        self._maxmemory, self._policy, flags = self._server_settings()
        self._writer = PoolWriter(
            link=self._link,
            counters=self._counters,
            removals=self._removals,
            ttl_s=config.ttl_s,
            batch_pages=config.batch_pages,
            first_seq=time.time_ns() // 1000,  # roughly ordered across engines
            after_job=self._refresh_sizes,
        )
        self._reader = PoolReader(
            link=self._link,
            counters=self._counters,
            writer=self._writer,
            batch_pages=config.batch_pages,
            num_readers=config.num_readers,
            key_cut=len(config.key_prefix),
            direct=not config.cluster,
        )
        self._observer: KeyspaceObserver | None = None
        if config.observe_removals and flags is not None and notifications_cover_removals(flags):
            self._observer = KeyspaceObserver(
                self._link.node_clients(), config.db, self._prefix, self._removals
            )
        elif config.observe_removals:
            log.info(
                "pool %s: keyspace notifications %s; evictions by the server are unknown "
                "to this engine until it reads",
                config.describe(),
                "unreadable" if flags is None else f"are {flags!r} (need E with g, x, e)",
            )
        self._closed = False
        self._close_lock = threading.Lock()

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
        prefix = self._prefix
        out = []
        for i, key in enumerate(keys):
            if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
                raise ValueError(
                    f"page keys are bytes of 1 to {MAX_KEY_BYTES}; key {i} is "
                    f"{type(key).__name__} of length {len(key) if isinstance(key, bytes) else '-'}"
                )
            out.append(prefix + key)
        return out

    def _ns(self, namespace: bytes) -> tuple[bytes, bytes]:
        """(namespace tag, its index key) for ``namespace``."""
        if not isinstance(namespace, bytes):
            raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
        tag = rec.namespace_tag(self._digest, namespace)
        return tag, self.config.key_prefix + b"ns:" + tag

    # -- Storage protocol ----------------------------------------------------------
    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` in the pool, in one round trip (at most two where
        the server refuses scripts; offload/valkey_lookup.py); 0 while the
        pool is down. Mutates nothing (the server's LRU clock aside)."""
        self._check_open()
        rkeys = self.pool_keys(keys)
        try:
            return self._probe.leading(rkeys)
        except PoolUnavailable:
            self._lookup_unavailable += 1
            return 0

    def get(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes | None = None,
    ) -> Ticket:
        self._check_open()
        rkeys = self.pool_keys(keys)
        toks, pages = self._checked(len(rkeys), tokens, host, host_pages)
        ns_tag = None if namespace is None else self._ns(namespace)[0]
        ticket = FutureTicket()
        if not rkeys:
            ticket.finish(0)
            return ticket
        self._reader.submit(rkeys, list(keys), toks, host, pages, ns_tag, ticket)
        return ticket

    def put(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes,
        meta: PutMeta | None = None,
    ) -> Ticket:
        self._check_open()
        ns_tag, ns_key = self._ns(namespace)
        rkeys = self.pool_keys(keys)
        toks, pages = self._checked(len(rkeys), tokens, host, host_pages)
        ticket = FutureTicket()
        if not rkeys:
            ticket.finish(0)
            return ticket
        if meta is not None and len(meta.block_ids) != len(rkeys):
            raise ValueError(f"meta has {len(meta.block_ids)} block ids for {len(rkeys)} keys")
        cut = len(self.config.key_prefix)
        fkeys = [k[cut:] for k in rkeys]
        self._writer.submit(
            PutJob(rkeys, fkeys, list(keys), toks, host, pages, ns_key, ns_tag, meta, ticket)
        )
        return ticket

    def delete(self, keys: Sequence[bytes]) -> Ticket:
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(DeleteJob(self.pool_keys(keys), list(keys), ticket))
        return ticket

    def forget_namespace(self, namespace: bytes) -> Ticket:
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(ForgetJob(self._ns(namespace)[1], len(self._prefix), ticket))
        return ticket

    def take_removed(self) -> list[bytes]:
        return self._removals.take()

    def take_written(self) -> list[bytes]:
        """Page keys this process wrote into the pool since the last call (not
        those a put found there), in order; a page is listed by the time its
        put ticket finishes:
        the pages whose ``BlockStored(medium=EXTERNAL)`` this engine publishes
        (each page once, by the engine that wrote it)."""
        return self._removals.take_written()

    def scan(self) -> Iterator[rec.RecordMeta]:
        """Nothing: the pool's records belong to every engine that uses it, so an
        engine announces only the pages it wrote (as it writes them)."""
        return iter(())

    def stats(self) -> StorageStats:
        return self._counters.snapshot(
            records=self._records,
            stored_bytes=self._used_memory,
            capacity_bytes=self._maxmemory,
            queued_writes=self._writer.queued,
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

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._reader.close()  # first: a read may still queue a corrupt record's deletion
        self._writer.close()  # runs everything queued, then stops
        if self._observer is not None:
            self._observer.close()
        self._link.close()

    def __enter__(self) -> ValkeyStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"storage {self.config.describe()} is closed")

    def _checked(
        self, n: int, tokens: TokenPages | None, host: PageBuffer, host_pages: HostPages
    ) -> tuple[TokenPages | None, HostPages]:
        """Validate a get/put call; returns private copies of tokens and page ids."""
        return check_pages(n, tokens, host, host_pages, self.spec, "pool")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

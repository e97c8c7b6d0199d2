"""ValkeyStorage: the storage tier as a pool on a Valkey server or cluster, shared by engines.

Keys and values in the pool (offload/valkey/layout.py)::

    <key_prefix><fingerprint digest (8)><page key>  ->  a value: the records of the
                                                        consecutive pages ending
                                                        at this page (1 to 4N)
    <key_prefix>ns:<namespace tag (16)>:<shard>     ->  set of the value keys put
                                                        under that namespace
    <key_prefix>tag:<tag id (16)>                   ->  set of the namespace tags
                                                        a tag names (lifetime/tags.py)
    <key_prefix>tq:{<node tag>}:<tenant id>:s / :o  ->  a tenant's value sizes and
                                                        write order, where it has a
                                                        byte limit (lifetime/quotas.py)

A page key already binds its namespace and its whole prefix; the fingerprint
digest binds the model, KV layout and rank (invariant 8), so engines of one
model share pages and engines of another never see them. Every record
carries its full key, token ids and a checksum, and is verified on its own
on every read: a value that is corrupt, truncated, or was copied under
another key is a miss (deleted and counted as corrupt), never a hit; the
next put of its pages rewrites it.

Memory: the pool is bounded on the server (``maxmemory``) and evicts least
recently used keys (see the README's "Shared pool" section for the settings
and why ``volatile-lru`` with the records' TTL keeps the namespace index from
being evicted). A value can therefore vanish between ``longest_prefix`` and
``get``: ``get`` then serves the leading pages it found and the rest is a
miss, which the engine recomputes.

Retention: values expire by the put's deadline (``PutMeta.expires_at``) at
the latest; a put past it writes nothing (lifetime/retention.py). Tags:
``invalidate_tag`` forgets every namespace a put tagged (lifetime/tags.py),
whichever engine wrote it. Quotas: a tenant with a byte limit
(``ValkeyConfig.tenant_quotas``, ``set_tenant_quotas``) has its own oldest
values evicted by a server-side script to fit; what cannot fit is dropped
and counted (``tenant_stats``; lifetime/quotas.py). No floors.

Removals (``take_removed``): observed through keyspace notifications where the
server sends them (offload/valkey/lifetime/removals.py); otherwise only this process's
own deletions are reported and the server's evictions are unknown.

Failures: a node that is down, slow (``socket_timeout_s``), loading, or
refusing the credentials makes the calls on its keys misses (``longest_prefix``
stops before its first page, ``get`` and ``put`` are short), counted, never
raised; the other nodes of a cluster go on serving theirs. After
``retry_after_s`` the next call tries the node again (offload/valkey/link.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixcache.events.types import EXTERNAL, Medium
from radixcache.offload.storage import (
    HeldRemovalLog,
    HostPages,
    ModelFingerprint,
    PageBuffer,
    PutMeta,
    RecordMeta,
    StorageBase,
    StoreSizes,
    TagJob,
    TokenPages,
)
from radixcache.offload.storage.checks import check_tag
from radixcache.transfer.ticket import FutureTicket, Ticket
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.offload.valkey.layout import Cuts
from radixcache.offload.valkey.lifetime.quotas import QuotaBook, TenantLimits, TenantPoolStats
from radixcache.offload.valkey.lifetime.tags import TagSets
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable
from radixcache.offload.valkey.lookup import PrefixProbe
from radixcache.offload.valkey.reader import PoolReader, ReadHints
from radixcache.offload.valkey.lifetime.removals import (
    KeyspaceObserver,
    Suspects,
    ValueIndex,
    notifications_cover_removals,
)
from radixcache.offload.valkey.writer import PoolWriter
from radixcache.transfer.layout import KVSpec

log = logging.getLogger(__name__)

_SIZES_EVERY_S = 1.0  # refresh of the pool's record count and memory figures
_SETTINGS_EVERY_S = 60.0  # the server's settings are read again at least this often


@dataclass(frozen=True, slots=True)
class PoolStats:
    """The pool's own figures, beside the ``StorageStats`` every backend has."""

    round_trips: int  # calls that reached the pool (each one round trip)
    lookup_round_trips: int  # round trips of the last longest_prefix call
    unavailable: int  # calls answered (partly) as misses because a node was down or slow
    connects: int  # connections opened to the nodes (the first ones, then reconnects)
    removals_observed: bool  # keyspace notifications feed take_removed()
    maxmemory: int  # the servers' memory bound, summed over the primaries (0: none or unknown)
    policy: str  # the servers' maxmemory-policy ("" when unknown)
    nodes: int  # primaries known (1 for a single server)
    nodes_up: int  # of those, not marked down now
    pages_per_value: int  # pages a stored value holds on average (N)
    past_deadline: int  # pages puts did not write: their retention deadline had passed


class ValkeyStorage(StorageBase):
    """The ``Storage`` protocol on a Valkey pool (see the module docstring).

    Its transport: the link (nodes, their health), the prefix probe, the pool
    reader and writer, the keyspace observer, and a watcher thread that
    reads the servers' settings and (re)subscribes to removals whenever a
    node answers after it was down or never reached (a pool that was down
    when the engine started included). Public methods are called by the
    owner thread; ``longest_prefix`` is the only one that waits on the
    network (one round trip, two where scripts are refused).
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
        self._cuts = Cuts(config.pages_per_value(spec.page_bytes))
        self._probe = PrefixProbe(self._link, self._cuts)
        self._hints = ReadHints()
        self._values = ValueIndex()
        suspects = Suspects()
        self._held = HeldRemovalLog()
        self._removals = self._held
        self._records = 0  # pool-wide figures, refreshed by the writer thread
        self._used_memory = 0
        self._sizes_at = 0.0
        self._lookup_unavailable = 0
        self._maxmemory, self._policy = 0, ""
        self._flags: str | None = None  # notify-keyspace-events of the primaries (None: unread)
        self._observer = (
            KeyspaceObserver(config.db, self._prefix, self._removed)
            if config.observe_removals
            else None
        )
        self._limits = TenantLimits(config.tenant_quotas, config.tenant_quota_default)
        self._quotas = QuotaBook(self._link)
        self._writer = PoolWriter(
            self.where, self._counters, self._held, self._link, cuts=self._cuts,
            values=self._values, suspects=suspects, tags=TagSets(config.key_prefix, self._digest),
            limits=self._limits, quotas=self._quotas, check_first=fingerprint.rank_shared,
            after_job=self._refresh_sizes,
        )  # fmt: skip
        self._reader = PoolReader(self._link, self._writer, self._cuts, self._hints, suspects)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._settings_lock = threading.Lock()
        self._link.on_reconnect(self._wake.set)
        self._refresh_settings()  # subscribed before the first put, where the pool is up
        self._watcher = threading.Thread(
            target=self._watch, name="radixcache-pool-watch", daemon=True
        )
        self._watcher.start()

    @property
    def where(self) -> str:
        return f"storage {self.config.describe()}"

    # -- the servers' settings and the removal subscription ---------------------------
    def _watch(self) -> None:
        """Re-read settings and re-subscribe when a node (re)appears; until the
        pool was reached once, try every ``retry_after_s`` without traffic."""
        while not self._stop.is_set():
            known = self._flags is not None
            self._wake.wait(_SETTINGS_EVERY_S if known else self.config.retry_after_s)
            if self._stop.is_set():
                return
            self._wake.clear()
            self._refresh_settings()  # woken by a node that answered again, or periodic

    def _refresh_settings(self) -> None:
        """Read maxmemory, the policy and the notification flags of every
        primary; subscribe to removals on each where they are sent."""
        with self._settings_lock:
            nodes = self._link.primaries()
            if not nodes:
                return
            values = self._config_get(("maxmemory", "maxmemory-policy", "notify-keyspace-events"))
            if values is None:
                return
            maxmemory = sum(int(v.get("maxmemory", "0") or 0) for v in values)
            policies = sorted({v.get("maxmemory-policy", "") for v in values})
            flags = [v.get("notify-keyspace-events") for v in values]
            covered = all(f is not None and notifications_cover_removals(f) for f in flags)
            first = self._flags is None
            self._maxmemory, self._policy = maxmemory, ",".join(policies)
            self._flags = ",".join(f or "" for f in flags)
            if first and (maxmemory == 0 or self._policy in ("", "noeviction")):
                log.warning(
                    "pool %s: maxmemory=%d, maxmemory-policy=%r: the pool is not bounded with "
                    "LRU eviction; puts fail once it is full",
                    self.config.describe(), maxmemory, self._policy,
                )  # fmt: skip
            if self._observer is not None:
                if covered:
                    self._observer.sync(self._link.node_clients())
                else:
                    self._observer.sync({})
                    if first:
                        log.info(
                            "pool %s: keyspace notifications are %r (need E with g, x, e); "
                            "evictions by the server are unknown to this engine until it reads",
                            self.config.describe(), self._flags,
                        )  # fmt: skip

    def _config_get(self, names: tuple[str, ...]) -> list[dict[str, str]] | None:
        """``CONFIG GET`` of ``names`` on every primary; None if any failed."""
        out: dict[str, dict[str, str]] = {}
        for name in names:
            for node, reply in self._link.each_node("CONFIG", "GET", name):
                if isinstance(reply, PoolUnavailable):
                    return None
                if isinstance(reply, Exception):  # CONFIG refused (a managed service): unknown
                    where = self.config.describe()
                    log.info("pool %s: server settings unreadable (%s)", where, reply)
                    out.setdefault(node.name, {})
                    continue
                pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
                out.setdefault(node.name, {}).update((_text(k), _text(v)) for k, v in pairs)
        return list(out.values()) or None

    def _removed(self, vkeys: list[bytes]) -> None:
        """The observer saw values go (an observer thread)."""
        self._held.removed(self._values.removed(vkeys))

    # -- keys ------------------------------------------------------------------------
    def pool_keys(self, keys: Sequence[bytes]) -> list[bytes]:
        """The pool keys of page keys (validated: bytes of 1 to 256): where a
        value ending at that page is stored."""
        key_prefix = self.config.key_prefix
        return [key_prefix + rkey for rkey in self.record_keys(keys)]

    def deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        """When the value ending at each page key expires (``PTTL``, one round
        trip), as a deadline by this engine's clock; None: no value ends there,
        it has no expiry, or its node is down. The cache dates pages it reads
        back by them (a page's life is never extended by a read)."""
        self._check_open()
        replies = self._link.run([("PTTL", key) for key in self.pool_keys(keys)])
        now = self.config.clock()
        return [now + r / 1000 if type(r) is int and r >= 0 else None for r in replies]

    # -- Storage protocol ----------------------------------------------------------
    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` in the pool, in one round trip (two where the server
        refuses scripts; offload/valkey/lookup.py); pages on a node that is
        down count as missing. Mutates nothing (the server's LRU clock aside)."""
        self._check_open()
        rkeys = self.record_keys(keys)
        found, counts = self._probe.leading(rkeys)
        if self._probe.unavailable:
            self._lookup_unavailable += 1
        self._hints.note(rkeys, counts)
        return found

    def put(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes,
        meta: PutMeta | None = None,
        tenant: bytes | None = None,
    ) -> Ticket:
        """As the base's; the reads that follow no longer trust earlier lookups
        of where values end (this put may rewrite or replace some)."""
        self._hints.clear()
        return super().put(keys, tokens, host, host_pages, namespace, meta, tenant=tenant)

    def invalidate_tag(self, tag: str) -> Ticket:
        """Forget every namespace of this model that a put (of any engine)
        tagged with ``tag``; result: the pages removed, reported as a
        forget's removals. The ticket fails (``PoolUnavailable``) when a node
        holding the tag's set or a namespace index is down; the tag's set
        then still lists what was not forgotten. ValueError / TypeError for
        a tag that is not 1-128 printable ASCII characters without spaces."""
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(TagJob(b"", ticket, tag=check_tag(tag)))
        return ticket

    def set_tenant_quotas(
        self, quotas: Mapping[bytes | None, int | None], default: int | None = None
    ) -> None:
        """Replace the per-tenant byte limits (as ``ValkeyConfig.tenant_quotas``
        and ``tenant_quota_default``) for the puts that follow; a tenant over
        a lowered limit evicts its own oldest values at its next put on each
        node. ValueError / TypeError name a bad entry (nothing changes)."""
        self._check_open()
        self._limits.replace(quotas, default)

    def tenant_stats(self) -> dict[bytes | None, TenantPoolStats]:
        """Per tenant (every tenant with a limit of its own, or that this
        engine counted something for): the bytes and values the pool counts
        for it now, over every engine (one round trip; a node that is down
        counts nothing), its limit, and this engine's counts (see
        ``TenantPoolStats``)."""
        self._check_open()
        tenants = self._limits.tenants()
        figures = self._quotas.figures(tenants)
        out: dict[bytes | None, TenantPoolStats] = {}
        for tenant in tenants:
            nbytes, values = figures[tenant]
            evicted, dropped, past = self._limits.counts(tenant)
            limit = self._limits.limit(tenant)
            out[tenant] = TenantPoolStats(nbytes, values, limit, evicted, dropped, past)
        return out

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
        layout = self._link.layout()
        nodes = layout.nodes if layout is not None else ()
        observed = self._observer is not None and len(self._observer.nodes()) == len(nodes) > 0
        return PoolStats(
            round_trips=self._link.round_trips,
            lookup_round_trips=self._probe.round_trips,
            unavailable=self._reader.unavailable
            + self._writer.unavailable
            + self._lookup_unavailable,
            connects=self._link.connects,
            removals_observed=observed,
            maxmemory=self._maxmemory,
            policy=self._policy,
            nodes=len(nodes),
            nodes_up=sum(node.available() for node in nodes),
            pages_per_value=self._cuts.n,
            past_deadline=self._writer.past_deadline,
        )

    def _release(self) -> None:
        self._stop.set()
        self._wake.set()
        self._watcher.join(timeout=10.0)
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
        records = memory = 0
        for _node, reply in self._link.each_node("DBSIZE"):
            records += reply if isinstance(reply, int) else 0
        for _node, reply in self._link.each_node("INFO", "memory"):
            memory += _used_memory(reply)
        self._records, self._used_memory = records, memory


def _used_memory(reply: Any) -> int:
    if isinstance(reply, dict):
        return int(reply.get("used_memory", 0))
    if isinstance(reply, bytes):
        for line in reply.split(b"\r\n"):
            if line.startswith(b"used_memory:"):
                return int(line.split(b":", 1)[1])
    return 0


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

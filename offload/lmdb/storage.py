"""LmdbStorage: the storage tier as one LMDB environment on local disk.

Layout of the environment (one directory, six named databases)::

    pages : record key (8 B fingerprint + page key) -> record value   (format: offload/storage/record.py),
            or an envelope naming the slot of kv.slots that holds its KV bytes (offload/lmdb/slots.py)
    ns    : namespace tag (16 B) -> record keys  (dupsort: the namespace index)
    meta  : b"fingerprint" -> fingerprint text   (of the last process to open it)
            b"tick" -> counter                   (commits that only advance the txn id)
            b"tenant-secret" -> 32 B              (the key of tenant ids: offload/lmdb/quotas.py)
            b"slot-bytes" -> 8 B                  (the slot size of kv.slots, once it exists)
    tenants : namespace tag (16 B) -> tenant id  (per-tenant quotas: offload/lmdb/txn.py)
    expiry  : record key -> retention deadline   (offload/lmdb/retention.py)
    tags    : tag -> namespace tags (dupsort)    (invalidate_tag: the same)

plus ``radixcache.lock``, an advisory lock held by the one process that has
the store open: the index and the capacity accounting live in that process;
and, where pages are at least ``StorageConfig.slot_min_page_bytes``,
``kv.slots``: the records' KV bytes in fixed-size slots (offload/lmdb/slots.py).

Threads::

    owner thread  --get-->  reader pool (num_readers)  read txn, verify, copy
                  --put/delete/forget-->  queue  -->  writer thread
                                                       batches jobs into one
                                                       write txn per batch

LMDB allows one writer at a time, so a single writer thread drains the queue
and merges whatever is waiting (up to the batch limits) into one transaction:
one commit, one sync, for many pages. Readers never wait for it (MVCC).

Capacity: the values' bytes are kept at or below ``capacity_bytes`` by evicting
least recently used records in the same transaction that adds new ones (see
offload/lmdb/index.py for how recency is tracked). The LMDB map is larger than
that (B-tree pages, copy-on-write and free-list headroom); if it still fills
up (``MapFullError``), the writer evicts more and retries, and grows the map
(50%) when the map is too full even to delete.

Write path, slot file: a record of a large page is written as one ``pwrite``
of its KV bytes straight from the host page into a slot, synced before the
commit that puts the rest of the record (its lead) into LMDB, which never
copies the KV bytes through its map (offload/lmdb/slots.py).

Write path, inline: the environment is opened with ``writemap=True``, so a put copies
the record once, straight into the memory map, and a commit flushes the map
(msync) rather than writing malloc'd copies of every page (measured here at
2 MiB pages: 0.21 s instead of 0.31 s for 256 MiB, against 0.135 s for an
fsync'd sequential file). The data file then has the map's size as its
apparent size (a sparse file; ``du`` shows the real use), and the writer gives
the pages it is about to fill their disk blocks first, so that a full disk is
an error on the ticket rather than a SIGBUS (offload/lmdb/space.py). Every
process that opens the store must use the same setting (LMDB's rule), which
this class does.

Retention, tags, run-time quotas: a put's ``PutMeta.expires_at`` is kept with
its records, which are never served past it and are swept in deadline order
by the writer; ``invalidate_tag`` forgets every namespace a put tagged;
``set_tenant_quotas`` replaces the byte quotas (offload/lmdb/retention.py).

Durability and the other settings: offload/lmdb/config.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from radixcache.events.types import DISK, Medium
from radixcache.offload.lmdb.config import StorageConfig
from radixcache.offload.lmdb.env import LmdbEnv
from radixcache.offload.lmdb.slots import record_parts, stored_size, unwrap
from radixcache.offload.lmdb.quotas import (
    UNLIMITED,
    ByteQuota,
    TenantKey,
    TenantStorageStats,
    check_quotas,
    tenant_id,
)
from radixcache.offload.lmdb.reader import LmdbReader
from radixcache.offload.lmdb.retention import (
    QuotaJob,
    SweepJob,
    SweepTimer,
    TagJob,
    decode_deadline,
    tag_key,
)
from radixcache.offload.lmdb.writer import LmdbWriter
from radixcache.offload.storage import (
    ModelFingerprint,
    RecordMeta,
    RemovalLog,
    StorageBase,
    StoreSizes,
)
from radixcache.offload.storage import record as rec
from radixcache.offload.storage.checks import check_key, check_tag
from radixcache.offload.storage.contract import HostPages, PageBuffer, PutMeta, TokenPages
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.ticket import FutureTicket, Ticket


class LmdbStorage(StorageBase):
    """The ``Storage`` protocol on one LMDB environment (see the module docstring).

    Its transport: the open directory (``LmdbEnv``: environment, owner lock,
    recency index), the reader pool (``LmdbReader``) and the writer thread
    (``LmdbWriter``); the calls themselves are ``StorageBase``'s. Public
    methods are called by the owner thread. One process owns a store
    directory at a time (a second one gets ``StorageOpenError``): the index
    and the capacity accounting live in this object. Another process may open
    the store once this one closed it, or died. Tensor-parallel ranks use one
    directory each.
    """

    medium: Medium = DISK  # this engine's own store: it announces what it stores and reads

    def __init__(self, config: StorageConfig, spec: KVSpec, fingerprint: ModelFingerprint) -> None:
        super().__init__(spec, fingerprint, config.keys)  # keys first: a bad key opens nothing
        self.config = config
        # the directory, locked; raises StorageOpenError
        store = LmdbEnv(config, fingerprint, config.slot_bytes(spec.page_bytes))
        self._store = store
        self.path = store.path
        self._prefix = self._digest  # record-key prefix (invariant 8)
        self._env, self._gate, self._index = store.env, store.gate, store.index
        self._pages, self._ns, self._meta = store.pages, store.ns, store.meta
        self._tenants = store.tenants
        self._deadlines, self._clock = store.deadlines, config.clock
        self._removals = RemovalLog()
        record_bytes = rec.page_record_size(spec.page_size, spec.page_bytes)
        writer = LmdbWriter(
            self.where, self._counters, self._removals, store, config, self._prefix, record_bytes
        )
        self._writer = writer
        self._lmdb_writer = writer  # the same, as its own class (tenant counters)
        self._reader = LmdbReader(store, writer, config.clock, num_readers=config.num_readers)
        interval = config.sweep_interval_s
        self._sweeper = None if interval is None else SweepTimer(
            store.deadlines, config.clock, writer.ask_sweep, interval
        )  # fmt: skip

    @property
    def where(self) -> str:
        return f"storage {self.path!r}"

    # -- Storage protocol ---------------------------------------------------
    def stored_keys(self) -> list[bytes]:
        """Page keys of every committed record of this fingerprint (a snapshot;
        O(records), for checks and tools)."""
        n = len(self._prefix)
        return [k[n:] for k in self._index.keys() if k[:n] == self._prefix]

    def deadlines(self, keys: Sequence[bytes]) -> list[float | None]:
        """The retention deadline each page key's record was written with
        (None: none, or not stored); the cache dates pages it reads back by them."""
        self._check_open()
        return [self._deadlines.at(rkey) for rkey in self.record_keys(keys)]

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        prefix, index, deadlines = self._prefix, self._index, self._deadlines
        now: float | None = None  # read once, for the first key with a deadline
        for i, key in enumerate(keys):  # checked as far as it looks (up to the first miss)
            rkey = prefix + check_key(i, key)
            if rkey not in index:
                return i
            deadline = deadlines.at(rkey)
            if deadline is not None:
                now = self._clock() if now is None else now
                if deadline <= now:  # expired: not served
                    return i
        return len(keys)

    def invalidate_tag(self, tag: str) -> Ticket:
        """Remove every record of every namespace a put tagged ``tag``
        (``PutMeta.tags``; this run's puts and earlier ones), with the tag's
        entries, in one transaction on the writer thread after the jobs
        queued before; result: how many records. Durable once the ticket is
        done. The removals are announced through ``take_removed``."""
        self._check_open()
        ticket = FutureTicket()
        tid = tag_key(self._store.tenant_secret, check_tag(tag))
        self._writer.submit(TagJob(b"", ticket, tag=tid))
        return ticket

    def set_tenant_quotas(
        self,
        quotas: Mapping[TenantKey, ByteQuota],
        default: ByteQuota | None = None,
    ) -> Ticket:
        """Replace the per-tenant byte quotas (``StorageConfig.tenant_quotas``:
        tenant -> (limit bytes or None, floor bytes)) and, unless ``default``
        is None, the quota of tenants not listed. Checked here (ValueError /
        TypeError); applied on the writer thread, after the jobs queued
        before: a tenant over its new limit has its own least recently used
        records evicted down to it at once (announced through
        ``take_removed``, counted as quota evictions). Result: the records
        evicted."""
        self._check_open()
        checked, fallback = check_quotas(quotas, UNLIMITED if default is None else default)
        ticket = FutureTicket()
        kept = None if default is None else fallback  # None: the default in force then
        self._writer.submit(QuotaJob([], ticket, quotas=checked, default=kept))
        return ticket

    def sweep_expired(self) -> Ticket:
        """Remove the records past their retention deadline now (every write
        already does so first; this makes one happen when nothing is
        written). Result: how many records expired."""
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(SweepJob([], ticket))
        return ticket

    def scan(self) -> Iterator[RecordMeta]:
        self._check_open()
        cut = len(self._prefix)
        now, dated = self._clock(), self._deadlines.snapshot()  # before the txn (see reader.py)
        with self._gate.reading(), self._env.begin(db=self._pages, buffers=True) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(self._prefix):
                return
            for key, value in cursor:
                if bytes(key[:cut]) != self._prefix:
                    return
                deadline = dated.get(bytes(key))
                if deadline is not None and deadline <= now:
                    continue  # never served: not announced either
                head, tail = record_parts(value)
                meta = self.codec.read_meta(head, tail)
                if meta is not None and meta.key == bytes(key):
                    yield dataclasses.replace(meta, key=meta.key[cut:])

    def read_tokens(self, keys: Sequence[bytes]) -> list[np.ndarray | None]:
        """The token ids stored with each page key (None: not stored, raw, not
        a record, or one this store cannot read); for events about survivors.
        Owner thread."""
        self._check_open()
        out: list[np.ndarray | None] = []
        now, rkeys = self._clock(), self.record_keys(keys)
        live = [not self._deadlines.expired(full, now) for full in rkeys]  # before the snapshot
        with self._gate.reading(), self._env.begin(db=self._pages, buffers=True) as txn:
            for full, alive in zip(rkeys, live):
                value = txn.get(full) if alive else None
                if value is None:
                    out.append(None)
                    continue
                head, tail = record_parts(value)
                meta = self.codec.read_meta(head, tail)
                ok = meta is not None and meta.key == full and not meta.raw
                out.append(self.codec.read_tokens(head, tail) if ok else None)
        return out

    def _sizes(self) -> StoreSizes:
        slots = self._store.slots
        return StoreSizes(
            records=len(self._index),
            stored_bytes=self._index.nbytes,
            capacity_bytes=self.config.capacity_bytes,
            disk_bytes=self._store.disk_bytes(),
            free_disk_bytes=0 if slots is None else slots.idle_bytes(),
        )

    def tenant_stats(self) -> dict[TenantKey, TenantStorageStats]:
        """Each tenant's records, bytes, quota and counters (offload/lmdb/quotas.py),
        keyed by tenant: every tenant with a quota set (the quotas in force:
        ``set_tenant_quotas`` changes them) and every tenant a put
        named since the store opened. (The store knows the others, records
        of earlier runs not yet put again, only by id.) Any thread."""
        totals = self._index.tenant_totals()
        counters = self._lmdb_writer.tenant_counters
        counts = counters.snapshot()
        named = counters.seen()
        secret = self._store.tenant_secret
        quotas, default = self._lmdb_writer.quota_table  # as set last (set_tenant_quotas)
        for tenant in quotas:
            named.setdefault(tenant_id(secret, tenant), tenant)
        out: dict[TenantKey, TenantStorageStats] = {}
        for tid, tenant in named.items():
            records, nbytes = totals.get(tid, (0, 0))
            quota_evicted, dropped = counts.get(tid, (0, 0))
            limit, floor = quotas.get(tenant, default)
            out[tenant] = TenantStorageStats(records, nbytes, limit, floor, quota_evicted, dropped)
        return out

    def close(self) -> None:
        """Stop the sweep timer, then close as every backend does (readers,
        writer, the environment and the lock)."""
        if self._sweeper is not None:
            self._sweeper.close()
        super().close()

    def _release(self) -> None:
        self._store.close()  # the environment, then the owner lock

    def check_integrity(self) -> None:
        """Verify the index against the store (O(records); for tests), with
        no write step between a commit and its publishing (the writer's
        ``at_rest`` lock): a sweep a lookup asked for may run meanwhile."""
        with self._lmdb_writer.at_rest:
            self._check_integrity()

    def _check_integrity(self) -> None:
        self._index.check_integrity()
        named: list[int] = []  # the slots the records name
        stored: dict[bytes, int] = {}
        with self._env.begin(buffers=True) as txn:
            for k, v in txn.cursor(db=self._pages):
                stored[bytes(k)] = stored_size(v)
                parts = unwrap(v)
                if parts is not None:
                    named.append(parts[1])
        assert len(named) == len(set(named)), "two records name one slot"
        slots = self._store.slots
        assert slots is not None or not named, "records name slots, and no slot file is open"
        assert slots is None or not set(named) & slots.idle(), "a slot a record names is free"
        assert len(stored) == len(self._index), (
            f"{len(stored)} records, index has {len(self._index)}"
        )
        total = sum(stored.values())
        assert total == self._index.nbytes, (
            f"records hold {total} B, index says {self._index.nbytes}"
        )
        assert all(k in self._index for k in stored), "a stored record is missing from the index"
        totals: dict[TenantKey, tuple[int, int]] = {}  # recounted from the records' tags
        for key, size in stored.items():
            tenant = self._index.tenant_of(key)
            records, nbytes = totals.get(tenant, (0, 0))
            totals[tenant] = (records + 1, nbytes + size)
        assert totals == self._index.tenant_totals(), "per-tenant totals differ from a recount"
        with self._env.begin(buffers=True) as txn:
            expiry = {bytes(k): decode_deadline(v) for k, v in txn.cursor(db=self._store.expiry)}
            pairs = {(bytes(t), bytes(ns)) for t, ns in txn.cursor(db=self._store.tags)}
        assert expiry == self._deadlines.snapshot(), "deadlines in memory differ from the store's"
        assert all(k in stored for k in expiry), "a deadline of a record not stored"
        assert pairs == set(self._store.tag_book.pairs()), "tags in memory differ from the store's"

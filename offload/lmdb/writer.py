"""The LMDB write transport: each step of the writer thread is one transaction.

LMDB admits one write transaction at a time, so every mutation of the store
(puts, deletes, namespace forgets, evictions, removal of corrupt records) is
a job on the one queue of the shared writer thread (offload/storage/writer.py),
which merges whatever waits, up to a page budget, into one step. Here a step
runs as ONE write transaction (offload/lmdb/txn.py): one commit and one sync
for all of it.

Order of effects after a commit (the owner relies on it, see
offload/storage/contract.py)::

    commit -> index updated -> tickets finished -> removed keys published

so a key's removal is published only after the ticket that stored it finished.
A step that writes slots syncs them before its commit (offload/lmdb/slots.py).

Room: records beyond ``capacity_bytes`` are evicted, least recently used
first, in the same transaction that adds new ones. A full LMDB map or a nearly
full disk (offload/lmdb/space.py) is met by evicting more (and growing the map);
if that cannot help, the step fails. A failing transaction is aborted and
fails every ticket of its step (the shared writer's contract).

Tenant quotas (offload/lmdb/quotas.py), in the same transaction: first each
tenant with a limit that the step's puts would take over it evicts its own
least recently used records; then capacity eviction (least recently used
over every tenant) skips what would take a tenant below its floor; pages
that still do not fit are not written (dropped, counted per tenant). Every
eviction is a removal like any other: published after the commit.

Retention (offload/lmdb/retention.py): every step first removes the records
whose deadline is at or before the store's clock (the sweep, earliest first,
at most ``SWEEP_MAX`` a step: the rest in the steps after), in the same
transaction; a put whose own deadline has passed writes nothing. Quota
changes (``QuotaJob``) run between steps, in queue order: a step ends before
one, and a lowered limit evicts the tenant's own oldest records at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Mapping

import lmdb

from radixcache.offload.lmdb.config import StorageConfig
from radixcache.offload.lmdb.env import LmdbEnv
from radixcache.offload.lmdb.quotas import UNLIMITED, ByteQuota, TenantCounters, TenantKey
from radixcache.offload.lmdb.retention import QuotaJob, SweepJob
from radixcache.offload.lmdb.space import DiskReserve, disk_room, grow_map, lapsed, preallocate
from radixcache.offload.lmdb.space import incoming_by_tenant, put_bytes, put_keys, slot_demand
from radixcache.offload.lmdb.txn import Txn, TxnBody, TxnEffects
from radixcache.offload.storage import (
    Counters,
    DeleteJob,
    JobWriter,
    PutJob,
    RemovalLog,
    StorageError,
    WriteJob,
)

_MAP_FULL_RETRIES = 4  # evict-and-retry rounds when the LMDB map is full
SWEEP_MAX = 4096  # expired records one step removes at most


class LmdbWriter(JobWriter):
    """Owns the write side of one LMDB environment, on the shared writer thread."""

    def __init__(
        self,
        where: str,
        counters: Counters,
        removals: RemovalLog,
        store: LmdbEnv,
        config: StorageConfig,
        prefix: bytes,
        record_bytes: int,
    ) -> None:
        """``prefix``: this fingerprint's record-key prefix; ``record_bytes``:
        the size of one tree page's record (for the batch's page budget)."""
        self._env = store.env
        self._path = store.path  # the environment's directory (for disk-space checks)
        self._dbs = store.dbs  # every named database (for page accounting)
        self._gate = store.gate  # readers hold it shared; a map resize takes it alone
        self._index = store.index
        self._slots = store.slots  # the records' KV bytes outside the map (may be None)
        self._slot_writes = store.writes_slots  # new records go there (when they fit)
        self.tenant_counters = TenantCounters()  # quota evictions, dropped pages, per tenant id
        self._body = TxnBody(store, next_seq=store.next_seq, counters=self.tenant_counters)
        self._reserve = DiskReserve(config.disk_reserve_bytes, config.disk_reserve_ratio)
        self._prefix = prefix
        self._capacity = config.capacity_bytes
        self._deadlines = store.deadlines  # record key -> retention deadline, as committed
        self._tag_book = store.tag_book  # namespace tag -> tags, as committed
        self._clock = config.clock  # what deadlines are compared with
        self.sweep_asked = False  # a SweepJob is queued (readers ask for one at most once)
        self._quotas: dict[TenantKey, ByteQuota] = {}  # tenant id -> (limit or None, floor)
        self._default_quota: ByteQuota = config.tenant_quota_default
        self._floor: Callable[[TenantKey], int] | None = None  # None: no floors
        self.quota_table: tuple[Mapping[TenantKey, ByteQuota], ByteQuota] = ({}, UNLIMITED)
        self._use_quotas(config.tenant_quotas, config.tenant_quota_default)
        self._tag_tenant = store.tag_tenant  # namespace tag -> tenant id, as committed
        self.at_rest = threading.Lock()  # held while a batch commits and is published
        self._last_freed = 0  # bytes the last commit freed: not reusable by the next one
        self._data_fd = os.open(os.path.join(self._path, "data.mdb"), os.O_RDWR)  # preallocate()
        batch_pages = max(1, min(config.max_batch_pages, config.max_batch_bytes // record_bytes))
        super().__init__(
            where, counters, removals, merge_pages=batch_pages, thread_name="radixcache-lmdb-write"
        )

    def close(self) -> None:
        """Run every job queued so far, then stop the thread."""
        super().close()
        os.close(self._data_fd)

    def _quota(self, tid: TenantKey) -> ByteQuota:
        """(limit bytes or None, floor bytes) of the tenant of id ``tid``."""
        return self._quotas.get(tid, self._default_quota)

    def _use_quotas(self, quotas: Mapping[TenantKey, ByteQuota], default: ByteQuota) -> None:
        """Enforce ``quotas`` (tenant -> quota, checked) and ``default`` from now on."""
        self._quotas = {self._body.tenant_id(t): q for t, q in quotas.items()}
        self._default_quota = default
        floors = default[1] or any(f for _l, f in self._quotas.values())
        self._floor = (lambda tid: self._quota(tid)[1]) if floors else None
        self.quota_table = (dict(quotas), default)  # read by tenant_stats on any thread

    def ask_sweep(self) -> None:
        """Queue a sweep of expired records unless one is queued (any thread)."""
        if not self.sweep_asked:
            self.sweep_asked = True
            self.submit(SweepJob([], None))

    def _run_batch(self, batch: list[WriteJob]) -> None:
        with self.at_rest:
            start = 0
            for i, job in enumerate(batch):  # a quota change ends a step, and runs alone
                if isinstance(job, QuotaJob):
                    if start < i:
                        self._run_step(batch[start:i])
                    self._set_quotas(job)
                    start = i + 1
            if start < len(batch):
                self._run_step(batch[start:])

    def _run_step(self, batch: list[WriteJob]) -> None:
        effects = self._commit_making_room(batch)
        self._publish(effects, batch)

    def _set_quotas(self, job: QuotaJob) -> None:
        """Enforce the job's quotas; evict each tenant's own oldest records
        down to its new limit, in one transaction. Result: records evicted."""
        self._use_quotas(job.quotas, self._default_quota if job.default is None else job.default)
        victims: list[tuple[bytes, TenantKey]] = []
        for tid, (_records, nbytes) in self._index.tenant_totals().items():
            limit = self._quota(tid)[0]
            if limit is not None and nbytes > limit:
                victims += [(key, tid) for key, _s in self._index.oldest_of(tid, nbytes - limit, ())]

        def evict(txn: Txn) -> TxnEffects:
            effects = TxnEffects()
            for rkey, tid in victims:
                if self._body.remove(txn, rkey, effects):
                    effects.evicted += 1
                    effects.count(effects.quota_evicted, tid)
            job.result = effects.evicted
            return effects

        if victims:
            self._publish(self._write_growing(evict), [job])
        elif job.ticket is not None:
            job.ticket.finish(0)

    def _publish(self, effects: TxnEffects, batch: list[WriteJob]) -> None:
        """Make a committed transaction visible (see the order in the module doc)."""
        self._last_freed = effects.freed
        if self._slots is not None:
            self._slots.committed(effects.freed_slots)
        for tag in effects.untagged:
            self._tag_tenant.pop(tag, None)
        self._tag_tenant.update(effects.tagged)
        self._index.apply(effects.added, effects.dropped)
        self._deadlines.apply(effects.deadlines, effects.dropped)
        if effects.tag_changes:
            self._tag_book.apply(effects.tag_changes)
        if effects.quota_evicted or effects.dropped_pages:
            self.tenant_counters.add(effects.quota_evicted, effects.dropped_pages)
        if effects.touched:
            self._index.touch(effects.touched)
        self._counters.add(
            puts=effects.written,
            put_skipped=effects.skipped,
            write_txns=1,
            evicted=effects.evicted,
            expired=effects.expired,
            deleted=effects.deleted,
        )
        for job in batch:
            if job.ticket is not None:
                job.ticket.finish(job.result)
        cut = len(self._prefix)
        mine = [rkey[cut:] for rkey in effects.removed if rkey.startswith(self._prefix)]
        if mine:
            self._removals.removed(mine)

    # -- making room ------------------------------------------------------------
    # LMDB reuses the pages a transaction frees only two commits later (the
    # previous snapshot may still be read). So after evicting for room, one
    # small extra commit (a "tick") makes the freed pages usable at once.

    def _commit_making_room(self, batch: list[WriteJob]) -> TxnEffects:
        if not os.path.isdir(self._path):  # one stat per batch; the commit costs far more
            raise StorageError(
                f"the directory {self._path!r} of this store is gone (removed while the store "
                f"was open): nothing more can be written to it; close the cache and reopen the store"
            )
        self._ensure_disk_room(batch)
        for _ in range(_MAP_FULL_RETRIES):
            try:
                return self._commit(batch)
            except lmdb.MapFullError:
                self._counters.add(map_full=1)
                keep = put_keys(batch)
                self._evict_for_room(max(put_bytes(batch), self._index.nbytes // 10), keep)
        raise StorageError(
            f"the LMDB map is still full after {_MAP_FULL_RETRIES} rounds of eviction"
        )

    def _ensure_disk_room(self, batch: list[WriteJob]) -> None:
        """Refuse (fail the batch) rather than let a write into the sparse,
        memory-mapped data file meet a full disk: that is a SIGBUS, not an
        error. Evicts least recently used records first if that makes room."""
        keep = put_keys(batch)
        into_map, new_slots = self._incoming_split(batch)
        if not into_map and not new_slots:
            return
        incoming = into_map + self._growth(new_slots)
        reserve = self._reserve.bytes(self._path)
        room = disk_room(self._env, self._path, self._dbs, reserve) - self._last_freed
        evicted = 0
        short = incoming - room
        victims = self._index.oldest(short, keep, self._floor) if short > 0 else []
        if short > 0 and sum(size for _k, size in victims) >= short:
            evicted = self._evict_for_room(short, keep)
            incoming = into_map + self._growth(new_slots)  # evicted slots are free again
            room = disk_room(self._env, self._path, self._dbs, reserve) - self._last_freed
        if room < incoming and self._last_freed:
            # Pages the last commit freed become reusable after one more commit.
            self._publish(self._write_growing(self._body.tick), [])
            room = disk_room(self._env, self._path, self._dbs, reserve) - self._last_freed
        if room < incoming:
            raise StorageError(
                f"the disk of {self._path!r} is nearly full: room for {max(room, 0)} B of "
                f"{incoming} B to write, after evicting {evicted} records; {reserve} B of "
                f"free disk are kept in reserve ({self._reserve.describe()})"
            )
        try:
            preallocate(self._data_fd, self._env, into_map)
        except OSError as exc:
            raise StorageError(
                f"cannot reserve {incoming} B on the disk of {self._path!r}: {exc}"
            ) from exc

    def _incoming_split(self, batch: list[WriteJob]) -> tuple[int, int]:
        """(bytes into LMDB's map, new slots) of the records a batch would add
        (keys not stored yet): a record whose KV bytes go into a slot puts
        only its lead and envelope into the map."""
        into_map = sum(self._incoming_by_tenant(batch).values())
        if self._slots is None or not self._slot_writes:
            return into_map, 0
        tails, count = slot_demand(batch, self._index, self._slots.slot_bytes)
        return into_map - tails, count

    def _growth(self, new_slots: int) -> int:
        """Bytes the slot file grows by to hold ``new_slots`` more slots."""
        return 0 if self._slots is None else self._slots.growth(new_slots)

    def _evict_for_room(self, need: int, keep: set[bytes]) -> int:
        """Evict least recently used records (not in ``keep``) worth ``need``
        bytes, then tick so their pages can be reused. When the map is too full
        even to delete, or there is nothing to evict, grow the map. Returns the
        number of records evicted."""
        victims = self._index.oldest(need, keep, self._floor)
        if not victims:
            grow_map(self._env, self._gate)
            return 0
        effects = self._write_growing(lambda txn: self._body.evict(txn, victims))
        self._publish(effects, [])
        self._publish(self._write_growing(self._body.tick), [])
        return effects.evicted

    def _write_growing(self, body: Callable[[Txn], TxnEffects]) -> TxnEffects:
        """Run ``body`` in one write transaction; if the map is full, grow it once and rerun."""
        try:
            with self._env.begin(write=True, buffers=True) as txn:
                return body(txn)
        except lmdb.MapFullError:
            grow_map(self._env, self._gate)
        with self._env.begin(write=True, buffers=True) as txn:
            return body(txn)

    def _commit(self, batch: list[WriteJob]) -> TxnEffects:
        """Run ``batch`` in one write transaction, evicting for tenant limits
        and for capacity first, after the sweep of expired records (see the
        module docstring); commit."""
        effects = TxnEffects()
        for job in batch:
            job.result = 0
        now = self._clock()
        self.sweep_asked = False  # this step sweeps
        index = self._index
        due = [(k, index.tenant_of(k), index.size_of(k))
               for k in self._deadlines.due(now, SWEEP_MAX) if k in index]  # fmt: skip
        if len(due) == SWEEP_MAX:
            self.ask_sweep()  # the rest in the next step
        expired = {key for key, _t, _s in due}
        expiring: dict[TenantKey, int] = {}  # bytes the sweep frees, per tenant
        for _key, tenant, size in due:
            expiring[tenant] = expiring.get(tenant, 0) + size
        floor = self._floor
        if floor is not None and expiring:  # floors count what stays after the sweep
            floor = lambda t, f=floor: f(t) + expiring.get(t, 0)  # noqa: E731
        live = [job for job in batch if not (isinstance(job, PutJob) and lapsed(job, now))]
        keep = put_keys(live)
        own, limits = self._limit_victims(live, keep, expired, expiring)
        incoming = sum(
            min(n, limits[t]) if t in limits else n
            for t, n in self._incoming_by_tenant(live, expired).items()
        )
        gone = sum(size for _k, _t, size in own) + sum(size for _k, _t, size in due)
        excess = self._index.nbytes - gone + incoming - self._capacity
        skip = keep | expired | {key for key, _t, _s in own}
        victims = [
            (key, self._index.tenant_of(key), size)
            for key, size in (self._index.oldest(excess, skip, floor) if excess > 0 else [])
        ]
        for _key, tenant, size in victims:
            if tenant in limits:
                limits[tenant] += size  # room the capacity eviction made within its limit
        body = self._body
        txn = self._env.begin(write=True, buffers=True)
        try:
            freed = 0
            for rkey, _tenant, size in due:
                effects.expired += body.remove(txn, rkey, effects)
                freed += size
            for rkey, tenant, size in own:
                if body.remove(txn, rkey, effects):
                    effects.evicted += 1
                    effects.count(effects.quota_evicted, tenant)
                freed += size
            for rkey, _tenant, size in victims:
                if body.remove(txn, rkey, effects):
                    effects.evicted += 1
                freed += size
            budget = self._capacity - (self._index.nbytes - freed)
            for job in live:
                if isinstance(job, PutJob):
                    budget = body.put(txn, job, effects, budget, limits)
                elif isinstance(job, DeleteJob):
                    for rkey in job.keys:
                        job.result += body.remove(txn, rkey, effects)
                    if job.ticket is not None:
                        effects.deleted += job.result
                else:
                    body.forget(txn, job, effects)
            if self._slots is not None:
                self._slots.sync()  # the slots' bytes before the commit naming them
        except BaseException:
            txn.abort()
            if self._slots is not None:
                self._slots.give_back(effects.taken)  # named by nothing committed
            raise
        txn.commit()
        for job in batch:
            if isinstance(job, SweepJob):
                job.result = effects.expired
        return effects

    def _limit_victims(
        self,
        batch: list[WriteJob],
        keep: set[bytes],
        expired: set[bytes],
        expiring: Mapping[TenantKey, int],
    ) -> tuple[list[tuple[bytes, TenantKey, int]], dict[TenantKey, int]]:
        """For each tenant with a limit that the batch's puts would take over
        it: its own least recently used records to evict (key, tenant, size);
        and for each tenant with a limit, the bytes it may then add.
        ``expired``: the records the step's sweep removes; ``expiring``:
        their bytes per tenant."""
        own: list[tuple[bytes, TenantKey, int]] = []
        limits: dict[TenantKey, int] = {}
        skip = keep | expired
        for tenant, incoming in self._incoming_by_tenant(batch, expired).items():
            limit = self._quota(tenant)[0]
            if limit is None:
                continue
            held = self._index.tenant_bytes(tenant) - expiring.get(tenant, 0)
            over = held + incoming - limit
            for key, size in self._index.oldest_of(tenant, over, skip) if over > 0 else []:
                own.append((key, tenant, size))
                held -= size
            limits[tenant] = max(0, limit - held)
        return own, limits

    def _incoming_by_tenant(
        self, batch: list[WriteJob], gone: Collection[bytes] = ()
    ) -> dict[TenantKey, int]:
        """Bytes of the records a batch would add (keys not stored yet, or
        in ``gone``: removed first), per tenant."""
        return incoming_by_tenant(batch, self._index, self._body.tenant_of, gone)

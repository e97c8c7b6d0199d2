"""The single LMDB writer thread: batches queued writes into few transactions.

LMDB admits one write transaction at a time, so every mutation of the store
(puts, deletes, namespace forgets, evictions, removal of corrupt records) is a
job on one queue, executed by one thread. The thread takes the first waiting
job, adds whatever else is queued up to a page budget, and runs the batch as
ONE write transaction: one commit and one sync for all of it.

Order of effects after a commit (the owner relies on it, see offload/storage.py)::

    commit -> index updated -> tickets finished -> removed keys published

so a key's removal is published only after the ticket that stored it finished.

Room: records beyond ``capacity_bytes`` are evicted, least recently used
first, in the same transaction that adds new ones. A full LMDB map or a nearly
full disk (offload/lmdb_space.py) is met by evicting more (and growing the map);
if that cannot help, the batch fails.

A failing transaction is aborted and fails every ticket of its batch; the
thread carries on with the next batch. Nothing a job does can stop the thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import lmdb

from radixcache.offload import record as rec
from radixcache.offload.lmdb_index import RecencyIndex
from radixcache.offload.lmdb_space import DiskReserve, MapGate, disk_room, grow_map, preallocate
from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage import (
    Counters,
    HostPages,
    PageBuffer,
    PutMeta,
    StorageError,
    TokenPages,
)
from radixcache.transfer.ticket import FutureTicket

log = logging.getLogger(__name__)

_MAP_FULL_RETRIES = 4  # evict-and-retry rounds when the LMDB map is full


@dataclass(slots=True)
class PutJob:
    """Write host pages as the records of ``rkeys`` (skipping stored ones)."""

    rkeys: list[bytes]  # record keys (fingerprint prefix + page key)
    tokens: TokenPages | None  # [n, P] token ids, a private copy; None: raw pages
    host: PageBuffer  # the caller's page buffer (read on the writer thread)
    host_pages: HostPages  # [n] host page ids holding the pages
    ns_tag: bytes  # namespace index key
    ticket: FutureTicket  # finished with ``result``
    meta: PutMeta | None = None  # event ids, parent, depth, info
    result: int = 0  # leading keys stored once committed

    def record_bytes(self, i: int) -> int:
        """Size of the record of page ``i``."""
        t = 0 if self.tokens is None else int(self.tokens.shape[1])
        info = 0 if self.meta is None else len(self.meta.info)
        return rec.record_size(len(self.rkeys[i]), info, t, self.host.page_bytes)


@dataclass(slots=True)
class DeleteJob:
    """Remove the records of ``rkeys``."""

    rkeys: list[bytes]  # record keys
    ticket: FutureTicket | None  # None: a record a reader found corrupt
    result: int = 0  # records that existed and were removed


@dataclass(slots=True)
class ForgetJob:
    """Remove every record of one namespace."""

    ns_tag: bytes  # namespace index key
    ticket: FutureTicket  # finished with ``result``
    result: int = 0  # records removed


Job = PutJob | DeleteJob | ForgetJob


@dataclass(slots=True)
class _TxnEffects:
    """What one write transaction changed; applied once it committed."""

    added: dict[bytes, int] = field(default_factory=dict)  # new records -> value bytes
    dropped: list[bytes] = field(default_factory=list)  # keys to drop from the index
    removed: list[bytes] = field(default_factory=list)  # records removed (to publish)
    touched: list[bytes] = field(default_factory=list)  # stored keys a put found
    written: int = 0  # records written
    skipped: int = 0  # put keys found already stored
    evicted: int = 0  # records evicted for room
    deleted: int = 0  # records removed by delete()/forget_namespace()
    freed: int = 0  # bytes of the records removed (reusable two commits later)


class LmdbWriter:
    """Owns the write side of one LMDB environment, on its own thread."""

    def __init__(
        self,
        *,
        env: lmdb.Environment,
        path: str,
        pages: lmdb._Database,
        ns: lmdb._Database,
        meta: lmdb._Database,
        gate: MapGate,
        index: RecencyIndex,
        counters: Counters,
        prefix: bytes,
        capacity_bytes: int,
        batch_pages: int,
        next_seq: int,
        disk_reserve: DiskReserve | None = None,
    ) -> None:
        self._env = env
        self._reserve = DiskReserve() if disk_reserve is None else disk_reserve
        self._warn = RateLimitedLog(log)  # failed batches repeat under load
        self._path = path  # the environment's directory (for disk-space checks)
        self._pages = pages  # record key -> record
        self._ns = ns  # namespace tag -> record keys (dupsort)
        self._meta = meta  # store-wide records (fingerprint, tick)
        self._dbs = (pages, ns, meta)  # every named database (for page accounting)
        self._gate = gate  # readers hold it shared; a map resize takes it alone
        self._index = index
        self._counters = counters
        self._prefix = prefix  # this fingerprint's key prefix
        self._capacity = capacity_bytes
        self._batch_pages = batch_pages  # merge queued jobs up to this many pages
        self._next_seq = next_seq  # write sequence number of the next record
        self._staging = bytearray(0)  # each record is built here, then put (reused)
        self._last_freed = 0  # bytes the last commit freed: not reusable by the next one
        self._ticks = 0  # commits made only to advance LMDB's transaction id
        self._data_fd = os.open(os.path.join(path, "data.mdb"), os.O_RDWR)  # for preallocate()
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()  # None: stop
        self._removed_lock = threading.Lock()
        self._removed: list[bytes] = []  # page keys removed, not yet taken
        self._thread = threading.Thread(target=self._run, name="radixcache-lmdb-write", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def take_removed(self) -> list[bytes]:
        with self._removed_lock:
            out, self._removed = self._removed, []
        return out

    def close(self) -> None:
        """Run every job queued so far, then stop the thread."""
        self._queue.put(None)
        self._thread.join()
        os.close(self._data_fd)

    # -- the thread -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            size = _pages(job)
            stop = False
            while size < self._batch_pages:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
                size += _pages(nxt)
            self._run_batch(batch)
            if stop:
                return

    def _run_batch(self, batch: list[Job]) -> None:
        try:
            effects = self._commit_making_room(batch)
            self._publish(effects, batch)
        except Exception as exc:  # an LMDB (or any) error fails the batch, not the thread
            error = (
                exc
                if isinstance(exc, StorageError)
                else StorageError(f"LMDB write failed: {exc!r}")
            )
            if error is not exc:
                error.__cause__ = exc
            self._warn.warning("storage write of %d jobs failed: %s", len(batch), error)
            failed = 0
            for job in batch:
                if job.ticket is not None and not job.ticket.done():
                    job.ticket.fail(error)
                    failed += 1
            self._counters.add(failed_ops=failed)

    def _publish(self, effects: _TxnEffects, batch: list[Job]) -> None:
        """Make a committed transaction visible (see the order in the module doc)."""
        self._last_freed = effects.freed
        self._index.apply(effects.added, effects.dropped)
        if effects.touched:
            self._index.touch(effects.touched)
        self._counters.add(
            puts=effects.written,
            put_skipped=effects.skipped,
            write_txns=1,
            evicted=effects.evicted,
            deleted=effects.deleted,
        )
        for job in batch:
            if job.ticket is not None:
                job.ticket.finish(job.result)
        cut = len(self._prefix)
        mine = [rkey[cut:] for rkey in effects.removed if rkey.startswith(self._prefix)]
        if mine:
            with self._removed_lock:
                self._removed.extend(mine)

    # -- making room ------------------------------------------------------------
    # LMDB reuses the pages a transaction frees only two commits later (the
    # previous snapshot may still be read). So after evicting for room, one
    # small extra commit (a "tick") makes the freed pages usable at once.

    def _commit_making_room(self, batch: list[Job]) -> _TxnEffects:
        self._ensure_disk_room(batch)
        for _ in range(_MAP_FULL_RETRIES):
            try:
                return self._commit(batch)
            except lmdb.MapFullError:
                self._counters.add(map_full=1)
                keep = _put_keys(batch)
                self._evict_for_room(max(_put_bytes(batch), self._index.nbytes // 10), keep)
        raise StorageError(
            f"the LMDB map is still full after {_MAP_FULL_RETRIES} rounds of eviction"
        )

    def _ensure_disk_room(self, batch: list[Job]) -> None:
        """Refuse (fail the batch) rather than let a write into the sparse,
        memory-mapped data file meet a full disk: that is a SIGBUS, not an
        error. Evicts least recently used records first if that makes room."""
        keep = _put_keys(batch)
        incoming = self._incoming(batch)
        if not incoming:
            return
        reserve = self._reserve.bytes(self._path)
        room = disk_room(self._env, self._path, self._dbs, reserve) - self._last_freed
        evicted = 0
        short = incoming - room
        if short > 0 and sum(size for _k, size in self._index.oldest(short, keep)) >= short:
            evicted = self._evict_for_room(short, keep)
            room = disk_room(self._env, self._path, self._dbs, reserve) - self._last_freed
        if room < incoming and self._last_freed:
            # Pages the last commit freed become reusable after one more commit.
            self._publish(self._write_growing(self._tick), [])
            room = disk_room(self._env, self._path, self._dbs, reserve) - self._last_freed
        if room < incoming:
            raise StorageError(
                f"the disk of {self._path!r} is nearly full: room for {max(room, 0)} B of "
                f"{incoming} B to write, after evicting {evicted} records; {reserve} B of "
                f"free disk are kept in reserve ({self._reserve.describe()})"
            )
        try:
            preallocate(self._data_fd, self._env, incoming)
        except OSError as exc:
            raise StorageError(
                f"cannot reserve {incoming} B on the disk of {self._path!r}: {exc}"
            ) from exc

    def _incoming(self, batch: list[Job]) -> int:
        """Bytes of the records a batch would add (keys not stored yet)."""
        seen: set[bytes] = set()
        total = 0
        for job in batch:
            if isinstance(job, PutJob):
                for i, rkey in enumerate(job.rkeys):
                    if rkey not in self._index and rkey not in seen:
                        seen.add(rkey)
                        total += job.record_bytes(i)
        return total

    def _evict_for_room(self, need: int, keep: set[bytes]) -> int:
        """Evict least recently used records (not in ``keep``) worth ``need``
        bytes, then tick so their pages can be reused. When the map is too full
        even to delete, or there is nothing to evict, grow the map. Returns the
        number of records evicted."""
        victims = self._index.oldest(need, keep)
        if not victims:
            grow_map(self._env, self._gate)
            return 0
        effects = self._write_growing(lambda txn: self._evict(txn, victims))
        self._publish(effects, [])
        self._publish(self._write_growing(self._tick), [])
        return effects.evicted

    def _write_growing(
        self, body: Callable[[lmdb.Transaction[memoryview]], _TxnEffects]
    ) -> _TxnEffects:
        """Run ``body`` in one write transaction; if the map is full, grow it once and rerun."""
        try:
            with self._env.begin(write=True, buffers=True) as txn:
                return body(txn)
        except lmdb.MapFullError:
            grow_map(self._env, self._gate)
        with self._env.begin(write=True, buffers=True) as txn:
            return body(txn)

    def _evict(
        self, txn: lmdb.Transaction[memoryview], victims: list[tuple[bytes, int]]
    ) -> _TxnEffects:
        effects = _TxnEffects()
        for rkey, _size in victims:
            if self._remove(txn, rkey, effects):
                effects.evicted += 1
        return effects

    def _tick(self, txn: lmdb.Transaction[memoryview]) -> _TxnEffects:
        self._ticks += 1
        txn.put(b"tick", self._ticks.to_bytes(8, "little"), db=self._meta)
        return _TxnEffects()

    def _commit(self, batch: list[Job]) -> _TxnEffects:
        effects = _TxnEffects()
        for job in batch:
            job.result = 0
        keep = _put_keys(batch)
        incoming = self._incoming(batch)
        excess = self._index.nbytes + incoming - self._capacity
        victims = self._index.oldest(excess, keep) if excess > 0 else []
        txn = self._env.begin(write=True, buffers=True)
        try:
            freed = 0
            for rkey, size in victims:
                if self._remove(txn, rkey, effects):
                    effects.evicted += 1
                freed += size
            budget = self._capacity - (self._index.nbytes - freed)
            for job in batch:
                if isinstance(job, PutJob):
                    budget = self._put(txn, job, effects, budget)
                elif isinstance(job, DeleteJob):
                    for rkey in job.rkeys:
                        job.result += self._remove(txn, rkey, effects)
                    if job.ticket is not None:
                        effects.deleted += job.result
                else:
                    self._forget(txn, job, effects)
        except BaseException:
            txn.abort()
            raise
        txn.commit()
        return effects

    def _put(
        self, txn: lmdb.Transaction[memoryview], job: PutJob, effects: _TxnEffects, budget: int
    ) -> int:
        """Write one put job's records into ``txn``; returns the budget left."""
        host_bytes = job.host.as_bytes()
        gone = set(effects.dropped)
        for i, rkey in enumerate(job.rkeys):
            if rkey in effects.added or (rkey in self._index and rkey not in gone):
                effects.touched.append(rkey)
                effects.skipped += 1
                job.result += 1
                continue
            size = job.record_bytes(i)
            if size > budget:
                break  # no room left, even after evicting every older record
            if len(self._staging) != size:
                self._staging = bytearray(size)
            value = self._staging
            meta = job.meta
            rec.encode_into(
                value,
                key=rkey,
                ns_tag=job.ns_tag,
                tokens=None if job.tokens is None else job.tokens[i],
                kv=host_bytes[job.host_pages[i]],
                seq=self._next_seq,
                block_id=None if meta is None else int(meta.block_ids[i]),
                parent_block_id=(
                    None if meta is None
                    else meta.parent_block_id if i == 0 else int(meta.block_ids[i - 1])
                ),
                depth=0 if meta is None else meta.first_depth + i,
                info=b"" if meta is None else meta.info,
            )
            self._next_seq += 1
            if txn.put(rkey, value, overwrite=False, db=self._pages):  # LMDB copies it
                txn.put(job.ns_tag, rkey, db=self._ns)
                effects.added[rkey] = len(value)
                effects.written += 1
                budget -= len(value)
            else:  # on disk but not in the index: written by another process
                existing = txn.get(rkey, db=self._pages)
                assert existing is not None, "put(overwrite=False) refused a missing key"
                effects.added[rkey] = len(existing)
                effects.skipped += 1
            job.result += 1
        return budget

    def _forget(
        self, txn: lmdb.Transaction[memoryview], job: ForgetJob, effects: _TxnEffects
    ) -> None:
        cursor = txn.cursor(db=self._ns)
        rkeys = [bytes(v) for v in cursor.iternext_dup()] if cursor.set_key(job.ns_tag) else []
        for rkey in rkeys:
            job.result += self._remove(txn, rkey, effects)
        txn.delete(job.ns_tag, db=self._ns)  # any entry left whose record was gone
        effects.deleted += job.result

    def _remove(self, txn: lmdb.Transaction[memoryview], rkey: bytes, effects: _TxnEffects) -> bool:
        """Delete one record and its namespace entry; False if it did not exist."""
        effects.dropped.append(rkey)
        effects.added.pop(rkey, None)
        value = txn.get(rkey, db=self._pages)
        if value is None:
            return False
        tag = rec.read_namespace_tag(value)  # a copy: value dies with the next write
        effects.freed += len(value)
        txn.delete(rkey, db=self._pages)
        if tag is not None:
            txn.delete(tag, rkey, db=self._ns)
        effects.removed.append(rkey)
        return True


def _pages(job: Job) -> int:
    return 1 if isinstance(job, ForgetJob) else max(1, len(job.rkeys))


def _put_bytes(batch: list[Job]) -> int:
    return sum(
        job.record_bytes(i) for job in batch if isinstance(job, PutJob) for i in range(len(job.rkeys))
    )


def _put_keys(batch: list[Job]) -> set[bytes]:
    return {rkey for job in batch if isinstance(job, PutJob) for rkey in job.rkeys}

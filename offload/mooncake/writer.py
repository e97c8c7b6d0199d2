"""The pool's write transport: exist-checked, zero-copy batch puts; removals by name and pattern.

    put / delete / forget --> queue --> writer thread (one job per step)

    put, per chunk of batch_pages pages:
      1. batch_is_exist(records + markers)          one round trip
      2. batch_remove(force) of orphaned records     only if a record is there
                                                     without its marker
      3. batch_put_from_multi_buffers(...)            records as [head, host
                                                     page] (the KV bytes go
                                                     from the host page, never
                                                     copied) and missing markers
    delete: batch_remove(force) of the records (their markers stay: 16 bytes
            each, harmless, gone with their namespace)
    tags:   a put that carries tags lists its namespace under each first
            (offload/mooncake/tags.py); invalidate_tag forgets every
            namespace a tag lists, as forget does, then clears its slots
    forget: remove_by_regex(force) of the namespace's markers, for every
            engine's pages at once; the records this process stored under it
            are removed too, the others' when a reader or a put meets them

A put of a key Mooncake holds already succeeds without writing (so step 1
tells "stored now" from "found there", and skips the transfer). A record
whose marker is missing was forgotten (or its marker evicted): it is removed
and written again, never revived with the old bytes. Removals use ``force``:
a reader's lease must not keep a deleted or forgotten record alive, and every
read verifies what it gets anyway.

Retention is not supported on Mooncake yet: the store sets no expiry on an
object, so a put that carries a deadline (``PutMeta.expires_at``) writes
nothing (its ticket says 0) and is counted (``MooncakePoolStats.past_deadline``
counts those pages), rather than store pages that could outlive it.

Failures never escape the thread: a master that cannot be reached ends a put
with the pages stored so far and fails a forget's ticket (the namespace may
still be in the pool); a full pool (no segment space) ends a put short.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from radixcache.offload.mooncake.keys import PoolKeys
from radixcache.offload.mooncake.link import OK, RPC_FAIL, MooncakeLink, PoolUnavailable
from radixcache.offload.mooncake.tags import TagFull, TagSlots, pinned
from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage import (
    Counters,
    DeleteJob,
    ForgetJob,
    HeldRemovalLog,
    JobWriter,
    PutJob,
    TagJob,
    WriteJob,
)
from radixcache.offload.storage import record as rec
from radixcache.offload.storage.jobs import page_key

log = logging.getLogger(__name__)


class MooncakeWriter(JobWriter):
    """Runs put/delete/forget jobs in order on one thread (see the module docstring)."""

    def __init__(
        self,
        where: str,
        counters: Counters,
        removals: HeldRemovalLog,
        link: MooncakeLink,
        keys: PoolKeys,
        page_size: int,
        *,
        before_job: Callable[[], None],
    ) -> None:
        """``before_job``: called on the writer thread before each job (e.g. to
        refresh the pool's size figures, at most once a second)."""
        config = link.config
        self._link = link
        self._keys = keys
        self._held = removals  # removals wait for the puts of their keys
        self._batch = config.batch_pages
        from mooncake.store import ReplicateConfig  # after the link set the client's environment

        self._replicate = ReplicateConfig()
        self._replicate.replica_num = config.replicas
        self._seq = time.time_ns() // 1000  # write seq of the next record: ordered across engines
        self._head_cap = rec.head_size(rec.MAX_KEY_BYTES, rec.MAX_INFO_BYTES, page_size)
        slot = self._head_cap + rec.NS_TAG_BYTES  # a record head, then a marker value
        self._staging = np.zeros(self._batch * slot, dtype=np.uint8)
        self._before_job = before_job
        self._by_tag: dict[bytes, set[bytes]] = {}  # record keys this process stored, per namespace tag
        self._refused = RateLimitedLog(log)  # a full pool refuses every put
        self._tags = TagSlots(link, keys, pinned(self._replicate))
        self.unavailable = 0  # jobs cut short because the master was unreachable
        self.past_deadline = 0  # pages not written: they carried a retention deadline
        self.tag_full = 0  # pages not written: a tag of theirs lists TAG_SLOTS namespaces
        super().__init__(  # one job per step: a put batches its own chunks
            where, counters, removals, merge_pages=1, thread_name="radixcache-mooncake-write"
        )

    def submit(self, job: WriteJob) -> None:
        if isinstance(job, PutJob):
            self._held.begin_put(job.page_keys())
        super().submit(job)

    def _run_batch(self, batch: list[WriteJob]) -> None:
        for job in batch:
            self._before_job()
            if isinstance(job, PutJob):
                self._put(job)
            elif isinstance(job, DeleteJob):
                self._delete(job)
            elif isinstance(job, TagJob):
                self._invalidate(job)
            else:
                self._forget(job)

    # -- put ---------------------------------------------------------------------------
    def _put(self, job: PutJob) -> None:
        pkeys = job.page_keys()
        stored = written = skipped = 0
        wrote: list[bytes] = []
        try:
            if job.meta is not None and job.meta.expires_at is not None:
                self.past_deadline += len(job.keys)  # no expiry on Mooncake: not written
                raise _Skip
            for tag in () if job.meta is None else job.meta.tags:
                self._tags.register(tag, job.ns_tag)  # before any value of the namespace
            host_bytes = job.host.as_bytes()
            if not host_bytes.flags.c_contiguous:
                raise ValueError("the host buffer must be one contiguous block of pages")
            self._link.register(host_bytes)
            self._link.register(self._staging)
            for start in range(0, len(job.keys), self._batch):
                end = min(start + self._batch, len(job.keys))
                ok, fresh, found = self._put_chunk(job, start, end, host_bytes)
                stored += ok
                written += len(fresh)
                skipped += found
                wrote.extend(pkeys[start + j] for j in fresh)
                if ok < end - start:
                    break
        except _Skip:
            pass
        except TagFull:
            self.tag_full += len(job.keys)
        except PoolUnavailable:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        except Exception as exc:  # a bug must not hang the ticket: what was stored stands
            log.error("pool put failed", exc_info=exc)
            self._counters.add(failed_ops=1)
        self._counters.add(puts=written, put_skipped=skipped, write_txns=1)
        self._by_tag.setdefault(job.ns_tag, set()).update(job.keys[:stored])
        # what it wrote is on record before the ticket says done, so the
        # engine landing the put knows which pages to announce
        self._held.note_written(wrote)
        job.ticket.finish(stored)
        self._held.end_put(pkeys, pkeys[:stored])

    def _put_chunk(
        self, job: PutJob, start: int, end: int, host_bytes: npt.NDArray[np.uint8]
    ) -> tuple[int, list[int], int]:
        """Put pages ``start:end``; returns (leading pages stored, indexes of the
        records written now, pages found stored already)."""
        n = end - start
        rkeys = job.keys[start:end]
        records = self._keys.records(rkeys)
        markers = self._keys.markers([job.ns_tag] * n, rkeys)
        exist: list[int] = self._link.run(lambda store: store.batch_is_exist(records + markers))
        if RPC_FAIL in exist:
            self._link.mark_down("a put's existence check found the master unreachable")
            raise PoolUnavailable("the master is unreachable")
        has_record = [e == 1 for e in exist[:n]]
        has_marker = [e == 1 for e in exist[n:]]
        orphans = [records[j] for j in range(n) if has_record[j] and not has_marker[j]]
        if orphans:  # forgotten records: written again below, never revived
            self._link.run(lambda store: store.batch_remove(orphans, True))
        put_record = [j for j in range(n) if not (has_record[j] and has_marker[j])]
        put_marker = [j for j in range(n) if not has_marker[j]]
        names, ptrs, sizes = self._layout(job, start, put_record, put_marker, records, markers, host_bytes)
        results: list[int] = (
            self._link.run(lambda store: store.batch_put_from_multi_buffers(names, ptrs, sizes, self._replicate))
            if names else []
        )  # fmt: skip
        if RPC_FAIL in results:
            self._link.mark_down("a put found the master unreachable")
        record_rc = dict(zip(put_record, results))
        marker_rc = dict(zip(put_marker, results[len(put_record) :]))
        stored = 0
        for j in range(n):
            if record_rc.get(j, OK) != OK or marker_rc.get(j, OK) != OK:
                code = record_rc.get(j, OK) or marker_rc.get(j, OK)
                if code != RPC_FAIL:
                    self._refused.warning("pool put refused (%d): no room in the pool's segments?", code)
                self._counters.add(failed_ops=1)
                break
            stored += 1
        fresh = [j for j in put_record if j < stored]
        return stored, fresh, stored - len(fresh)

    def _layout(
        self, job: PutJob, start: int, put_record: list[int], put_marker: list[int],
        records: list[str], markers: list[str], host_bytes: npt.NDArray[np.uint8],
    ) -> tuple[list[str], list[list[int]], list[list[int]]]:  # fmt: skip
        """Names, buffer pointers and sizes of one put call: each record as its
        head (encoded into the staging area) plus its host page, each marker as
        its tag (in the staging area)."""
        staging = self._staging
        base, page = staging.ctypes.data, host_bytes.shape[1]
        slot = self._head_cap + rec.NS_TAG_BYTES
        names: list[str] = []
        ptrs: list[list[int]] = []
        sizes: list[list[int]] = []
        for j in put_record:
            i = start + j
            kv = host_bytes[job.host_pages[i]]
            head = job.encode_head(i, self._seq, kv)
            self._seq += 1
            staging[j * slot : j * slot + len(head)] = np.frombuffer(head, dtype=np.uint8)
            names.append(records[j])
            ptrs.append([base + j * slot, host_bytes.ctypes.data + int(job.host_pages[i]) * page])
            sizes.append([len(head), page])
        tag = np.frombuffer(job.ns_tag, dtype=np.uint8)
        for j in put_marker:
            at = j * slot + self._head_cap
            staging[at : at + tag.size] = tag
            names.append(markers[j])
            ptrs.append([base + at])
            sizes.append([tag.size])
        return names, ptrs, sizes

    # -- delete / forget -------------------------------------------------------------------
    def _delete(self, job: DeleteJob) -> None:
        removed = self._remove(job.keys)
        if job.ticket is not None:
            self._counters.add(deleted=len(removed))
            job.ticket.finish(len(removed))

    def _remove(self, rkeys: list[bytes]) -> list[bytes]:
        """Remove the records of ``rkeys``; returns the page keys that existed (reported)."""
        gone: list[bytes] = []
        try:
            for start in range(0, len(rkeys), self._batch):
                chunk = rkeys[start : start + self._batch]
                names = self._keys.records(chunk)
                results: list[int] = self._link.run(lambda store: store.batch_remove(names, True))
                if RPC_FAIL in results:
                    self._link.mark_down("a delete found the master unreachable")
                gone.extend(page_key(k) for k, rc in zip(chunk, results) if rc == OK)
        except PoolUnavailable:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        self._held.removed(gone)
        return gone

    def _forget(self, job: ForgetJob) -> None:
        try:
            count = self._forget_namespace(job.ns_tag)
        except PoolUnavailable as exc:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
            job.ticket.fail(exc)  # the namespace may still be in the pool: say so
            return
        self._counters.add(deleted=count)
        job.ticket.finish(count)

    def _forget_namespace(self, ns_tag: bytes) -> int:
        """Remove the markers of namespace ``ns_tag`` (and this process's records
        of it); returns the markers removed. Raises PoolUnavailable."""
        pattern = self._keys.forget_pattern(ns_tag)
        count: int = self._link.run(lambda store: store.remove_by_regex(pattern, True))
        if count == RPC_FAIL:
            self._link.mark_down("a forget found the master unreachable")
            raise PoolUnavailable("the master is unreachable")
        if count < 0:
            raise PoolUnavailable(f"remove_by_regex failed ({count})")
        mine = sorted(self._by_tag.pop(ns_tag, ()))
        self._remove(mine)  # their markers are gone: free their memory now
        self._held.removed(page_key(k) for k in mine)  # reported even if another engine removed them
        return count

    def _invalidate(self, job: TagJob) -> None:
        """Forget every namespace ``job.tag`` lists, then clear its slots."""
        try:
            listed = self._tags.listed(job.tag)
            count = sum(self._forget_namespace(ns_tag) for ns_tag in listed.values())
            self._tags.clear(job.tag, sorted(listed))
        except PoolUnavailable as exc:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
            job.ticket.fail(exc)  # the slots still list what was not forgotten
            return
        self._counters.add(deleted=count)
        job.ticket.finish(count)


class _Skip(Exception):
    """A put that writes nothing, by design (not a failure)."""

"""The pool's write path: an encoder thread and a sender thread.

    put / delete / forget  --> queue --> encoder thread --> sender thread:
                                         per chunk of batch_pages pages (and
                                         at most ~16 MiB), one pipeline
                                         [SADD ns-index keys..., SET key
                                         record NX EX ttl ...]

A put's index entries go first in its pipeline, so a connection lost half way
leaves at most index entries without records (harmless: ``forget_namespace``
deletes keys that are gone already), never a record missing from its index.

Failures never escape a thread: a pool that is down or times out ends a put
with the keys stored so far (counted); a forget fails its ticket (the
namespace may still be in the pool). Nothing here raises into the owner.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import Counters, HostPages, PageBuffer, PutMeta, TokenPages
from radixcache.offload.valkey_link import PoolLink, PoolUnavailable, Scattered
from radixcache.offload.valkey_records import encode_record
from radixcache.offload.valkey_removals import RemovalLog
from radixcache.transfer.ticket import FutureTicket

log = logging.getLogger(__name__)

_AHEAD = 4  # put chunks encoded ahead of the sender at most
# A put chunk holds at most this many KV bytes (and at least one page), so
# that the sender starts on the first chunk while the encoder checksums the
# next: 64 pages of 2 MiB in one chunk would be checksummed whole (~10 ms
# here) before the first byte went out. Each chunk costs one round trip.
_CHUNK_BYTES = 16 << 20


@dataclass(slots=True)
class PutJob:
    """Write host pages as the records of ``rkeys`` (keys already there are kept)."""

    rkeys: list[bytes]  # pool keys (key prefix + record key)
    fkeys: list[bytes]  # record keys (fingerprint digest + page key), stored in each record
    pkeys: list[bytes]  # the page keys (for the removal log)
    tokens: TokenPages | None  # [n, P] token ids, a private copy; None: raw pages
    host: PageBuffer  # the caller's pages (read on the writer thread)
    host_pages: HostPages  # [n] page ids in ``host`` holding the pages
    ns_key: bytes  # the namespace index set
    ns_tag: bytes  # the namespace tag in each record
    meta: PutMeta | None  # event ids, parent, depth, info
    ticket: FutureTicket  # finished with the leading keys stored


@dataclass(slots=True)
class DeleteJob:
    """Remove the records of ``rkeys``."""

    rkeys: list[bytes]
    pkeys: list[bytes]
    ticket: FutureTicket | None  # None: a record a reader found corrupt


@dataclass(slots=True)
class ForgetJob:
    """Remove every record listed in one namespace index, then the index."""

    ns_key: bytes
    cut: int  # length of the pool-key prefix before the page key
    ticket: FutureTicket


Job = PutJob | DeleteJob | ForgetJob


@dataclass(slots=True)
class _PutProgress:
    """A put job's chunks so far (updated on the sender thread)."""

    stored: int = 0  # leading keys in the pool
    written: int = 0  # SETs that wrote
    wrote: list[bytes] = field(default_factory=list)  # page keys this put wrote (not found there)
    skipped: int = 0  # SETs that found the key there
    stopped: bool = False  # a chunk failed: the later ones are not sent


class PoolWriter:
    """Runs put/delete/forget jobs in order, in two stages::

        queue --> encoder thread: a put's records, chunk by chunk (checksums)
              --> sender thread:  every network call, in job order; finishes
                                  the tickets

    so the records of chunk k+1 (or of the next put) are built while chunk k
    is on the wire. At most ``_AHEAD`` chunks wait for the sender.
    """

    def __init__(
        self,
        *,
        link: PoolLink,
        counters: Counters,
        removals: RemovalLog,
        ttl_s: int | None,
        batch_pages: int,
        first_seq: int,
        after_job: Callable[[], None],
    ) -> None:
        self._link = link
        self._counters = counters
        self._removals = removals
        self._ttl = ttl_s
        self._batch = batch_pages
        self._seq = first_seq  # write sequence number of the next record
        self._after_job = after_job  # e.g. refresh the pool's size figures
        self._ahead = threading.BoundedSemaphore(_AHEAD)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="radixcache-pool-send")
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.unavailable = 0  # jobs cut short because the pool was down
        self._thread = threading.Thread(target=self._run, name="radixcache-pool-write", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        if isinstance(job, PutJob):
            self._removals.begin_put(job.pkeys)
        self._queue.put(job)

    def close(self) -> None:
        """Run every job queued so far, then stop the threads."""
        self._queue.put(None)
        self._thread.join()
        self._sender.shutdown(wait=True)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if isinstance(job, PutJob):
                try:
                    self._put(job)
                except Exception as exc:  # a bug must not stop the thread or hang a ticket
                    self._send(self._fail, job, exc)
            else:
                self._send(self._delete if isinstance(job, DeleteJob) else self._forget, job)

    def _send(self, step: Callable[..., None], *args: Any) -> None:
        """Queue ``step(*args)`` on the sender thread (in order; never raises there)."""
        self._ahead.acquire()

        def run() -> None:
            try:
                step(*args)
            except Exception as exc:  # a bug must not stop the sender or hang a ticket
                job = args[0]
                log.exception("pool write job failed")
                self._fail(job, exc)
            finally:
                self._ahead.release()

        self._sender.submit(run)

    def _fail(self, job: Job, exc: Exception) -> None:
        if job.ticket is not None and not job.ticket.done():
            job.ticket.fail(exc)
        if isinstance(job, PutJob):
            self._removals.end_put(job.pkeys, [])

    # -- put ---------------------------------------------------------------------
    def _put(self, job: PutJob) -> None:
        """Encode the job's chunks here; the sender sends them and finishes it."""
        host_bytes = job.host.as_bytes()
        progress = _PutProgress()
        n = len(job.rkeys)
        step = max(1, min(self._batch, _CHUNK_BYTES // max(1, host_bytes.shape[1])))
        for start in range(0, n, step):
            keys = job.rkeys[start : start + step]
            values = self._encode(job, start, len(keys), host_bytes)
            self._send(self._send_chunk, job, progress, keys, values, start + step >= n)

    def _send_chunk(
        self,
        job: PutJob,
        progress: _PutProgress,
        keys: list[bytes],
        values: list[Scattered],
        last: bool,
    ) -> None:
        if not progress.stopped:
            try:
                replies = self._link.run(
                    partial(self._queue_puts, ns_key=job.ns_key, keys=keys, values=values)
                )
                start = progress.stored
                progress.stopped = not self._count(replies, progress)
                progress.wrote.extend(
                    job.pkeys[start + j]
                    for j, reply in enumerate(replies[1 : 1 + progress.stored - start])
                    if reply is True
                )
            except PoolUnavailable:
                progress.stopped = True
                self.unavailable += 1
                self._counters.add(failed_ops=1)
        if last:
            self._counters.add(puts=progress.written, put_skipped=progress.skipped, write_txns=1)
            # what it wrote is on record before the ticket says done, so the
            # engine landing the put knows which pages to announce
            self._removals.note_written(progress.wrote)
            job.ticket.finish(progress.stored)
            self._removals.end_put(job.pkeys, job.pkeys[: progress.stored])
            self._after_job()

    def _count(self, replies: list[Any], progress: _PutProgress) -> bool:
        """Add one chunk's SET replies to ``progress``; False at a refused SET."""
        for reply in replies[1:]:  # replies[0] answers the SADD
            if isinstance(reply, Exception):  # e.g. OOM under noeviction
                log.warning("pool put refused: %s", reply)
                self._counters.add(failed_ops=1)
                return False
            progress.stored += 1
            progress.written += reply is True
            progress.skipped += reply is not True
        return True

    def _encode(
        self, job: PutJob, start: int, count: int, host_bytes: npt.NDArray[np.uint8]
    ) -> list[Scattered]:
        values = []
        for i in range(start, start + count):
            values.append(
                encode_record(
                    key=job.fkeys[i],
                    ns_tag=job.ns_tag,
                    tokens=None if job.tokens is None else job.tokens[i],
                    kv=host_bytes[job.host_pages[i]],
                    seq=self._seq,
                    meta=job.meta,
                    index=i,
                )
            )
            self._seq += 1
        return values

    def _queue_puts(
        self, pipe: object, *, ns_key: bytes, keys: list[bytes], values: list[Scattered]
    ) -> None:
        pipe.sadd(ns_key, *keys)  # type: ignore[attr-defined]
        for key, value in zip(keys, values):
            pipe.set(key, value, nx=True, ex=self._ttl)  # type: ignore[attr-defined]

    # -- delete / forget -------------------------------------------------------
    def _delete(self, job: DeleteJob) -> None:
        removed = self._delete_keys(job.rkeys, job.pkeys)
        if job.ticket is not None:
            self._counters.add(deleted=removed)
            job.ticket.finish(removed)
        self._after_job()

    def _delete_keys(self, rkeys: list[bytes], pkeys: list[bytes]) -> int:
        removed = 0
        gone: list[bytes] = []
        try:
            for start in range(0, len(rkeys), self._batch):
                chunk = rkeys[start : start + self._batch]
                replies = self._link.run(lambda pipe: [pipe.delete(k) for k in chunk])
                for j, reply in enumerate(replies):
                    if reply == 1:
                        removed += 1
                        gone.append(pkeys[start + j])
        except PoolUnavailable:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        self._removals.removed(gone)
        return removed

    def _forget(self, job: ForgetJob) -> None:
        removed = 0
        try:
            members: list[bytes] = self._link.run(lambda pipe: pipe.smembers(job.ns_key))[0]
            if isinstance(members, Exception):
                raise PoolUnavailable(f"reading the namespace index failed: {members}")
            rkeys = sorted(members)
            removed = self._delete_keys(rkeys, [k[job.cut :] for k in rkeys])
            self._link.run(lambda pipe: pipe.delete(job.ns_key))
        except PoolUnavailable as exc:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
            job.ticket.fail(exc)  # the namespace may still be in the pool: say so
            return
        self._counters.add(deleted=removed)
        job.ticket.finish(removed)
        self._after_job()

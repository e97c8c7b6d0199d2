"""The pool's write transport: the shared writer thread encodes, a sender thread sends.

    put / delete / forget  --> queue --> writer thread --> sender thread:
                                         (encoder; one     per chunk of batch_pages
                                         job per step)     pages (and at most
                                                           ~16 MiB), one pipeline
                                                           [SADD ns-index keys...,
                                                           SET key record NX EX ttl ...]

A put's index entries go first in its pipeline, so a connection lost half way
leaves at most index entries without records (harmless: ``forget_namespace``
deletes keys that are gone already), never a record missing from its index.

Failures never escape a thread: a pool that is down or times out ends a put
with the keys stored so far (counted); a forget fails its ticket (the
namespace may still be in the pool). Nothing here raises into the owner.

Keys: a job carries record keys (fingerprint digest + page key, what each
record is written under); the pool key is the config's key prefix before
it, and a namespace's index set is ``<key prefix>ns:<namespace tag>``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import (
    Counters,
    DeleteJob,
    ForgetJob,
    HeldRemovalLog,
    JobWriter,
    PutJob,
    WriteJob,
)
from radixcache.offload.storage import record as rec
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable, Scattered

log = logging.getLogger(__name__)

_AHEAD = 4  # put chunks encoded ahead of the sender at most
# A put chunk holds at most this many KV bytes (and at least one page), so
# that the sender starts on the first chunk while the encoder checksums the
# next: 64 pages of 2 MiB in one chunk would be checksummed whole (~10 ms
# here) before the first byte went out. Each chunk costs one round trip.
_CHUNK_BYTES = 16 << 20


def namespace_key(key_prefix: bytes, ns_tag: bytes) -> bytes:
    """The pool key of a namespace's index set."""
    return key_prefix + b"ns:" + ns_tag


@dataclass(slots=True)
class _PutProgress:
    """A put job's chunks so far (updated on the sender thread)."""

    pkeys: list[bytes]  # the job's page keys (for the removal log)
    ns_key: bytes  # the namespace index set
    stored: int = 0  # leading keys in the pool
    written: int = 0  # SETs that wrote
    wrote: list[bytes] = field(default_factory=list)  # page keys this put wrote (not found there)
    skipped: int = 0  # SETs that found the key there
    stopped: bool = False  # a chunk failed: the later ones are not sent


class PoolWriter(JobWriter):
    """Runs put/delete/forget jobs in order, in two stages::

        queue --> writer thread: a put's records, chunk by chunk (checksums)
              --> sender thread: every network call, in job order; finishes
                                 the tickets

    so the records of chunk k+1 (or of the next put) are built while chunk k
    is on the wire. At most ``_AHEAD`` chunks wait for the sender.
    """

    def __init__(
        self,
        where: str,
        counters: Counters,
        removals: HeldRemovalLog,
        link: PoolLink,
        *,
        after_job: Callable[[], None],
    ) -> None:
        """``after_job``: called on the sender thread after each job (e.g. to
        refresh the pool's size figures)."""
        config = link.config
        self._link = link
        self._held = removals  # removals wait for the puts of their keys
        self._key_prefix = config.key_prefix  # pool key = key prefix + record key
        self._cut = len(config.key_prefix) + rec.FINGERPRINT_BYTES  # pool key[cut:]: page key
        self._ttl = config.ttl_s
        self._batch = config.batch_pages  # pages per pipeline at most
        self._seq = time.time_ns() // 1000  # write seq of the next record: ordered across engines
        self._after_job = after_job
        self._ahead = threading.BoundedSemaphore(_AHEAD)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="radixcache-pool-send")
        self.unavailable = 0  # jobs cut short because the pool was down
        super().__init__(  # one job per step: a put pipelines its own chunks
            where, counters, removals, merge_pages=1, thread_name="radixcache-pool-write"
        )

    def submit(self, job: WriteJob) -> None:
        if isinstance(job, PutJob):
            self._held.begin_put(job.page_keys())
        super().submit(job)

    def close(self) -> None:
        """Run every job queued so far, then stop the threads."""
        super().close()
        self._sender.shutdown(wait=True)

    def _run_batch(self, batch: list[WriteJob]) -> None:
        for job in batch:
            if isinstance(job, PutJob):
                try:
                    self._put(job)
                except Exception as exc:  # a bug must not stop the thread or hang a ticket
                    self._send(self._fail, job, exc)
            elif isinstance(job, DeleteJob):
                self._send(self._delete, job)
            else:
                self._send(self._forget, job)

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

    def _fail(self, job: WriteJob, exc: Exception) -> None:
        self._fail_tickets([job], exc)
        if isinstance(job, PutJob):
            self._held.end_put(job.page_keys(), [])

    # -- put ---------------------------------------------------------------------
    def _put(self, job: PutJob) -> None:
        """Encode the job's chunks here; the sender sends them and finishes it."""
        host_bytes = job.host.as_bytes()
        progress = _PutProgress(job.page_keys(), namespace_key(self._key_prefix, job.ns_tag))
        n = len(job.keys)
        step = max(1, min(self._batch, _CHUNK_BYTES // max(1, host_bytes.shape[1])))
        for start in range(0, n, step):
            keys = [self._key_prefix + k for k in job.keys[start : start + step]]
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
                    partial(self._queue_puts, ns_key=progress.ns_key, keys=keys, values=values)
                )
                start = progress.stored
                progress.stopped = not self._count(replies, progress)
                progress.wrote.extend(
                    progress.pkeys[start + j]
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
            self._held.note_written(progress.wrote)
            job.ticket.finish(progress.stored)
            self._held.end_put(progress.pkeys, progress.pkeys[: progress.stored])
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
        """The records of pages ``start`` to ``start + count``, each as its head
        plus its body: in the clear the host page itself, so the KV bytes are
        sent from the host page, never copied (the caller leaves the page
        untouched until the ticket is done); sealed, its ciphertext."""
        values = []
        for i in range(start, start + count):
            kv = host_bytes[job.host_pages[i]]
            values.append(Scattered(*job.encode_parts(i, self._seq, kv)))
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
        pkeys = [self._key_prefix + k for k in job.keys]
        removed = self._delete_keys(pkeys, job.page_keys())
        if job.ticket is not None:
            self._counters.add(deleted=removed)
            job.ticket.finish(removed)
        self._after_job()

    def _delete_keys(self, rkeys: list[bytes], pkeys: list[bytes]) -> int:
        """DEL the pool keys ``rkeys`` (page keys ``pkeys``); returns how many existed."""
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
        self._held.removed(gone)
        return removed

    def _forget(self, job: ForgetJob) -> None:
        removed = 0
        ns_key = namespace_key(self._key_prefix, job.ns_tag)
        try:
            members: list[bytes] = self._link.run(lambda pipe: pipe.smembers(ns_key))[0]
            if isinstance(members, Exception):
                raise PoolUnavailable(f"reading the namespace index failed: {members}")
            rkeys = sorted(members)
            removed = self._delete_keys(rkeys, [k[self._cut :] for k in rkeys])
            self._link.run(lambda pipe: pipe.delete(ns_key))
        except PoolUnavailable as exc:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
            job.ticket.fail(exc)  # the namespace may still be in the pool: say so
            return
        self._counters.add(deleted=removed)
        job.ticket.finish(removed)
        self._after_job()

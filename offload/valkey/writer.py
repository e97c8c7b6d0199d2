"""The pool's write transport: the shared writer thread encodes, a sender thread sends.

    put / delete / forget / tag  --> queue --> writer thread --> sender thread:
                                   (encoder: the values   per send chunk (at most
                                   of one job, chunk by   batch_pages pages, ~16 MiB):
                                   chunk)                 [SADD ns-index shard values...]
                                                          [SET value NX PX ms, GETRANGE...]

A put's pages are cut into values (offload/valkey/layout.py); each value is
the chunk head (values of several pages) and, per page, its record head
plus the host page itself: no KV byte is copied on the way out. In the
clear, a record head leaves the encoder with its KV checksum still to take:
the connection takes it right before it sends the page
(``LateChecksum``, offload/valkey/nodes.py), so the page is read from memory
once, for the sum, and sent from the processor's cache (summing every page
of a chunk first read each page from memory twice; README, "Shared pool").

``SET NX``: a value already there is kept (another engine wrote the same
pages; its first 8 bytes, read back in the same round trip, say how many
pages it reaches back over, and a value that reaches back over fewer than
this put's is replaced by this one). A value whose page a reader refused
(offload/valkey/reader.py: ``Suspects``) is rewritten (``SET`` without NX).
Each value expires by the put's retention deadline at the latest
(offload/valkey/lifetime/retention.py); a tenant with a byte limit has its
values written by the quota script instead (lifetime/quotas.py).

Index before records: a put's SADDs (and, in its first chunk, its tags:
lifetime/tags.py) open its pipeline, and each value's index set lives on
the value's own node (offload/valkey/layout.py), so a connection lost half
way leaves index entries without values (harmless); a value whose SADD
failed (on the rare set kept on another node) is deleted again, so
forget_namespace and invalidate_tag find every value that stays. Deletes,
forgets and tag invalidations: lifetime/forget.py.

Failures never escape a thread: a pool that is down, a node that is down or
a refused SET (out of memory under ``noeviction``: warned at most once per
30 s) ends a put with the pages stored so far; a forget fails its ticket
(the namespace may still be in the pool). Nothing here raises into the owner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.transfer.workers import DaemonPool
from radixcache.offload.storage import (
    Counters,
    DeleteJob,
    HeldRemovalLog,
    JobWriter,
    PutJob,
    TagJob,
    WriteJob,
)
from radixcache.offload.storage import chunk
from radixcache.offload.storage.kv_checksum import LateChecksum
from radixcache.offload.valkey.layout import Cuts, IndexSets
from radixcache.offload.valkey.lifetime.quotas import QuotaBook, TenantLimits
from radixcache.offload.valkey.lifetime.forget import PoolRemover
from radixcache.offload.valkey.lifetime.tags import TagSets
from radixcache.offload.valkey.link import PoolLink
from radixcache.offload.valkey.nodes import Scattered
from radixcache.offload.valkey.sending import ChunkSender, PutProgress, Run, stop
from radixcache.offload.valkey.lifetime.removals import Suspects, ValueIndex

log = logging.getLogger(__name__)

_AHEAD = 4  # send chunks encoded ahead of the sender at most
# A send chunk holds at most this many KV bytes (and at least one value), so
# that the sender starts on the first chunk while the encoder builds the
# next: 64 sealed pages of 2 MiB in one chunk would be encrypted whole (tens
# of ms) before the first byte went out. Each chunk costs one round trip.
_CHUNK_BYTES = 16 << 20

class PoolWriter(JobWriter):
    """Runs put/delete/forget/tag jobs in order, in two stages::

        queue --> writer thread: a put's values, chunk by chunk (record
                                 heads; sealed, the ciphertexts)
              --> sender thread: every network call, in job order; finishes
                                 the tickets

    so the values of chunk k+1 (or of the next put) are built while chunk k
    is on the wire. At most ``_AHEAD`` chunks wait for the sender.
    """

    def __init__(
        self,
        where: str,
        counters: Counters,
        removals: HeldRemovalLog,
        link: PoolLink,
        *,
        cuts: Cuts,
        values: ValueIndex,
        suspects: Suspects,
        tags: TagSets,
        limits: TenantLimits,
        quotas: QuotaBook,
        check_first: bool,
        after_job: Callable[[], None],
    ) -> None:
        """``tags``: where puts record their tags; ``limits``: the tenants'
        byte limits, kept by ``quotas``; ``check_first``: ask which values
        are there before sending any (ranks that share one copy of every
        page); ``after_job``: called on the sender thread after each job
        (e.g. to refresh size figures)."""
        config = link.config
        self._link = link
        self._held = removals  # removals wait for the puts of their keys
        self._values = values
        self._suspects = suspects
        self._cuts = cuts
        self._check_first = check_first
        self._key_prefix = config.key_prefix  # pool key = key prefix + record key
        sets = IndexSets(config.namespace_shards)
        self._remover = PoolRemover(link, counters, removals, values, sets, tags)
        self._chunks = ChunkSender(
            link, counters, self._remover, sets=sets, tags=tags, limits=limits, quotas=quotas
        )
        self._batch = config.batch_pages  # pages per send chunk at most
        self._seq = time.time_ns() // 1000  # write seq of the next record: ordered across engines
        self._after_job = after_job
        self._ahead = threading.BoundedSemaphore(_AHEAD)
        self._sender = DaemonPool(1, "radixcache-pool-send")
        super().__init__(  # one job per step: a put pipelines its own chunks
            where, counters, removals, merge_pages=1, thread_name="radixcache-pool-write"
        )

    @property
    def unavailable(self) -> int:
        """Jobs cut short because the pool (or a node) was down."""
        return self._chunks.unavailable + self._remover.unavailable

    @property
    def past_deadline(self) -> int:
        """Pages not written: their retention deadline had passed."""
        return self._chunks.past_deadline

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
                self._send(self._after, job, self._remover.delete)
            elif isinstance(job, TagJob):
                self._send(self._after, job, self._remover.invalidate)
            else:
                self._send(self._after, job, self._remover.forget)

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

    def _after(self, job: Any, step: Callable[[Any], None]) -> None:
        """Run ``step(job)`` (a delete, forget or invalidation), then ``_done``."""
        step(job)
        self._done()

    def _fail(self, job: WriteJob, exc: Exception) -> None:
        self._fail_tickets([job], exc)
        if isinstance(job, PutJob):
            self._held.end_put(job.page_keys(), [])

    # -- put ---------------------------------------------------------------------
    def _put(self, job: PutJob) -> None:
        """Encode the job's values here, chunk by chunk; the sender sends them
        and finishes the job."""
        host_bytes = job.host.as_bytes()
        progress = PutProgress(job.page_keys(), (self._seq, self._seq + len(job.keys) - 1))
        page_bytes = max(1, int(host_bytes.shape[1]))
        runs = self._cuts.runs(job.keys, raw=job.tokens is None)
        per_chunk = max(1, min(self._batch, _CHUNK_BYTES // page_bytes))
        rewrite = self._suspects.take(job.keys)
        chunk_runs: list[Run] = []
        pages = 0
        for k, (start, end) in enumerate(runs):
            value = self._encode(job, start, end, host_bytes)
            key = job.keys[end - 1]
            self._values.add(key, job.keys[start:end], job.ns_tag)
            suspect = any(page in rewrite for page in job.keys[start:end])
            chunk_runs.append(Run(start, end, self._key_prefix + key, value, suspect, self._seq - 1))
            pages += end - start
            if pages >= per_chunk or k + 1 == len(runs):
                self._send(self._send_chunk, job, progress, chunk_runs, k + 1 == len(runs))
                chunk_runs, pages = [], 0

    def _encode(
        self, job: PutJob, start: int, end: int, host_bytes: npt.NDArray[np.uint8]
    ) -> Scattered:
        """The value of pages ``start`` to ``end``: the chunk head (several
        pages), then each record framed (or sealed) on its own, as its head
        and body: the host page itself in the clear (never copied; the caller
        leaves it untouched until the ticket is done), sealed its ciphertext."""
        parts: list[bytes | memoryview | LateChecksum] = []
        for i in range(start, end):
            kv = host_bytes[job.host_pages[i]]
            parts += job.late_parts(i, self._seq, kv)  # (head, body): summed as it is sent
            self._seq += 1
        if end - start > 1:  # the chunk head joins the first record head (one small buffer)
            first, head = chunk.chunk_head(end - start), parts[0]
            parts[0] = head.after(first) if isinstance(head, LateChecksum) else first + bytes(head)
        return Scattered(*parts)

    def _send_chunk(
        self, job: PutJob, progress: PutProgress, runs: list[Run], last: bool
    ) -> None:
        if not progress.stopped:
            there = self._chunks.present(runs) if self._check_first else [0] * len(runs)
            self._chunks.store(job, progress, runs, there)
        if last:
            self._counters.add(puts=progress.written, put_skipped=progress.skipped, write_txns=1)
            # what it wrote is on record before the ticket says done, so the
            # engine landing the put knows which pages to announce
            self._held.note_written(progress.wrote)
            job.ticket.finish(progress.stored)
            self._held.end_put(progress.pkeys, progress.pkeys[: progress.stored])
            self._done()

    def _done(self) -> None:
        """After a job, on the sender thread: trim the index, then ``after_job``."""
        self._remover.trim()
        self._after_job()


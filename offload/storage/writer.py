"""The writer thread every backend shares: one queue, one thread, jobs in order.

Every mutation of a store (put, delete, forget, the deletion of a record a
reader found corrupt) is a job on one queue, run by one thread in
submission order::

    owner thread --submit(job)--> queue --> writer thread
                                            takes the first waiting job,
                                            merges what else waits (up to
                                            merge_pages pages) into one step,
                                            runs the step: _run_batch(jobs)

What the base guarantees (the writer thread's contract):

* jobs run in submission order; a step's jobs are those queued at the time;
* every ticket finishes: a step that raises fails the tickets of its jobs
  that are not done yet (a ``StorageError`` naming the backend; warned at
  most once per interval) and the thread carries on with the next step;
  nothing a job does can stop the thread;
* ``close`` runs every job queued before it, then stops the thread.

What a backend supplies (its transport): ``_run_batch``, which runs a
step's jobs against the store, finishes their tickets, and reports the
removals it made to its ``RemovalLog`` after the tickets that stored those
keys finished (see ``removals.py``). ``merge_pages`` says how much it merges:
LMDB merges many jobs into one transaction (one commit, one sync); a pool
runs one job per step and pipelines its chunks itself (``merge_pages=1``).
"""

from __future__ import annotations

import logging
import queue
import threading

from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage.contract import StorageError
from radixcache.offload.storage.jobs import WriteJob, job_pages
from radixcache.offload.storage.removals import RemovalLog
from radixcache.offload.storage.stats import Counters

log = logging.getLogger(__name__)


class JobWriter:
    """Owns the write side of one store, on its own thread (see the module docstring).

    A subclass sets up its transport, then calls ``super().__init__``, which
    starts the thread. ``submit`` and ``queued`` are called by the owner
    thread; ``close`` by the store's ``close``.
    """

    def __init__(
        self,
        where: str,
        counters: Counters,
        removals: RemovalLog,
        *,
        merge_pages: int,
        thread_name: str,
    ) -> None:
        self.where = where  # the store, as messages name it
        self.counters = counters  # the store's counters (its reader adds to them too)
        self._counters = counters
        self._removals = removals
        self._merge_pages = merge_pages  # merge queued jobs into one step up to this many pages
        self._warn = RateLimitedLog(log)  # failed steps repeat under load
        self._queue: queue.SimpleQueue[WriteJob | None] = queue.SimpleQueue()  # None: stop
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Jobs waiting for the writer thread."""
        return self._queue.qsize()

    def submit(self, job: WriteJob) -> None:
        """Queue ``job``; its ticket (if any) finishes once it ran."""
        self._queue.put(job)

    def close(self) -> None:
        """Run every job queued so far, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    # -- the thread -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            size = job_pages(job)
            stop = False
            while size < self._merge_pages:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
                size += job_pages(nxt)
            try:
                self._run_batch(batch)
            except Exception as exc:  # any error fails the step, not the thread
                self._fail_batch(batch, exc)
            if stop:
                return

    def _run_batch(self, batch: list[WriteJob]) -> None:
        """Run ``batch`` against the store and finish its tickets (the backend's transport)."""
        raise NotImplementedError

    def _fail_batch(self, batch: list[WriteJob], exc: Exception) -> None:
        """Fail every unfinished ticket of ``batch`` with a ``StorageError``
        (``exc`` itself when it is one), warn (rate-limited) and count them."""
        error = exc
        if not isinstance(exc, StorageError):
            error = StorageError(f"{self.where} write failed: {exc!r}")
            error.__cause__ = exc
        self._warn.warning("storage write of %d jobs failed: %s", len(batch), error)
        self._counters.add(failed_ops=self._fail_tickets(batch, error))

    @staticmethod
    def _fail_tickets(jobs: list[WriteJob], error: BaseException) -> int:
        """Fail the tickets of ``jobs`` that are not done yet; returns how many."""
        failed = 0
        for job in jobs:
            if job.ticket is not None and not job.ticket.done():
                job.ticket.fail(error)
                failed += 1
        return failed

"""The read path every backend shares: fetch, verify, copy into the destination pages.

    get(keys) --> reader pool (num_readers threads), per read:
                    values = the backend's _values(job)    lazily, in key order
                    for each value, in order:
                        None: a miss, stop
                        verify it and copy its KV bytes into the host page
                        (the job's framing: record.read_into: the key,
                        namespace tag, token ids, lengths, then the checksum
                        of the copy; or, sealed, the same checks and the
                        decryption into the page, authenticated)
                        failed: corrupt, stop
                        unreadable (offload/storage/crypt): stop
                  then: _served(hits) (e.g. recency), queue the deletion of
                  a corrupt record on the writer, count, finish the ticket

A record that cannot be authenticated (sealed under a key this store does
not hold, failing its tag, in the clear where records are sealed) is a miss
counted as ``decrypt_failures``. It is deleted only where ``delete_unreadable``
says the store is this engine's own (LMDB): in a pool shared with other
deployments it may be theirs, written under their keys, and deleting it
would let one misconfigured engine wipe the pool; there it stays until its
TTL (README: "Encryption at rest").

A ticket always finishes. Where the backend says ``helping``, a thread
that waits on a read's ticket without a timeout runs queued reads itself
(``HelpingTicket``, radixcache/transfer/workers.py) while it would block.

What a backend supplies (its transport):

* ``_values(job, host_bytes)``: a generator of the stored values of
  ``job.keys``, in order: ``None`` for a key not stored, else the record
  (``bytes`` or a ``memoryview``, e.g. a zero-copy view of a memory map).
  It runs on a reader thread, and is closed as soon as the read stops, so a
  ``with`` block inside it (a read transaction) lasts exactly as long as
  the values are used. Raising ``StorageUnavailable`` (the store was lost)
  ends the read short: the pages served so far, a miss for the rest.
* optionally ``_verify`` (a backend that receives the KV bytes straight into
  the host page verifies them there), ``_served`` (hits, e.g. to touch a
  recency index), ``_refused`` (a record that failed verification: by
  default its deletion is queued on the writer) and ``_read_failed`` (what any other error means: by
  default the ticket fails with a ``StorageError``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator

import numpy as np
import numpy.typing as npt

from radixcache.transfer.ticket import FutureTicket
from radixcache.transfer.workers import DaemonPool, HelpingTicket
from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage.contract import StorageError, StorageUnavailable
from radixcache.offload.storage.crypt.codec import Unreadable
from radixcache.offload.storage.jobs import DeleteJob, ReadJob
from radixcache.offload.storage.writer import JobWriter

log = logging.getLogger(__name__)

StoredValue = bytes | memoryview | None  # a record as the transport returns it; None: not stored
Page = npt.NDArray[np.uint8]  # one host page's bytes


class PageReader:
    """Serves ``get`` on ``num_readers`` threads (see the module docstring)."""

    # Delete records that cannot be authenticated: True only for a store that
    # is this engine's alone (see the module docstring).
    delete_unreadable = False
    # A thread waiting on a read's ticket (without a timeout) runs queued
    # reads itself (``HelpingTicket``): for a transport whose reads any
    # thread may do, with nothing kept per reader thread (LMDB's map).
    helping = False

    def __init__(self, writer: JobWriter, *, num_readers: int, thread_name: str) -> None:
        self._writer = writer  # deletes records that fail verification
        self._where = writer.where  # the store, for messages
        self._counters = writer.counters  # the store's counters
        self._pool = DaemonPool(num_readers, thread_name)
        self.unavailable = 0  # reads cut short because the store was unreachable
        self._warn = RateLimitedLog(log)  # unreadable records repeat under load

    def ticket(self) -> FutureTicket:
        """A new read's ticket (see ``helping``)."""
        return HelpingTicket(self._pool) if self.helping else FutureTicket()

    def submit(self, job: ReadJob) -> None:
        """Read ``job`` on a pool thread; its ticket gets the leading pages served."""
        self._pool.submit(self._read, job)

    def close(self) -> None:
        """Finish every submitted read, then stop the threads."""
        self._pool.shutdown(wait=True)

    # -- the transport (a backend's) ---------------------------------------------
    def _values(
        self, job: ReadJob, host_bytes: npt.NDArray[np.uint8]
    ) -> Generator[StoredValue, None, None]:
        """The stored values of ``job.keys``, in order (see the module docstring)."""
        raise NotImplementedError

    def _verify(self, value: StoredValue, dst: Page, job: ReadJob, i: int) -> bool:
        """Verify ``value``, the record of ``job``'s page ``i`` (its key, the
        namespace tag, its token ids, the lengths), and copy its KV bytes into
        ``dst``, the host page, checking the checksum of that copy."""
        return isinstance(value, (bytes, memoryview)) and job.framing.read_into(
            value, key=job.keys[i], ns_tag=job.ns_tag, tokens=job.token_row(i), dst=dst
        )

    def _served(self, keys: list[bytes]) -> None:
        """The records of ``keys`` (record keys) were served: a hook, e.g. for recency."""

    def _refused(self, job: ReadJob, i: int) -> None:
        """Page ``i`` of ``job`` failed verification: delete its record (on the
        writer, after the reads before it). A backend that keeps several pages
        in one value deletes that value, and may note what else the failure
        puts in doubt (e.g. to rewrite it on the next put)."""
        key = job.keys[i]
        log.warning("%s: record %s failed verification; deleting it", self._where, key.hex())
        self._writer.submit(DeleteJob([key], None))

    def _read_failed(self, job: ReadJob, exc: Exception) -> None:
        """A read raised ``exc`` (not ``StorageUnavailable``): fail its ticket."""
        job.ticket.fail(StorageError(f"{self._where} read failed: {exc!r}"))

    # -- the shared path ---------------------------------------------------------
    def _read(self, job: ReadJob) -> None:
        # Whatever escapes the read or its hooks, the ticket ends: nothing
        # waits on it forever.
        try:
            self._read_job(job)
        except Exception as exc:  # nothing escapes the thread: the backend says what it means
            if not job.ticket.done():
                self._counters.add(failed_ops=1)
                self._read_failed(job, exc)
        except BaseException:  # an interrupt on a thread that helps: it goes on to that thread
            if not job.ticket.done():
                self._counters.add(failed_ops=1)
                job.ticket.fail(StorageError(f"{self._where} read interrupted"))
            raise

    def _read_job(self, job: ReadJob) -> None:
        n = len(job.keys)
        try:
            served, corrupt, unreadable = self._read_pages(job)
        except _ShortRead as cut:  # those pages were read and verified
            self.unavailable += 1
            self._counters.add(failed_ops=1, hits=cut.served, misses=n - cut.served)
            job.ticket.finish(cut.served)
            return
        if served:
            self._served(job.keys[:served])
        if corrupt is not None:  # its removal is published once the delete ran
            self._refused(job, corrupt)
        if unreadable is not None:
            self._unreadable(job.keys[served], unreadable)
        self._counters.add(
            hits=served, misses=n - served, corrupt=corrupt is not None,
            decrypt_failures=unreadable is not None,
        )  # fmt: skip
        job.ticket.finish(served)

    def _unreadable(self, key: bytes, why: Unreadable) -> None:
        """Record ``key`` could not be authenticated (``why``): warn, rate-limited,
        and delete it where the store is this engine's alone."""
        keep = "deleting it" if self.delete_unreadable else "leaving it (a shared store)"
        self._warn.warning("%s: record %s unreadable (%s); %s", self._where, key.hex(), why, keep)
        if self.delete_unreadable:
            self._writer.submit(DeleteJob([key], None))

    def _read_pages(self, job: ReadJob) -> tuple[int, int | None, Unreadable | None]:
        """Returns (leading pages served, index of a record that failed its
        checks, why the record after them could not be authenticated). Raises
        ``_ShortRead`` when the transport lost the store."""
        host_bytes = job.host.as_bytes()
        pages = job.host_pages
        served = 0
        values = self._values(job, host_bytes)
        try:
            for value in values:
                if value is None:  # not stored (evicted, expired, never written)
                    return served, None, None
                if not self._verify(value, host_bytes[pages[served]], job, served):
                    return served, served, None
                served += 1
        except Unreadable as why:
            return served, None, why
        except StorageUnavailable as exc:
            raise _ShortRead(served) from exc
        finally:
            values.close()  # ends the transport's hold (e.g. its read transaction)
        return served, None, None


class _ShortRead(StorageUnavailable):
    """The store went away after ``served`` leading pages were read."""

    def __init__(self, served: int) -> None:
        super().__init__(f"store lost after {served} pages")
        self.served = served

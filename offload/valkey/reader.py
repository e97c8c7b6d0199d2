"""The pool's read transport: GETs received straight into host pages, the next batch meanwhile.

    get --> PageReader (offload/storage/reader.py), on a reader thread:
              _values: per batch, one round trip of GETs whose records land in
              the host pages (offload/valkey/bulk.py; the next batch is fetched
              on the fetch pool meanwhile); then, page by page in order, the
              head of the record that holds it, which the base verifies with
              the KV bytes already in place, stopping at the first miss

Which keys to GET: a value is stored under the key of its last page
(offload/valkey/layout.py), so the reader asks for the keys where the last
lookup of this prefix found values (``ReadHints``), or, without one, for
every key (a key with no value costs a short reply). A page belongs to the
first value read that holds it; a copy in a later, overlapping value is
dropped unread into scratch memory, so a verified page is never written again.

A page no value holds is a miss, unless a reply that could have held it was
"not now" (a node down, loading, moved): then ``PoolUnavailable``, which the
base turns into a short read. A record that fails verification (or a value
that is no record) is refused: its whole value is deleted, and the pages
after it in this read are noted as suspect, so that the next put of them
rewrites their values instead of keeping them (``Suspects``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.transfer.workers import DaemonPool
from radixcache.offload.storage import DeleteJob, JobWriter, PageReader, ReadJob, StoredValue
from radixcache.offload.storage.reader import Page
from radixcache.offload.valkey.bulk import SHORT, Destination, ErrorReply, Value
from radixcache.offload.valkey.layout import Cuts, next_boundaries
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable
from radixcache.offload.valkey.writer import Suspects

log = logging.getLogger(__name__)

_HINTS = 256  # lookups remembered for the reads that follow them


class ReadHints:
    """Where the last lookups found values, per prefix, for the reads that
    follow them (owner thread writes, reader threads read; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[bytes, tuple[list[bytes], list[int]]] = OrderedDict()

    def note(self, rkeys: list[bytes], counts: Sequence[int]) -> None:
        """A lookup of ``rkeys`` found values of ``counts[i]`` records under key i."""
        if not rkeys:
            return
        with self._lock:
            self._seen[rkeys[0]] = (rkeys, list(counts))
            self._seen.move_to_end(rkeys[0])
            while len(self._seen) > _HINTS:
                self._seen.popitem(last=False)

    def clear(self) -> None:
        """Forget every lookup (a put of this process may have moved values)."""
        with self._lock:
            self._seen.clear()

    def ends(self, rkeys: list[bytes]) -> list[int] | None:
        """Positions of ``rkeys`` holding values, if a lookup of this prefix
        (the same first and ``len(rkeys)``-th key: chained keys bind all
        between) saw them; else None."""
        with self._lock:
            seen = self._seen.get(rkeys[0])
        if seen is None or len(seen[0]) < len(rkeys) or seen[0][len(rkeys) - 1] != rkeys[-1]:
            return None
        counts = seen[1]
        ends = [j for j in range(min(len(rkeys), len(counts))) if counts[j] > 0]
        return ends if ends and ends[-1] == len(rkeys) - 1 else None


class _Plan:
    """One read's bookkeeping: which value holds each page, and its head."""

    def __init__(self, job: ReadJob, host_bytes: npt.NDArray[np.uint8], cuts: Cuts) -> None:
        n = len(job.keys)
        self.n = n
        self.host_bytes = host_bytes
        self.pages = job.host_pages
        self.page_bytes = int(host_bytes.shape[1])
        self.nxt = next_boundaries(cuts.flags(job.keys) if job.tokens is not None else [True] * n)
        self.owner = [-1] * n  # position of the value holding page p
        self.heads: list[bytes | None] = [None] * n
        self.placed: dict[tuple[int, int], int] = {}  # (value position, record) -> page
        self.unavailable: list[int] = []  # positions whose reply was "not now"
        self._lock = threading.Lock()  # a fetch thread places while the reader files

    def dest(self, j: int) -> Destination:
        """Where the records of the value under key ``j`` go."""

        def place(count: int, r: int, kv_bytes: int) -> memoryview | None:
            p = j - count + 1 + r
            if not (0 <= p < self.n and kv_bytes == self.page_bytes):
                return None
            with self._lock:
                if self.owner[p] >= 0:
                    return None  # held by a value read before: never written twice
                self.owner[p] = j
                self.placed[(j, r)] = p
            return memoryview(self.host_bytes[self.pages[p]])

        return place

    def take(self, j: int, reply: Any) -> None:
        """File the reply to the GET of key ``j``."""
        if isinstance(reply, PoolUnavailable):
            self.unavailable.append(j)
            return
        if reply is None:
            return
        value = reply if isinstance(reply, Value) else Value(1, [SHORT])  # ErrorReply: no record
        with self._lock:
            for r, head in enumerate(value.heads):
                p = self.placed.pop((j, r), None)
                if p is not None:
                    self.heads[p] = head
                    continue
                p = j - value.records + 1 + r
                if head is SHORT and 0 <= p < self.n and self.owner[p] < 0:
                    self.owner[p] = j  # an unreadable record where this page should be: refused
                    self.heads[p] = SHORT

    def decided(self, p: int, fetched_to: int) -> bool:
        """Whether page ``p`` is settled with the replies filed so far (keys
        before ``fetched_to``): its record is filed, or no later key can hold
        it. (The fetch of the next batch places pages as it parses them:
        ``owner`` alone may be ahead of the filed replies.)"""
        return self.heads[p] is not None or self.nxt[p] < fetched_to or fetched_to >= self.n

    def lost_to_unavailable(self, p: int) -> bool:
        """Whether a reply that could have held page ``p`` was "not now"."""
        last = min(self.nxt[p], self.n - 1)
        return any(p <= j <= last for j in self.unavailable)


class PoolReader(PageReader):
    """Serves ``get`` on ``num_readers`` threads from the pool (see the module docstring)."""

    def __init__(
        self, link: PoolLink, writer: JobWriter, cuts: Cuts, hints: ReadHints, suspects: Suspects
    ) -> None:
        config = link.config
        super().__init__(writer, num_readers=config.num_readers, thread_name="radixcache-pool-read")
        self._key_prefix = config.key_prefix  # pool key = key prefix + record key
        self._link = link
        self._cuts = cuts
        self._hints = hints
        self._suspects = suspects
        self._batch = config.batch_pages  # pages per round trip (about)
        self._fetcher = DaemonPool(config.num_readers, "radixcache-pool-fetch")

    def close(self) -> None:
        super().close()
        self._fetcher.shutdown(wait=True)

    def _read_failed(self, job: ReadJob, exc: Exception) -> None:
        """A bug must not hang the ticket: a miss, logged."""
        log.exception("pool read failed", exc_info=exc)
        self._counters.add(misses=len(job.keys))
        job.ticket.finish(0)

    def _batches(self, job: ReadJob) -> list[list[int]]:
        """The key positions to GET, in batches of about ``batch_pages`` pages."""
        n = len(job.keys)
        ends = self._hints.ends(job.keys) if job.tokens is not None else None
        wanted = ends if ends is not None else list(range(n))
        out: list[list[int]] = []
        batch: list[int] = []
        covered = 0
        for j in wanted:
            batch.append(j)
            if j + 1 - covered >= self._batch:
                out.append(batch)
                batch, covered = [], j + 1
        if batch:
            out.append(batch)
        return out

    def _values(
        self, job: ReadJob, host_bytes: npt.NDArray[np.uint8]
    ) -> Generator[StoredValue, None, None]:
        """The head of each page's record, in order, its KV bytes in place."""
        plan = _Plan(job, host_bytes, self._cuts)
        job.note = plan
        batches = self._batches(job)
        nxt = self._fetch_async(job, plan, batches[0], background=len(batches) > 1)
        try:
            p = 0
            for k, batch in enumerate(batches):
                replies = nxt.result()
                if k + 1 < len(batches):
                    nxt = self._fetch_async(job, plan, batches[k + 1], background=True)
                for j, reply in zip(batch, replies):
                    plan.take(j, reply)
                fetched_to = batch[-1] + 1 if k + 1 < len(batches) else plan.n
                while p < plan.n and plan.decided(p, fetched_to):
                    if plan.heads[p] is None:
                        if plan.lost_to_unavailable(p):
                            raise PoolUnavailable(f"page {p} of a read: its node did not answer")
                        yield None
                        return
                    yield plan.heads[p]
                    p += 1
        finally:
            # a fetch still running writes into this read's host pages: the
            # ticket must not finish (and the caller reuse them) before it ends
            try:
                nxt.result()
            except Exception:  # its pages are not served anyway
                pass

    def _fetch(self, job: ReadJob, plan: _Plan, batch: list[int]) -> list[Any]:
        keys = [self._key_prefix + job.keys[j] for j in batch]
        pages = min(batch[-1] + 1 - batch[0] + self._cuts.cap, plan.n)
        return self._link.get_into(
            keys, lambda i: plan.dest(batch[i]), nbytes=pages * plan.page_bytes
        )

    def _fetch_async(
        self, job: ReadJob, plan: _Plan, batch: list[int], *, background: bool
    ) -> Future[list[Any]]:
        """``_fetch`` one batch: on the fetch pool, or here when nothing can overlap it."""
        fetch = partial(self._fetch, job, plan, batch)
        if background:
            return self._fetcher.submit(fetch)
        done: Future[list[Any]] = Future()
        done.set_result(fetch())
        return done

    def _verify(self, value: StoredValue, dst: Page, job: ReadJob, i: int) -> bool:
        """Verify a record read as its head ``value`` plus its last bytes,
        already in ``dst`` (the job's framing: in the clear or sealed)."""
        assert value is not None, "a missing record is a miss, not a value to verify"
        return job.framing.verify_parts(
            value, dst, key=job.keys[i], ns_tag=job.ns_tag, tokens=job.token_row(i)
        )

    def _refused(self, job: ReadJob, i: int) -> None:
        """Delete the value holding page ``i``; the pages from ``i`` on are suspect."""
        plan = job.note
        j = plan.owner[i] if isinstance(plan, _Plan) and plan.owner[i] >= 0 else i
        log.warning(
            "%s: the record of page %d failed verification; deleting its value %s",
            self._where, i, job.keys[j].hex(),
        )  # fmt: skip
        self._suspects.add(job.keys[i:])
        self._writer.submit(DeleteJob([job.keys[j]], None))

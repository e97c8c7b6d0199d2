"""The offload controller: in-flight tier jobs, harvested on the owner thread.

The controller submits page moves to the copy engine (device <-> host) and to
storage (host <-> LMDB), keeps every job in flight in submission order, and
hands finished ones back from ``poll()``. It knows nothing of the tree: each
job carries its ``owner``, the caller's object that applies the result
(residency, locks, events) in ``owner.finish(ok)``; the controller never
calls it. Nothing here runs on another thread except what the copy engine
and the storage backend run themselves.

Submitting never raises for a failing tier: a copy engine or a storage
backend that raises when a move is handed to it (closed, broken, a
connection down) gives a job whose ticket has already failed with that
error, harvested by the next ``poll()`` like any failed move. The caller
takes its holds before submitting and releases them in ``finish``, so one
path handles every failure.
"""

from __future__ import annotations

import bisect
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from radixcache.offload.host import HostPool
from radixcache.offload.storage import PutMeta, Storage, TokenPages
from radixcache.transfer.allocator import PageIds
from radixcache.transfer.engine import CopyEngine
from radixcache.transfer.ticket import FutureTicket, Ticket


class JobKind(enum.Enum):
    BACKUP = "device_to_host"  # device pages copied into host pages
    LOAD = "host_to_device"  # host pages copied into device pages
    STORE = "host_to_storage"  # host pages written to storage
    FETCH = "storage_to_host"  # storage records read into host pages


class JobOwner(Protocol):
    """Who submitted a move and applies its result, on the owner thread."""

    def finish(self, ok: bool) -> None:
        """The move is done (``ok``: it succeeded); apply it, release its holds."""
        ...


@dataclass(slots=True, eq=False)
class Job:
    """One submitted move. The owner reads it; the controller completes it."""

    kind: JobKind  # what moves where
    ticket: Ticket  # the engine's or storage's handle
    owner: JobOwner  # applies the result when the move is harvested
    host_pages: PageIds  # host pages written (BACKUP, FETCH) or read (LOAD, STORE)
    device_pages: PageIds | None = None  # device pages read (BACKUP) or written (LOAD)
    keys: Sequence[bytes] = ()  # page keys (STORE, FETCH)
    submitted: float = field(default_factory=time.perf_counter)

    @property
    def ok(self) -> bool:
        return self.ticket.done() and self.ticket.error is None

    @property
    def num_pages(self) -> int:
        return int(self.host_pages.size)


# Upper bounds (seconds) of the job-latency buckets; a last bucket takes the rest.
LATENCY_BOUNDS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class LatencyHistogram:
    """Latencies of succeeded jobs (submission to harvest) in fixed buckets:
    ``counts[i]`` jobs took at most ``LATENCY_BOUNDS_S[i]`` and more than the
    bound before it; ``counts[-1]`` took longer than the last bound."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_S) + 1))
    total_s: float = 0.0  # summed latency

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BOUNDS_S, seconds)] += 1
        self.total_s += seconds

    def copy(self) -> LatencyHistogram:
        return LatencyHistogram(list(self.counts), self.total_s)


@dataclass(slots=True)
class TransferCounters:
    """Pages and bytes moved per direction, failures, busy time."""

    pages: dict[JobKind, int] = field(default_factory=lambda: dict.fromkeys(JobKind, 0))
    bytes: dict[JobKind, int] = field(default_factory=lambda: dict.fromkeys(JobKind, 0))
    seconds: dict[JobKind, float] = field(default_factory=lambda: dict.fromkeys(JobKind, 0.0))
    failed: dict[JobKind, int] = field(default_factory=lambda: dict.fromkeys(JobKind, 0))
    latency: dict[JobKind, LatencyHistogram] = field(
        default_factory=lambda: {k: LatencyHistogram() for k in JobKind}
    )

    def bytes_per_second(self, kind: JobKind) -> float:
        """Bytes moved per second of job latency (submission to harvest)."""
        s = self.seconds[kind]
        return self.bytes[kind] / s if s else 0.0


class OffloadController:
    """Submits tier jobs and returns them, finished, in submission order."""

    def __init__(self, copy: CopyEngine, host: HostPool, storage: Storage, page_bytes: int) -> None:
        self.copy = copy
        self.host = host
        self.storage = storage
        self.page_bytes = page_bytes
        self.counters = TransferCounters()
        self._jobs: list[Job] = []  # in flight, oldest first

    # ------------------------------------------------------------------ submit
    def backup(self, device_pages: PageIds, host_pages: PageIds, owner: JobOwner) -> Job:
        """Copy device pages into (already allocated) host pages."""
        try:
            ticket: Ticket = self.copy.device_to_host(device_pages, host_pages)
        except Exception as exc:  # a failed submission is a failed job
            ticket = FutureTicket.failed(exc)
        return self._add(Job(JobKind.BACKUP, ticket, owner, host_pages, device_pages))

    def backup_now(self, device_pages: PageIds, host_pages: PageIds) -> bool:
        """Copy device pages into host pages and wait for it (eviction under
        write-back). True if the copy succeeded; never raises for a failed copy."""
        submitted = time.perf_counter()
        try:
            ticket: Ticket = self.copy.device_to_host(device_pages, host_pages)
        except Exception as exc:
            ticket = FutureTicket.failed(exc)
        ticket.wait()
        c = self.counters
        if ticket.error is not None:
            c.failed[JobKind.BACKUP] += 1
            return False
        n = int(host_pages.size)
        c.pages[JobKind.BACKUP] += n
        c.bytes[JobKind.BACKUP] += n * self.page_bytes
        elapsed = time.perf_counter() - submitted
        c.seconds[JobKind.BACKUP] += elapsed
        c.latency[JobKind.BACKUP].observe(elapsed)
        return True

    def load(self, host_pages: PageIds, device_pages: PageIds, owner: JobOwner) -> Job:
        """Copy host pages into (already allocated) device pages."""
        try:
            ticket: Ticket = self.copy.host_to_device(host_pages, device_pages)
        except Exception as exc:
            ticket = FutureTicket.failed(exc)
        return self._add(Job(JobKind.LOAD, ticket, owner, host_pages, device_pages))

    def store(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages,
        host_pages: PageIds,
        namespace: bytes,
        owner: JobOwner,
        meta: PutMeta | None = None,
        tenant: bytes | None = None,
    ) -> Job:
        """Write host pages to storage under ``keys`` (``meta``: their event
        ids, parent and depth, recorded for the survivors announced at start;
        ``tenant``: whose key seals them where storage encrypts at rest)."""
        try:
            ticket: Ticket = self.storage.put(
                keys, tokens, self.host.buffer, host_pages, namespace, meta, tenant=tenant
            )
        except Exception as exc:
            ticket = FutureTicket.failed(exc)
        return self._add(Job(JobKind.STORE, ticket, owner, host_pages, keys=keys))

    def fetch(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages,
        host_pages: PageIds,
        namespace: bytes,
        owner: JobOwner,
        tenant: bytes | None = None,
    ) -> Job:
        """Read stored pages of ``namespace`` (of ``tenant``: see ``store``)
        into (already allocated) host pages; the result is how many leading
        pages arrived verified."""
        try:
            ticket: Ticket = self.storage.get(
                keys, tokens, self.host.buffer, host_pages, namespace, tenant=tenant
            )
        except Exception as exc:
            ticket = FutureTicket.failed(exc)
        return self._add(Job(JobKind.FETCH, ticket, owner, host_pages, keys=keys))

    def _add(self, job: Job) -> Job:
        self._jobs.append(job)
        return job

    # ------------------------------------------------------------------ harvest
    def poll(self) -> list[Job]:
        """Finished jobs (succeeded or failed), in submission order; never blocks."""
        if not self._jobs:
            return []
        done: list[Job] = []
        waiting: list[Job] = []
        for job in self._jobs:  # one done() check per job: no job is lost in a race
            (done if job.ticket.done() else waiting).append(job)
        if done:
            self._jobs = waiting
            now = time.perf_counter()
            c = self.counters
            for job in done:
                if job.ticket.error is not None:
                    c.failed[job.kind] += 1
                    continue
                pages = job.num_pages
                if job.kind in (JobKind.FETCH, JobKind.STORE):  # pages read / committed
                    pages = int(job.ticket.result())
                c.pages[job.kind] += pages
                c.bytes[job.kind] += pages * self.page_bytes
                c.seconds[job.kind] += now - job.submitted
                c.latency[job.kind].observe(now - job.submitted)
        return done

    def wait(self, job: Job, timeout: float | None = None) -> bool:
        """Block until ``job`` finished or ``timeout`` seconds passed; True if done."""
        return job.ticket.wait(timeout)

    def wait_all(self, timeout: float | None = None) -> bool:
        """Block until every job in flight finished; True if all did in time."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        for job in list(self._jobs):
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            if not job.ticket.wait(left):
                return False
        return True

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def in_flight_of(self, kind: JobKind) -> int:
        return sum(1 for job in self._jobs if job.kind is kind)

    def jobs(self) -> list[Job]:
        """Jobs in flight, oldest first (for integrity checks)."""
        return list(self._jobs)

    def pages_in_flight(self) -> tuple[PageIds, PageIds]:
        """(device, host) page ids that in-flight jobs read or write."""
        dev = [j.device_pages for j in self._jobs if j.device_pages is not None]
        host = [j.host_pages for j in self._jobs]
        empty = np.empty(0, dtype=np.int32)
        return (np.concatenate(dev) if dev else empty, np.concatenate(host) if host else empty)

    def close(self) -> None:
        """Finish everything in flight and stop the engines' threads (the
        storage is closed even if closing the copy engine raised)."""
        self.wait_all()
        try:
            self.copy.close()
        finally:
            self.storage.close()

"""``CpuCopyEngine``: the copy engine contract (``transfer.contract``) on one
worker thread, strictly in submission order, both directions through one
queue: a copy observes every copy submitted before it, and tickets complete in
submission order. ``make_copy_engine`` picks it or ``CudaCopyEngine``.

Small copies skip the thread: a copy of at most ``inline_bytes`` (default
``INLINE_BYTES``) submitted while no earlier copy is queued or running runs
at once on the caller's thread, and its ticket is done when the call returns.
Handing a copy to the worker and back costs two thread wake-ups (tens of
microseconds on an idle machine, milliseconds on a loaded one), more than
copying 256 KiB; the order above still holds, since nothing is in flight.
"""

from __future__ import annotations

import logging
import os
import queue
import threading


import numpy.typing as npt

from radixcache.transfer.contract import (
    CopyEngine,
    CopyRequest,
    Direction,
    FaultHook,
    check_device_to_host,
    check_host_to_device,
)
from radixcache.transfer.convert import (
    PagePairs,
    PageViews,
    check_buffers,
    copy_device_to_host,
    copy_host_to_device,
    copy_small,
)
from radixcache.transfer.forks import forked_message, on_fork_in_child
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer
from radixcache.transfer.ticket import FutureTicket

__all__ = [
    "CopyEngine",
    "CopyRequest",
    "CpuCopyEngine",
    "Direction",
    "check_device_to_host",
    "check_host_to_device",
    "make_copy_engine",
]

log = logging.getLogger(__name__)


_STOP = None  # queue sentinel: the worker exits when it dequeues this
INLINE_BYTES = 256 * 1024  # copies up to this size run on the caller's thread when idle


class CpuCopyEngine:
    """A ``CopyEngine`` for a device buffer on the CPU: one worker thread.

    Ownership: the worker thread writes only the destination pages of the copy
    it is running; everything else (the queue, ``_seq``, ``_closed``) belongs to
    the owner thread. Tickets are ``FutureTicket``s finished by the worker.

    ``before_copy`` is a fault-injection seam for tests: it is called on the
    worker with each ``CopyRequest`` before the copy; if it raises, that copy's
    ticket fails with the exception and the pages are left untouched. With a
    hook, every copy goes through the worker (a test may hold it there).
    ``inline_bytes``: the largest copy run on the caller's thread when nothing
    is in flight (0: none; see the module docstring).

    In a child forked from the process that built it the worker does not
    exist: a submission there raises RuntimeError (instead of handing out a
    ticket that never finishes) and ``close`` does nothing.
    """

    def __init__(
        self,
        device_buf: DeviceKVBuffer,
        host_buf: HostKVBuffer,
        *,
        before_copy: FaultHook | None = None,
        name: str = "kv-copy",
        inline_bytes: int = INLINE_BYTES,
    ) -> None:
        check_buffers(device_buf, host_buf)
        if device_buf.device.type != "cpu":
            raise ValueError(
                f"CpuCopyEngine needs a device buffer on the cpu, got {device_buf.device}; "
                "use make_copy_engine() to get the CUDA engine"
            )
        self._device = device_buf  # written by the worker (host_to_device)
        self._host = host_buf  # written by the worker (device_to_host)
        self._views = PageViews.of(device_buf, host_buf)  # for small copies
        self._before_copy = before_copy  # test seam, or None
        # pages per copy that may run inline (none with a fault hook)
        self._inline_pages = 0 if before_copy else inline_bytes // device_buf.spec.page_bytes
        self._last: FutureTicket | None = None  # ticket of the last copy queued
        self._queue: queue.SimpleQueue[tuple[CopyRequest, FutureTicket] | None] = (
            queue.SimpleQueue()
        )
        self._seq = 0  # next submission number
        self._closed = False
        self._pid = os.getpid()  # the process whose worker runs the copies
        self._forked = False  # set in a forked child (see radixcache.transfer.forks)
        on_fork_in_child(self, _forked)
        self._worker = threading.Thread(target=self._run, name=name, daemon=True)
        self._worker.start()

    # -- owner side --------------------------------------------------------
    def device_to_host(
        self, device_pages: npt.ArrayLike, host_pages: npt.ArrayLike
    ) -> FutureTicket:
        pairs = check_device_to_host(self._device, self._host, device_pages, host_pages)
        return self._submit(Direction.DEVICE_TO_HOST, pairs)

    def host_to_device(
        self, host_pages: npt.ArrayLike, device_pages: npt.ArrayLike
    ) -> FutureTicket:
        pairs = check_host_to_device(self._device, self._host, host_pages, device_pages)
        return self._submit(Direction.HOST_TO_DEVICE, pairs)

    def close(self) -> None:
        """Run every copy already submitted, then stop the worker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._forked:
            return  # the worker is the parent's
        self._queue.put(_STOP)
        self._worker.join()

    def __enter__(self) -> CpuCopyEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, direction: Direction, pairs: PagePairs) -> FutureTicket:
        if self._closed:
            raise RuntimeError("copy engine is closed")
        if self._forked:
            raise RuntimeError(forked_message("this copy engine", self._pid))
        ticket = FutureTicket()
        request = CopyRequest(self._seq, direction, pairs)
        self._seq += 1
        last = self._last
        # Tickets finish in order: the last one done means the worker is idle.
        if len(pairs) <= self._inline_pages and (last is None or last.done()):
            try:
                self._copy(request, ticket)
            except BaseException as exc:  # an interrupt on the caller's thread (Ctrl-C)
                if not ticket.done():  # fails the ticket: a drain never waits for it
                    ticket.fail(exc)
                raise
        else:
            self._queue.put((request, ticket))
            self._last = ticket
        return ticket

    # -- worker side -------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            assert job is not None
            request, ticket = job
            try:
                self._copy(request, ticket)
            except BaseException as exc:  # (an interrupt) fails its ticket, never the worker
                ticket.fail(exc)

    def _copy(self, request: CopyRequest, ticket: FutureTicket) -> None:
        """Run one copy and finish its ticket (on the worker, or inline)."""
        try:
            if self._before_copy is not None:
                self._before_copy(request)
            views, pairs = self._views, request.pairs
            to_host = request.direction is Direction.DEVICE_TO_HOST
            if views.small(pairs):  # one fancy copy per view, no plan
                src, dst = (views.device, views.host) if to_host else (views.host, views.device)
                copy_small(src, dst, pairs)
            elif to_host:
                copy_device_to_host(self._device, self._host, pairs)
            else:
                copy_host_to_device(self._host, self._device, pairs)
        except Exception as exc:  # a failed copy fails its ticket, nothing else
            log.warning("copy #%d (%s) failed: %r", request.seq, request.direction.value, exc)
            ticket.fail(exc)
        else:
            ticket.finish(None)


def _forked(engine: CpuCopyEngine) -> None:
    engine._forked = True


def make_copy_engine(device_buf: DeviceKVBuffer, host_buf: HostKVBuffer) -> CopyEngine:
    """The CUDA engine when ``device_buf`` lives on a GPU, else the CPU engine."""
    if device_buf.device.type == "cuda":
        from radixcache.transfer.cuda_engine import CudaCopyEngine

        return CudaCopyEngine(device_buf, host_buf)
    return CpuCopyEngine(device_buf, host_buf)

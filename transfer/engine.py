"""Copy engines: asynchronous page copies between the device and host buffers.

The contract (``CopyEngine``) is the same on CPU and GPU:

* ``device_to_host`` / ``host_to_device`` validate their arguments on the
  caller's thread (ValueError naming the problem), queue the copy and return a
  ``Ticket`` at once; they never wait for a copy.
* The caller (the owner thread) must leave the pages named in a copy alone
  until its ticket is done: no writing the source pages, no reading or writing
  the destination pages, no freeing either. The engine mutates only the
  destination pages of each copy.
* A copy that fails fails its own ticket (``error`` set, ``done()`` True); the
  engine keeps going. A failed copy may have written part of its destination
  pages: treat them as garbage (never mark them resident).
* ``close()`` lets every queued copy finish, then releases the engine. Submit
  and close are called from the owner thread only.

``CpuCopyEngine`` (this module) runs copies on one worker thread, strictly in
submission order, both directions through one queue: a copy observes every
copy submitted before it, and tickets complete in submission order.
``CudaCopyEngine`` (``transfer.cuda_engine``) documents its own ordering.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy.typing as npt

from transfer.convert import (
    PagePairs,
    check_buffers,
    copy_device_to_host,
    copy_host_to_device,
)
from transfer.host import HostKVBuffer
from transfer.layout import DeviceKVBuffer
from transfer.ticket import FutureTicket, Ticket

log = logging.getLogger(__name__)


class CopyEngine(Protocol):
    """Moves whole pages between one device buffer and one host buffer."""

    def device_to_host(self, device_pages: npt.ArrayLike, host_pages: npt.ArrayLike) -> Ticket:
        """Copy device page ``device_pages[i]`` to host page ``host_pages[i]``, for all i.

        Both are 1-D integer arrays of equal length; host pages are distinct.
        Returns at once; the ticket is done when the host pages hold the data.
        """
        ...

    def host_to_device(self, host_pages: npt.ArrayLike, device_pages: npt.ArrayLike) -> Ticket:
        """Copy host page ``host_pages[i]`` to device page ``device_pages[i]``, for all i.

        Both are 1-D integer arrays of equal length; device pages are distinct.
        Returns at once; the ticket is done when the device pages hold the data.
        """
        ...

    def close(self) -> None:
        """Finish every queued copy, then release threads/streams. Idempotent."""
        ...


class Direction(enum.Enum):
    DEVICE_TO_HOST = "device_to_host"
    HOST_TO_DEVICE = "host_to_device"


@dataclass(frozen=True, slots=True)
class CopyRequest:
    """One submitted copy, as the worker (and a fault hook) sees it."""

    seq: int  # submission number within this engine, from 0
    direction: Direction  # which way the bytes go
    pairs: PagePairs  # src/dst page ids in the direction's sense


# Called on the worker thread just before a copy runs; raising fails that copy.
FaultHook = Callable[[CopyRequest], None]


def check_device_to_host(
    device: DeviceKVBuffer,
    host: HostKVBuffer,
    device_pages: npt.ArrayLike,
    host_pages: npt.ArrayLike,
) -> PagePairs:
    """Validated pairs for a device-to-host copy (ValueError on bad input)."""
    return PagePairs.check(
        device_pages, host_pages,
        src_name="device_pages", src_limit=device.num_pages,
        dst_name="host_pages", dst_limit=host.num_pages,
    )  # fmt: skip


def check_host_to_device(
    device: DeviceKVBuffer,
    host: HostKVBuffer,
    host_pages: npt.ArrayLike,
    device_pages: npt.ArrayLike,
) -> PagePairs:
    """Validated pairs for a host-to-device copy (ValueError on bad input)."""
    return PagePairs.check(
        host_pages, device_pages,
        src_name="host_pages", src_limit=host.num_pages,
        dst_name="device_pages", dst_limit=device.num_pages,
    )  # fmt: skip


_STOP = None  # queue sentinel: the worker exits when it dequeues this


class CpuCopyEngine:
    """A ``CopyEngine`` for a device buffer on the CPU: one worker thread.

    Ownership: the worker thread writes only the destination pages of the copy
    it is running; everything else (the queue, ``_seq``, ``_closed``) belongs to
    the owner thread. Tickets are ``FutureTicket``s finished by the worker.

    ``before_copy`` is a fault-injection seam for tests: it is called on the
    worker with each ``CopyRequest`` before the copy; if it raises, that copy's
    ticket fails with the exception and the pages are left untouched.
    """

    def __init__(
        self,
        device_buf: DeviceKVBuffer,
        host_buf: HostKVBuffer,
        *,
        before_copy: FaultHook | None = None,
        name: str = "kv-copy",
    ) -> None:
        check_buffers(device_buf, host_buf)
        if device_buf.device.type != "cpu":
            raise ValueError(
                f"CpuCopyEngine needs a device buffer on the cpu, got {device_buf.device}; "
                "use make_copy_engine() to get the CUDA engine"
            )
        self._device = device_buf  # written by the worker (host_to_device)
        self._host = host_buf  # written by the worker (device_to_host)
        self._before_copy = before_copy  # test seam, or None
        self._queue: queue.SimpleQueue[tuple[CopyRequest, FutureTicket] | None] = (
            queue.SimpleQueue()
        )
        self._seq = 0  # next submission number
        self._closed = False
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
        self._queue.put(_STOP)
        self._worker.join()

    def __enter__(self) -> CpuCopyEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, direction: Direction, pairs: PagePairs) -> FutureTicket:
        if self._closed:
            raise RuntimeError("copy engine is closed")
        ticket = FutureTicket()
        self._queue.put((CopyRequest(self._seq, direction, pairs), ticket))
        self._seq += 1
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
                if self._before_copy is not None:
                    self._before_copy(request)
                if request.direction is Direction.DEVICE_TO_HOST:
                    copy_device_to_host(self._device, self._host, request.pairs)
                else:
                    copy_host_to_device(self._host, self._device, request.pairs)
            except BaseException as exc:  # a failed copy fails its ticket, never the worker
                log.warning(
                    "copy #%d (%s) failed: %r",
                    request.seq,
                    request.direction.value,
                    exc,
                )
                ticket.fail(exc)
            else:
                ticket.finish(None)


def make_copy_engine(device_buf: DeviceKVBuffer, host_buf: HostKVBuffer) -> CopyEngine:
    """The CUDA engine when ``device_buf`` lives on a GPU, else the CPU engine."""
    if device_buf.device.type == "cuda":
        from transfer.cuda_engine import CudaCopyEngine

        return CudaCopyEngine(device_buf, host_buf)
    return CpuCopyEngine(device_buf, host_buf)

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

``CpuCopyEngine`` (``transfer.engine``) runs copies on one worker thread, strictly in
submission order, both directions through one queue: a copy observes every
copy submitted before it, and tickets complete in submission order. A small
copy submitted while none is in flight runs at once on the caller's thread
(cheaper than two thread wake-ups): its ticket is done on return.
``CudaCopyEngine`` (``transfer.cuda_engine``) documents its own ordering.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy.typing as npt

from radixcache.transfer.convert import PagePairs
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer
from radixcache.transfer.ticket import Ticket


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

"""Byte movement for radixcache: KV layouts, page-id allocation, copy engines.

This package imports nothing else of the project. It is the only place that
talks to CUDA streams, CUDA events and cupy (always lazily, never at import).
"""

from __future__ import annotations

from radixcache.transfer.allocator import PageAllocator
from radixcache.transfer.convert import PagePairs, copy_device_to_host, copy_host_to_device
from radixcache.transfer.engine import CopyEngine, CopyRequest, CpuCopyEngine, Direction, make_copy_engine
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer, KVSpec
from radixcache.transfer.ticket import FutureTicket, Ticket

__all__ = [
    "CopyEngine",
    "CopyRequest",
    "CpuCopyEngine",
    "DeviceKVBuffer",
    "Direction",
    "FutureTicket",
    "HostKVBuffer",
    "KVSpec",
    "PageAllocator",
    "PagePairs",
    "Ticket",
    "copy_device_to_host",
    "copy_host_to_device",
    "make_copy_engine",
]

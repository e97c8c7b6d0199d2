"""Byte movement for radixcache: KV layouts, page-id allocation, copy engines.

This package imports nothing else of the project. It is the only place that
talks to CUDA streams, CUDA events and cupy (always lazily, never at import).
"""

from __future__ import annotations

from transfer.allocator import PageAllocator
from transfer.layout import DeviceKVBuffer, KVSpec
from transfer.ticket import FutureTicket, Ticket

__all__ = ["DeviceKVBuffer", "FutureTicket", "KVSpec", "PageAllocator", "Ticket"]

"""The host tier's page pool: page-first host memory plus a page-id allocator.

    HostPool
      buffer    : HostKVBuffer  [num_pages, 2, L, P, H, D]  exactly num_pages * page_bytes
      allocator : PageAllocator over ids [0, num_pages)

The pool is sized once, from exactly one of: a page count, a byte budget
(floored to whole pages: never more memory than configured, and no
power-of-two rounding), or a ratio of the device pool's page count. It is
pinned (page-locked) when CUDA is available, so host<->device copies can run
asynchronously on a stream.

Owned by the owner thread. Worker threads (copy engine, storage reader and
writer) read or write the bytes of pages the owner handed them through a
ticket; they never allocate or free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy.typing as npt
import torch

from radixcache.transfer.allocator import PageAllocator, PageIds, PoolLoops
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec


@dataclass(frozen=True, slots=True)
class HostPoolConfig:
    """How big the host pool is: set exactly one of ``pages``, ``nbytes``, ``ratio``."""

    pages: int | None = None  # this many pages
    nbytes: int | None = None  # as many whole pages as fit in this many bytes
    ratio: float | None = None  # this multiple of the device pool's page count
    pin: bool = True  # page-locked memory (only when CUDA is available)

    def __post_init__(self) -> None:
        given = [name for name in ("pages", "nbytes", "ratio") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "HostPoolConfig needs exactly one of pages, nbytes, ratio; "
                f"got {', '.join(given) if given else 'none'}"
            )
        for name in ("pages", "nbytes"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise ValueError(f"HostPoolConfig.{name} must be a positive int, got {value!r}")
        if self.ratio is not None and (
            not isinstance(self.ratio, (int, float))
            or isinstance(self.ratio, bool)
            or not math.isfinite(self.ratio)
            or self.ratio <= 0
        ):
            raise ValueError(
                f"HostPoolConfig.ratio must be a positive finite number, got {self.ratio!r}"
            )

    def num_pages(self, spec: KVSpec, device_pages: int | None = None) -> int:
        """The pool's page count for ``spec`` (``device_pages`` is needed for a ratio)."""
        if self.pages is not None:
            return self.pages
        if self.nbytes is not None:
            pages = self.nbytes // spec.page_bytes
            if pages == 0:
                raise ValueError(
                    f"host pool of {self.nbytes} B holds no page: one page is "
                    f"{spec.page_bytes} B ({spec.describe()})"
                )
            return pages
        assert self.ratio is not None
        if device_pages is None or device_pages <= 0:
            raise ValueError(
                f"host pool ratio {self.ratio} needs the device pool's page count, "
                f"got {device_pages!r}"
            )
        pages = int(self.ratio * device_pages)
        if pages == 0:
            raise ValueError(
                f"host pool ratio {self.ratio} of {device_pages} device pages is less than one page"
            )
        return pages


class HostPool:
    """Host pages in the page-first layout, allocated by id.

    Mutated only by the owner thread (allocate/free). ``buffer`` is what copy
    engines and storage read and write.
    """

    def __init__(
        self,
        spec: KVSpec,
        config: HostPoolConfig,
        device_pages: int | None = None,
        loops: PoolLoops | None = None,
    ) -> None:
        """``loops``: the allocator's compiled loops (see ``PageAllocator``)."""
        self.spec = spec
        self.config = config
        num_pages = config.num_pages(spec, device_pages)
        self.buffer = HostKVBuffer(spec, num_pages, pin=config.pin and torch.cuda.is_available())
        self._allocator = PageAllocator(num_pages, name="host", loops=loops)

    @property
    def capacity(self) -> int:
        """Pages in the pool."""
        return self._allocator.capacity

    @property
    def free_count(self) -> int:
        return self._allocator.free_count

    @property
    def used_count(self) -> int:
        return self._allocator.used_count

    @property
    def nbytes(self) -> int:
        """Bytes of page memory (exactly capacity * page_bytes)."""
        return self.buffer.nbytes

    @property
    def pinned(self) -> bool:
        return self.buffer.pinned

    def allocate(self, n: int) -> PageIds | None:
        """Take ``n`` free page ids, or None (nothing taken) if fewer are free."""
        return self._allocator.allocate(n)

    def free(self, ids: npt.ArrayLike) -> None:
        """Give page ids back. Raises ValueError (freeing nothing) on a bad id."""
        self._allocator.free(ids)

    def is_allocated(self, ids: npt.ArrayLike) -> bool:
        return self._allocator.is_allocated(ids)

    def allocated_ids(self) -> PageIds:
        """Every allocated page id, ascending (O(capacity); for integrity checks)."""
        return self._allocator.allocated_ids()

    def check_integrity(self) -> None:
        """Verify the allocator and that the buffer is exactly the configured size."""
        self._allocator.check_integrity()
        data = self.buffer.data
        expected = self.capacity * self.spec.page_bytes
        assert data.is_contiguous(), "host buffer is not contiguous"
        assert data.numel() * data.element_size() == expected, (
            f"host buffer holds {data.numel() * data.element_size()} B, expected {expected}"
        )
        assert self.buffer.num_pages == self.capacity, (
            f"buffer has {self.buffer.num_pages} pages, allocator {self.capacity}"
        )

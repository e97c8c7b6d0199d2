"""Array-backed page-id allocator shared by the device and host page pools.

No Python object exists per page: free ids sit in one int32 stack and
ownership is one bool array, so allocating or freeing n pages costs a few
vectorized numpy operations whatever n is.

    _free: [ f0 f1 ... f(k-1) | (unused) ]      k = free_count
                          ^ top: allocate() pops from here, free() pushes here

A fresh allocator hands out ids in ascending order (0, 1, 2, ...); freed ids
are reused last-freed-first.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

PageIds = npt.NDArray[np.int32]


class PageAllocator:
    """Allocate and free page ids in ``[0, capacity)``.

    Mutates only itself. Not thread-safe: the owner thread drives it.
    """

    __slots__ = ("_capacity", "_free", "_free_count", "_in_use", "_name")

    def __init__(self, capacity: int, name: str = "pool") -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"{name}: capacity must be a non-negative int, got {capacity!r}")
        self._name = name  # used in error messages ("device", "host")
        self._capacity = capacity  # total page ids managed
        # Descending, so that popping from the end yields 0, 1, 2, ...
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int32)  # free-id stack
        self._free_count = capacity  # live part of the stack
        self._in_use = np.zeros(capacity, dtype=np.bool_)  # ownership bitmap

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free_count(self) -> int:
        return self._free_count

    @property
    def used_count(self) -> int:
        return self._capacity - self._free_count

    def allocate(self, n: int) -> PageIds | None:
        """Take ``n`` free ids, or return None (nothing taken) if fewer are free."""
        if n < 0:
            raise ValueError(f"{self._name}: cannot allocate {n} pages")
        if n > self._free_count:
            return None
        top = self._free_count
        ids = self._free[top - n : top][::-1].copy()
        self._free_count = top - n
        self._in_use[ids] = True
        return ids

    def free(self, ids: npt.ArrayLike) -> None:
        """Return ids to the pool.

        Raises ValueError, freeing nothing, if any id is out of range, already
        free, or listed twice.
        """
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(f"{self._name}: page ids must be a 1-D integer array, got {arr!r}")
        n = arr.size
        if n == 0:
            return
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self._capacity:
            raise ValueError(
                f"{self._name}: page id out of range [0, {self._capacity}): min {lo}, max {hi}"
            )
        owned = self._in_use[arr]
        if not owned.all():
            bad = arr[~owned][:8].tolist()
            raise ValueError(f"{self._name}: freeing pages that are not allocated: {bad}")
        if n > 1 and np.unique(arr).size != n:
            raise ValueError(f"{self._name}: the same page id appears twice in one free()")
        self._in_use[arr] = False
        top = self._free_count
        self._free[top : top + n] = arr[::-1]
        self._free_count = top + n

    def is_allocated(self, ids: npt.ArrayLike) -> bool:
        """True if every id in ``ids`` is currently allocated."""
        arr = np.asarray(ids)
        return bool(arr.size == 0 or self._in_use[arr].all())

    def allocated_ids(self) -> PageIds:
        """All allocated ids, ascending (for integrity checks; O(capacity))."""
        return np.flatnonzero(self._in_use).astype(np.int32)

    def check_integrity(self) -> None:
        """Verify the free stack and the bitmap agree exactly."""
        free = self._free[: self._free_count]
        assert np.unique(free).size == free.size, f"{self._name}: duplicate ids on the free stack"
        assert not self._in_use[free].any(), f"{self._name}: a free id is marked in use"
        used = int(self._in_use.sum())
        assert used + self._free_count == self._capacity, (
            f"{self._name}: {used} used + {self._free_count} free != {self._capacity}"
        )

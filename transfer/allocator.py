"""Array-backed page-id allocator shared by the device and host page pools.

No Python object exists per page: free ids sit in one int32 stack and
ownership is one int32 state array, so allocating or freeing n pages costs a
few vectorized numpy operations over the n ids, whatever the capacity.

    _free:  [ f0 f1 ... f(k-1) | (unused) ]      k = free_count
                           ^ top: allocate() pops from here, free() pushes here

    _state[id] > 0   allocated
    _state[id] <= 0  free (0 = never allocated; -j = freed as entry j-1 of a free())

``free()`` checks its ids in O(n) without sorting: one gather proves every id
is allocated, one scatter writes each entry's own stamp ``-(j+1)`` and one
gather reads the stamps back. An id listed twice keeps only its last stamp,
so the read-back differs exactly when some id repeats; then the ids are
marked allocated again and nothing is freed.

A fresh allocator hands out ids in ascending order (0, 1, 2, ...); freed ids
are reused last-freed-first.

Given ``loops`` (the engine hands in its compiled core, radixcache/native:
this layer imports nothing above it), both run in C, one pass over the ids
each (``pool_take``, ``pool_give``); the numpy code below is their
reference, and it names the error whenever the C pass finds a bad id (which
it undoes before handing over).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from typing import Protocol

PageIds = npt.NDArray[np.int32]


class PoolLoops(Protocol):
    """The compiled loops of ``allocate`` and ``free`` (radixcache.native's core)."""

    def pool_take(self, free: PageIds, state: PageIds, top: int, n: int) -> PageIds: ...

    def pool_give(self, ids: object, free: PageIds, state: PageIds, top: int, capacity: int) -> int: ...


class PageAllocator:
    """Allocate and free page ids in ``[0, capacity)``.

    Mutates only itself. Not thread-safe: the owner thread drives it.
    Bookkeeping: 8 bytes per page (the free stack and the state array).
    """

    __slots__ = ("_capacity", "_free", "_free_count", "_state", "_name", "_take", "_give")

    def __init__(self, capacity: int, name: str = "pool", loops: PoolLoops | None = None) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"{name}: capacity must be a non-negative int, got {capacity!r}")
        if capacity >= 2**31:
            raise ValueError(f"{name}: capacity {capacity} does not fit int32 page ids")
        self._name = name  # used in error messages ("device", "host")
        self._capacity = capacity  # total page ids managed
        # Descending, so that popping from the end yields 0, 1, 2, ...
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int32)  # free-id stack
        self._free_count = capacity  # live part of the stack
        self._state = np.zeros(capacity, dtype=np.int32)  # > 0: allocated (see module doc)
        self._take = None if loops is None else loops.pool_take  # None: the numpy reference
        self._give = None if loops is None else loops.pool_give

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
        if self._take is not None:
            ids = self._take(self._free, self._state, top, n)
        else:
            ids = self._free[top - n : top][::-1].copy()
            self._state[ids] = 1
        self._free_count = top - n
        return ids

    def free(self, ids: npt.ArrayLike) -> None:
        """Return ids to the pool, in O(len(ids)).

        Raises ValueError, freeing nothing, if any id is out of range, not
        allocated (already free or never handed out), or listed twice.
        """
        if self._give is not None:
            freed = self._give(ids, self._free, self._state, self._free_count, self._capacity)
            if freed >= 0:
                self._free_count += freed
                return
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(f"{self._name}: page ids must be a 1-D integer array, got {arr!r}")
        n = arr.size
        if n == 0:
            return
        cap = self._capacity
        if arr.dtype == np.int32:  # the common case: one unsigned pass covers both ends
            out_of_range = bool((arr.view(np.uint32) >= cap).any())
        else:
            out_of_range = int(arr.min()) < 0 or int(arr.max()) >= cap
        if out_of_range:
            lo, hi = int(arr.min()), int(arr.max())
            raise ValueError(f"{self._name}: page id out of range [0, {cap}): min {lo}, max {hi}")
        idx = arr.astype(np.intp)  # numpy indexes with intp; converting once is cheaper
        state = self._state
        owned = state[idx] > 0
        if not owned.all():
            bad = arr[~owned][:8].tolist()
            raise ValueError(f"{self._name}: freeing pages that are not allocated: {bad}")
        stamps = np.arange(-1, -n - 1, -1, dtype=np.int32)
        state[idx] = stamps
        if n > 1 and not (state[idx] == stamps).all():
            state[idx] = 1  # every id was allocated: restore, free nothing
            raise ValueError(f"{self._name}: the same page id appears twice in one free()")
        top = self._free_count
        self._free[top : top + n] = arr[::-1]
        self._free_count = top + n

    def is_allocated(self, ids: npt.ArrayLike) -> bool:
        """True if every id in ``ids`` is currently allocated."""
        arr = np.asarray(ids)
        return bool(arr.size == 0 or (self._state[arr] > 0).all())

    def allocated_ids(self) -> PageIds:
        """All allocated ids, ascending (for integrity checks; O(capacity))."""
        return np.flatnonzero(self._state > 0).astype(np.int32)

    def check_integrity(self) -> None:
        """Verify the free stack and the state array agree exactly."""
        free = self._free[: self._free_count]
        assert np.unique(free).size == free.size, f"{self._name}: duplicate ids on the free stack"
        assert not (self._state[free] > 0).any(), f"{self._name}: a free id is marked in use"
        used = int(np.count_nonzero(self._state > 0))
        assert used + self._free_count == self._capacity, (
            f"{self._name}: {used} used + {self._free_count} free != {self._capacity}"
        )

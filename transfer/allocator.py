"""Array-backed page-id allocator shared by the device and host page pools.

No Python object exists per page: returned ids sit in one int32 stack and
ownership is one int8 state array, so allocating or freeing n pages costs a
few vectorized numpy operations over the n ids, whatever the capacity.

    _free:  [ r0 r1 ... r(k-1) | (untouched) ]     k = ids returned and not yet reused
                           ^ top: allocate() pops from here, free() pushes here
    ids >= _fresh: never handed out (taken in ascending order once the stack is empty)

    _state[id] == 1   allocated
    _state[id] == 0   never allocated
    _state[id] == -1  freed (on the stack)

Memory grows with use, not with capacity: both arrays are allocated zeroed or
empty and the OS backs a page of them only once it is written, so a pool of
N pages of which M were ever handed out keeps about M bytes of state and
4 bytes per id on the stack at its deepest resident.

``free()`` checks its ids in O(n) without sorting: one gather proves every id
is allocated; to find an id listed twice, each entry scatters a stamp (a
digit of its position, base 126) into the state and reads it back. Two
entries with the same id read back the later one's stamp, which differs from
the earlier one's in some digit, so a round per digit of ``n`` (one round up
to 126 ids, two up to 15,876) finds every repeat; then the ids are marked
allocated again and nothing is freed.

A fresh allocator hands out ids in ascending order (0, 1, 2, ...); freed ids
are reused last-freed-first, before any id never handed out.

Given ``loops`` (the engine hands in its compiled core, radixcache/native:
this layer imports nothing above it), both run in C, one pass over the ids
each (``pool_take``, ``pool_give``); the numpy code below is their
reference, and it names the error whenever the C pass finds a bad id (which
it undoes before handing over).
"""

from __future__ import annotations

import mmap
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

PageIds = npt.NDArray[np.int32]
States = npt.NDArray[np.int8]


class PoolLoops(Protocol):
    """The compiled loops of ``allocate`` and ``free`` (radixcache.native's core)."""

    def pool_take(self, free: PageIds, state: States, top: int, fresh: int, n: int) -> PageIds: ...

    def pool_give(self, ids: object, free: PageIds, state: States, top: int, capacity: int) -> int: ...


_STAMP_BASE = 126  # stamps -1 .. -126 fit int8 (see the module doc)
_MAP_BYTES = 1 << 16  # arrays from this size on get their own anonymous map


class PageAllocator:
    """Allocate and free page ids in ``[0, capacity)``.

    Mutates only itself. Not thread-safe: the owner thread drives it.
    Bookkeeping: up to 5 bytes per page (the stack and the state array),
    resident only for ids that were ever handed out (module doc).
    """

    __slots__ = ("_capacity", "_free", "_top", "_fresh", "_state", "_name", "_take", "_give")

    def __init__(self, capacity: int, name: str = "pool", loops: PoolLoops | None = None) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"{name}: capacity must be a non-negative int, got {capacity!r}")
        if capacity >= 2**31:
            raise ValueError(f"{name}: capacity {capacity} does not fit int32 page ids")
        self._name = name  # used in error messages ("device", "host")
        self._capacity = capacity  # total page ids managed
        self._free = _untouched(capacity, np.int32)  # stack of returned ids (written as they come back)
        self._top = 0  # returned ids on the stack
        self._fresh = 0  # ids >= this were never handed out
        self._state = _untouched(capacity, np.int8)  # 1 allocated, 0 never, -1 freed
        self._take = None if loops is None else loops.pool_take  # None: the numpy reference
        self._give = None if loops is None else loops.pool_give

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free_count(self) -> int:
        return self._top + self._capacity - self._fresh

    @property
    def used_count(self) -> int:
        return self._fresh - self._top

    def allocate(self, n: int) -> PageIds | None:
        """Take ``n`` free ids, or return None (nothing taken) if fewer are free."""
        if n < 0:
            raise ValueError(f"{self._name}: cannot allocate {n} pages")
        top = self._top
        fresh = self._fresh
        if n > top + self._capacity - fresh:
            return None
        reused = min(n, top)  # last freed first, then ids never handed out
        if self._take is not None:
            ids = self._take(self._free, self._state, top, fresh, n)
        else:
            ids = np.empty(n, dtype=np.int32)
            ids[:reused] = self._free[top - reused : top][::-1]
            ids[reused:] = np.arange(fresh, fresh + n - reused, dtype=np.int32)
            self._state[ids] = 1
        self._top = top - reused
        self._fresh = fresh + n - reused
        return ids

    def free(self, ids: npt.ArrayLike) -> None:
        """Return ids to the pool, in O(len(ids)).

        Raises ValueError, freeing nothing, if any id is out of range, not
        allocated (already free or never handed out), or listed twice.
        """
        if self._give is not None:
            freed = self._give(ids, self._free, self._state, self._top, self._capacity)
            if freed >= 0:
                self._top += freed
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
        if n > 1 and _repeats(state, idx):
            state[idx] = 1  # every id was allocated: restore, free nothing
            raise ValueError(f"{self._name}: the same page id appears twice in one free()")
        state[idx] = -1
        top = self._top
        self._free[top : top + n] = arr[::-1]
        self._top = top + n

    def is_allocated(self, ids: npt.ArrayLike) -> bool:
        """True if every id in ``ids`` is currently allocated."""
        arr = np.asarray(ids)
        return bool(arr.size == 0 or (self._state[arr] > 0).all())

    def allocated_ids(self) -> PageIds:
        """All allocated ids, ascending (for integrity checks; O(capacity))."""
        return np.flatnonzero(self._state > 0).astype(np.int32)

    def check_integrity(self) -> None:
        """Verify the stack, the fresh mark and the state array agree exactly."""
        name, fresh, state = self._name, self._fresh, self._state
        free = self._free[: self._top]
        assert 0 <= self._top <= fresh <= self._capacity, f"{name}: stack {self._top}, fresh {fresh}"
        assert np.unique(free).size == free.size, f"{name}: duplicate ids on the free stack"
        assert not (free >= fresh).any(), f"{name}: an id never handed out is on the free stack"
        assert (state[free] == -1).all(), f"{name}: an id on the free stack is not marked freed"
        assert not state[fresh:].any(), f"{name}: an id never handed out is marked"
        used = int(np.count_nonzero(state == 1))
        assert np.count_nonzero(state == -1) == free.size, f"{name}: a freed id is not on the stack"
        assert used + self.free_count == self._capacity, (
            f"{name}: {used} used + {self.free_count} free != {self._capacity}"
        )


def _untouched(n: int, dtype: type[np.int32] | type[np.int8]) -> npt.NDArray[Any]:
    """``n`` zeros that take memory a page at a time as they are written.
    The allocator (glibc) may serve even a large array from memory it
    recycles, which ``np.zeros`` then clears: all of it resident at once. An
    anonymous map is backed by the OS only where written; small arrays
    (under ``_MAP_BYTES``) are not worth a map of their own."""
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < _MAP_BYTES:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype)


def _repeats(state: States, idx: npt.NDArray[np.intp]) -> bool:
    """True if some id in ``idx`` (all allocated) is listed twice. Leaves
    stamps in ``state[idx]``: the caller sets them. Sort-free (module doc)."""
    n = idx.size
    pos = np.arange(n)
    span = 1
    while span < n:
        stamps = (-((pos // span) % _STAMP_BASE) - 1).astype(np.int8)
        state[idx] = stamps
        if not (state[idx] == stamps).all():
            return True
        span *= _STAMP_BASE
    return False

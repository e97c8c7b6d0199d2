"""PageAllocator: exact ids, O(n) frees, and clear errors that free nothing.

Every test runs on the numpy loops (the reference) and, where the compiled
core is built, on its C loops; a lockstep machine holds the two to the same
ids, the same state and the same errors."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixcache.transfer.allocator import PageAllocator, PoolLoops


def _compiled() -> PoolLoops | None:
    try:
        core: PoolLoops = importlib.import_module("radixcache.native._core")  # type: ignore[assignment]
    except ImportError:
        return None
    return core


COMPILED = _compiled()
LOOPS = [pytest.param(None, id="numpy")] + (
    [] if COMPILED is None else [pytest.param(COMPILED, id="compiled")]
)
Make = Callable[..., PageAllocator]


@pytest.fixture(params=LOOPS)
def make(request: pytest.FixtureRequest) -> Make:
    """``PageAllocator`` on one of the two loops."""
    return partial(PageAllocator, loops=request.param)


def ids(*xs: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    return np.array(xs, dtype=np.int32)


def test_fresh_ids_ascend_and_freed_ids_come_back_first(make: Make) -> None:
    a = make(6)
    first = a.allocate(4)
    assert first is not None and first.tolist() == [0, 1, 2, 3]
    a.free(ids(1, 3))
    again = a.allocate(3)
    assert again is not None and again.tolist() == [1, 3, 4]  # the freed run comes back in its order
    assert a.free_count == 1 and a.used_count == 5
    a.check_integrity()


def test_allocate_more_than_free_takes_nothing(make: Make) -> None:
    a = make(3)
    assert a.allocate(4) is None
    assert a.free_count == 3
    with pytest.raises(ValueError, match="cannot allocate -1"):
        a.allocate(-1)


def test_double_free_is_an_error_and_frees_nothing(make: Make) -> None:
    a = make(8, "device")
    a.allocate(5)
    a.free(ids(2))
    with pytest.raises(ValueError, match=r"device: freeing pages that are not allocated: \[2\]"):
        a.free(ids(4, 2))
    assert a.is_allocated(ids(4))  # 4 was not freed either
    assert a.free_count == 4
    a.check_integrity()


def test_same_id_twice_in_one_free_is_an_error_and_frees_nothing(make: Make) -> None:
    a = make(8, "host")
    a.allocate(6)
    with pytest.raises(ValueError, match="host: the same page id appears twice"):
        a.free(ids(0, 5, 3, 5))
    assert a.is_allocated(ids(0, 3, 5))
    assert a.free_count == 2
    a.check_integrity()
    a.free(ids(0, 5, 3))  # still freeable afterwards
    assert a.free_count == 5
    a.check_integrity()


@pytest.mark.parametrize("gap", [1, 125, 126, 127, 126**2])
def test_a_repeat_is_found_however_far_apart(make: Make, gap: int) -> None:
    """The reference stamps a base-126 digit of each entry's position a
    round at a time: repeats whose positions share the low digits (126 or
    126**2 apart) are found by a later round."""
    a = make(20_000)
    got = a.allocate(20_000)
    assert got is not None
    pick = got[: gap + 10].copy()
    pick[gap + 3] = pick[3]
    with pytest.raises(ValueError, match="appears twice"):
        a.free(pick)
    assert a.free_count == 0 and a.is_allocated(got)
    a.free(np.delete(pick, gap + 3))
    assert a.free_count == gap + 9
    a.check_integrity()


@pytest.mark.parametrize("bad", [[-1], [8], [3, 2**31 - 1], [0, -2**31]])
def test_foreign_id_out_of_range_is_an_error(make: Make, bad: list[int]) -> None:
    a = make(8)
    a.allocate(8)
    with pytest.raises(ValueError, match=r"out of range \[0, 8\)"):
        a.free(np.array(bad, dtype=np.int32))
    assert a.free_count == 0


def test_never_allocated_id_is_an_error(make: Make) -> None:
    a = make(8)
    a.allocate(2)
    with pytest.raises(ValueError, match=r"not allocated: \[6\]"):
        a.free(ids(1, 6))
    assert a.free_count == 6


def test_wrong_shape_or_dtype_is_an_error(make: Make) -> None:
    a = make(8)
    a.allocate(4)
    with pytest.raises(ValueError, match="1-D integer array"):
        a.free(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D integer array"):
        a.free(np.array([[1, 2]], dtype=np.int32))
    assert a.free_count == 4


def test_other_integer_dtypes_are_accepted(make: Make) -> None:
    a = make(8)
    a.allocate(6)
    a.free(np.array([5, 1], dtype=np.int64))
    a.free(np.array([0], dtype=np.uint16))
    a.free([2])
    with pytest.raises(ValueError, match="out of range"):
        a.free(np.array([2**40], dtype=np.int64))
    assert a.allocated_ids().tolist() == [3, 4]
    a.check_integrity()


def test_capacity_is_validated(make: Make) -> None:
    with pytest.raises(ValueError, match="non-negative int"):
        make(-1)
    with pytest.raises(ValueError, match="does not fit int32"):
        make(2**31)


def test_free_does_not_sort(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """The common path checks ownership and repeats without sort or unique."""
    a = make(50_000)
    got = a.allocate(50_000)
    assert got is not None
    order = np.random.default_rng(1).permutation(got)[:10_000].astype(np.int32)

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("free() sorted its ids")

    for name in ("unique", "sort", "argsort"):
        monkeypatch.setattr(np, name, boom)
    a.free(order)
    with pytest.raises(ValueError, match="appears twice"):
        a.free(np.concatenate([np.setdiff1d(got, order)[:3], np.setdiff1d(got, order)[:1]]))
    monkeypatch.undo()
    assert a.free_count == 10_000
    assert not a.is_allocated(order[:1]) and a.is_allocated(np.setdiff1d(got, order)[:3])
    a.check_integrity()


class AllocatorModel(RuleBasedStateMachine):
    """The allocator against a plain set of allocated ids."""

    def __init__(self) -> None:
        super().__init__()
        self.a = PageAllocator(24)
        self.used: set[int] = set()

    @rule(n=st.integers(0, 30))
    def allocate(self, n: int) -> None:
        got = self.a.allocate(n)
        if n > 24 - len(self.used):
            assert got is None
            return
        assert got is not None and got.size == n
        assert not (set(got.tolist()) & self.used)
        self.used |= set(got.tolist())

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        pick = data.draw(st.lists(st.integers(-2, 26), max_size=8))
        ok = (
            all(0 <= x < 24 and x in self.used for x in pick)
            and len(set(pick)) == len(pick)
        )
        if ok:
            self.a.free(np.array(pick, dtype=np.int32))
            self.used -= set(pick)
        else:
            with pytest.raises(ValueError):
                self.a.free(np.array(pick, dtype=np.int32))

    @invariant()
    def agrees(self) -> None:
        self.a.check_integrity()
        assert self.a.allocated_ids().tolist() == sorted(self.used)
        assert self.a.free_count == 24 - len(self.used)


TestAllocatorModel = AllocatorModel.TestCase
TestAllocatorModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_the_compiled_free_takes_only_plain_int32_arrays_and_hands_the_rest_back() -> None:
    """Anything but a 1-D C-contiguous int32 array goes to the reference
    (which converts or refuses it); a bad id leaves the state as it was."""
    if COMPILED is None:
        pytest.skip("the compiled core is not built here")
    free = np.empty(8, dtype=np.int32)
    state = np.zeros(8, dtype=np.int8)
    got = COMPILED.pool_take(free, state, 0, 0, 5)
    assert got.tolist() == [0, 1, 2, 3, 4] and state.tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    before = state.copy()
    for other in ([1], np.array([1], dtype=np.int64), np.array([[1]], dtype=np.int32),
                  np.array([1, 0, 2], dtype=np.int32)[::2], np.array(1, dtype=np.int32)):
        assert COMPILED.pool_give(other, free, state, 0, 8) == -1
    for bad in ([1, 5], [2, 8], [3, 1, 3], [-1]):  # not allocated, out of range, twice, negative
        assert COMPILED.pool_give(np.array(bad, dtype=np.int32), free, state, 0, 8) == -1
        assert state.tolist() == before.tolist()
    assert COMPILED.pool_give(np.array([4, 0], dtype=np.int32), free, state, 0, 8) == 2
    assert state.tolist() == [-1, 1, 1, 1, -1, 0, 0, 0] and free[:2].tolist() == [0, 4]
    # the stack first (last freed first), then ids never handed out
    assert COMPILED.pool_take(free, state, 2, 5, 3).tolist() == [4, 0, 5]
    assert state.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]


class LockstepModel(RuleBasedStateMachine):
    """The C loops against the numpy ones: the same ids handed out, the same
    state and free stack after every call, the same error for a bad free."""

    def __init__(self) -> None:
        super().__init__()
        self.ref = PageAllocator(20, "device")
        self.fast = PageAllocator(20, "device", loops=COMPILED)

    @rule(n=st.integers(-1, 24))
    def allocate(self, n: int) -> None:
        outcomes = []
        for a in (self.ref, self.fast):
            try:
                got = a.allocate(n)
                outcomes.append(None if got is None else got.tolist())
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]

    @rule(pick=st.lists(st.integers(-3, 23), max_size=8), dtype=st.sampled_from(["int32", "int64"]))
    def free(self, pick: list[int], dtype: str) -> None:
        outcomes = []
        for a in (self.ref, self.fast):
            try:
                a.free(np.array(pick, dtype=dtype))
                outcomes.append("ok")
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]

    @invariant()
    def same(self) -> None:
        assert self.ref.free_count == self.fast.free_count
        assert self.ref._state.tolist() == self.fast._state.tolist()
        assert (self.ref._top, self.ref._fresh) == (self.fast._top, self.fast._fresh)
        top = self.ref._top
        assert self.ref._free[:top].tolist() == self.fast._free[:top].tolist()
        self.fast.check_integrity()


TestLockstep = LockstepModel.TestCase
TestLockstep.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
if COMPILED is None:
    TestLockstep = pytest.mark.skip(reason="the compiled core is not built here")(TestLockstep)

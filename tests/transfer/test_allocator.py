"""PageAllocator: exact ids, O(n) frees, and clear errors that free nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixcache.transfer.allocator import PageAllocator


def ids(*xs: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    return np.array(xs, dtype=np.int32)


def test_fresh_ids_ascend_and_freed_ids_come_back_first() -> None:
    a = PageAllocator(6)
    first = a.allocate(4)
    assert first is not None and first.tolist() == [0, 1, 2, 3]
    a.free(ids(1, 3))
    again = a.allocate(3)
    assert again is not None and again.tolist() == [1, 3, 4]  # the freed run comes back in its order
    assert a.free_count == 1 and a.used_count == 5
    a.check_integrity()


def test_allocate_more_than_free_takes_nothing() -> None:
    a = PageAllocator(3)
    assert a.allocate(4) is None
    assert a.free_count == 3
    with pytest.raises(ValueError, match="cannot allocate -1"):
        a.allocate(-1)


def test_double_free_is_an_error_and_frees_nothing() -> None:
    a = PageAllocator(8, "device")
    a.allocate(5)
    a.free(ids(2))
    with pytest.raises(ValueError, match=r"device: freeing pages that are not allocated: \[2\]"):
        a.free(ids(4, 2))
    assert a.is_allocated(ids(4))  # 4 was not freed either
    assert a.free_count == 4
    a.check_integrity()


def test_same_id_twice_in_one_free_is_an_error_and_frees_nothing() -> None:
    a = PageAllocator(8, "host")
    a.allocate(6)
    with pytest.raises(ValueError, match="host: the same page id appears twice"):
        a.free(ids(0, 5, 3, 5))
    assert a.is_allocated(ids(0, 3, 5))
    assert a.free_count == 2
    a.check_integrity()
    a.free(ids(0, 5, 3))  # still freeable afterwards
    assert a.free_count == 5
    a.check_integrity()


@pytest.mark.parametrize("bad", [[-1], [8], [3, 2**31 - 1], [0, -2**31]])
def test_foreign_id_out_of_range_is_an_error(bad: list[int]) -> None:
    a = PageAllocator(8)
    a.allocate(8)
    with pytest.raises(ValueError, match=r"out of range \[0, 8\)"):
        a.free(np.array(bad, dtype=np.int32))
    assert a.free_count == 0


def test_never_allocated_id_is_an_error() -> None:
    a = PageAllocator(8)
    a.allocate(2)
    with pytest.raises(ValueError, match=r"not allocated: \[6\]"):
        a.free(ids(1, 6))
    assert a.free_count == 6


def test_wrong_shape_or_dtype_is_an_error() -> None:
    a = PageAllocator(8)
    a.allocate(4)
    with pytest.raises(ValueError, match="1-D integer array"):
        a.free(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D integer array"):
        a.free(np.array([[1, 2]], dtype=np.int32))
    assert a.free_count == 4


def test_other_integer_dtypes_are_accepted() -> None:
    a = PageAllocator(8)
    a.allocate(6)
    a.free(np.array([5, 1], dtype=np.int64))
    a.free(np.array([0], dtype=np.uint16))
    a.free([2])
    with pytest.raises(ValueError, match="out of range"):
        a.free(np.array([2**40], dtype=np.int64))
    assert a.allocated_ids().tolist() == [3, 4]
    a.check_integrity()


def test_capacity_is_validated() -> None:
    with pytest.raises(ValueError, match="non-negative int"):
        PageAllocator(-1)
    with pytest.raises(ValueError, match="does not fit int32"):
        PageAllocator(2**31)


def test_free_does_not_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common path checks ownership and repeats without sort or unique."""
    a = PageAllocator(50_000)
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

"""Token validation: the int32 fast path checks as much as the general one."""

from __future__ import annotations

import numpy as np
import pytest

from radixcache.tokens import MAX_TOKEN_ID, as_tokens


def test_int32_array_is_used_as_is() -> None:
    a = np.arange(100, dtype=np.int32)
    assert as_tokens(a) is a


@pytest.mark.parametrize("bad", [[-1], [5, -7, 3], [0, -(2**31)]])
def test_negative_int32_ids_are_refused(bad: list[int]) -> None:
    with pytest.raises(ValueError, match=rf"prompt: token id out of range \[0, {MAX_TOKEN_ID}\]: min {min(bad)}"):
        as_tokens(np.array(bad, dtype=np.int32), "prompt")
    with pytest.raises(ValueError, match=rf"prompt: token id out of range \[0, {MAX_TOKEN_ID}\]: min {min(bad)}"):
        as_tokens(np.array(bad, dtype=np.int32), "prompt", copy=True)  # the copying path (compiled or not)


@pytest.mark.parametrize("n", [0, 1, 4097])
def test_an_owned_copy_is_equal_writable_and_shares_nothing(n: int) -> None:
    a = np.arange(n, dtype=np.int32)
    a.flags.writeable = n % 2 == 0  # a read-only prompt is copied all the same
    out = as_tokens(a, copy=True)
    assert out.dtype == np.int32 and out.tolist() == a.tolist() and out.flags.writeable
    assert out is not a and not np.shares_memory(out, a)


def test_other_layouts_still_take_the_general_path() -> None:
    strided = np.arange(10, dtype=np.int32)[::2]
    out = as_tokens(strided)
    assert out.flags.c_contiguous and out.tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="must be 1-D"):
        as_tokens(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="out of range"):
        as_tokens(np.array([2**31], dtype=np.int64))
    assert as_tokens(np.array([], dtype=np.int32)).size == 0

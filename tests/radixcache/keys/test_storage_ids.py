"""StorageIds, the storage key -> event id table, against a plain dict."""

from __future__ import annotations

import hashlib
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.keys.storage_ids import StorageIds


def key(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def ids(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# An op: ("add", [(key index, id)]) or ("pop", [key index]); a small key
# space makes repeats, replacements and pops of unknown keys common.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2**63 - 1)), max_size=30)),
        st.tuples(st.just("pop"), st.lists(st.integers(0, 40), max_size=30)),
        st.tuples(st.just("clear"), st.just([])),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_table_behaves_like_a_dict(ops: list[tuple[str, list]]) -> None:
    table = StorageIds()
    ref: dict[bytes, int] = {}
    for op, args in ops:
        if op == "add":
            ks = [key(i) for i, _ in args]
            new = {k: v for k, (_, v) in zip(ks, args)}  # the last id of a repeated key counts
            replaced = sorted(ref[k] for k in new if k in ref and ref[k] != new[k])
            got = table.add(b"".join(ks), ids([v for _, v in args]))
            assert sorted(got.tolist()) == replaced
            ref.update(new)
        elif op == "pop":
            ks = [key(i) for i in args]
            want = [ref.pop(k, -1) for k in ks]  # a repeated key: -1 the second time
            assert table.pop(ks).tolist() == want
        else:
            table.clear()
            ref.clear()
        table.check_integrity()
        assert len(table) == len(ref)
        every = [key(i) for i in range(41)]
        assert table.get(every).tolist() == [ref.get(k, -1) for k in every]


def test_keys_that_share_a_home_slot_or_a_half_are_kept_apart() -> None:
    """Keys equal in their first 8 bytes (one home slot) or in their last 8
    are different keys: the whole 16 bytes are compared."""
    table = StorageIds()
    a, b, c = bytes(8) + b"A" * 8, bytes(8) + b"B" * 8, b"\x01" + bytes(7) + b"A" * 8
    table.add(a + b + c, ids([1, 2, 3]))
    assert table.get([c, b, a, bytes(16)]).tolist() == [3, 2, 1, -1]
    assert table.pop([b]).tolist() == [2]
    assert table.get([a, b, c]).tolist() == [1, -1, 3]  # a probe goes on past the removed b
    table.check_integrity()


def test_bad_input_is_refused_and_changes_nothing() -> None:
    table = StorageIds()
    table.add(key(1), ids([5]))
    with pytest.raises(ValueError, match="16 bytes"):
        table.pop([key(1), b"raw-page-key"])
    with pytest.raises(ValueError, match="16 bytes per id"):
        table.add(key(2) + key(3), ids([1]))
    with pytest.raises(ValueError, match="non-negative"):
        table.add(key(2), ids([-4]))
    assert len(table) == 1 and table.get([key(1)]).tolist() == [5]
    table.check_integrity()


def test_bytes_per_remembered_page() -> None:
    """24 bytes a slot, between a third and a half of the slots live: at
    most 72 bytes per page, all of it in three numpy arrays."""
    n = 20_000
    keys = b"".join(key(i) for i in range(n))
    tracemalloc.start(3)
    table = StorageIds()
    for start in range(0, n, 64):  # store jobs land a run of pages at a time
        stop = min(start + 64, n)
        table.add(keys[16 * start : 16 * stop], np.arange(start, stop, dtype=np.int64))
    # (only what the table's own code allocated: threads other tests left
    # running allocate meanwhile)
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/storage_ids.py", all_frames=True)])
    tracemalloc.stop()
    held = sum(trace.size for trace in snapshot.traces)
    assert len(table) == n
    assert 48 <= table.nbytes / n <= 72
    # Nothing per page outside the arrays: a Python object per page would be
    # over 32 bytes each (640 kB here); numpy keeps a small cache of freed
    # small blocks, whatever the table's size (measured 18-32 kB).
    assert table.nbytes <= held <= table.nbytes + 64 * 1024
    table.check_integrity()
    # Pages leave storage: the table gives their room back.
    table.pop([keys[16 * i : 16 * (i + 1)] for i in range(n - 1000)])
    assert len(table) == 1000 and table.nbytes / 1000 <= 8 * 24
    table.check_integrity()

"""``copy_checksum``: a record's KV bytes copied and summed in one pass (the
compiled core's ``copy_sums``, which the engine hands to the storage layer)
give the copy and the checksum that numpy's copy and ``kv_checksum`` give,
whatever the length and the alignment; and records written and read with
either pass are the same bytes and verify alike. The core's ``kv_sums``
(summed where the bytes lie, no copy) gives ``kv_checksum`` numpy's checksum."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.offload.storage import record
from radixcache.offload.storage.kv_checksum import (
    ROW_BYTES,
    copy_checksum,
    kv_checksum,
    use_copy_sums,
    use_sums,
)

checksums = importlib.import_module("radixcache.offload.storage.kv_checksum")


def _core() -> Any:
    """The compiled core, loaded directly (so ``RADIXCACHE_PURE`` does not hide it), or None."""
    try:
        return importlib.import_module("radixcache.native._core")
    except ImportError:
        return None


CORE = _core()
needs_core = pytest.mark.skipif(CORE is None, reason="the compiled core is not built")


@pytest.fixture
def restore() -> Iterator[None]:
    """Leave the pass this process had (another test's engine may have handed one in)."""
    before, sums = checksums._copy_sums, checksums._sums
    yield
    use_copy_sums(before)
    use_sums(sums)


@needs_core
@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 9), tail=st.integers(0, ROW_BYTES - 1), offset=st.integers(0, 17),
    start=st.integers(0, 2**32 - 1), kind=st.sampled_from(["bytes", "memoryview", "array"]), seed=st.integers(0, 99),
)
def test_the_compiled_pass_copies_and_sums_as_the_reference(
    rows: int, tail: int, offset: int, start: int, kind: str, seed: int
) -> None:
    n = rows * ROW_BYTES + tail
    raw = np.random.default_rng(seed).integers(0, 256, offset + n, dtype=np.uint8)
    src: object = {"bytes": raw.tobytes(), "memoryview": memoryview(raw.tobytes()), "array": raw}[kind]
    before = checksums._copy_sums
    try:
        use_copy_sums(CORE.copy_sums)
        fused_dst = np.full(n, 0xAA, np.uint8)
        fused = copy_checksum(src, offset, fused_dst, start)
        use_copy_sums(None)
        plain_dst = np.zeros(n, np.uint8)
        plain = copy_checksum(src, offset, plain_dst, start)
    finally:
        use_copy_sums(before)
    assert fused == plain == kv_checksum(raw[offset:].copy(), start)
    assert fused_dst.tobytes() == plain_dst.tobytes() == raw[offset:].tobytes()


@needs_core
def test_the_compiled_pass_refuses_what_does_not_fit() -> None:
    copy_sums = CORE.copy_sums
    dst = np.zeros(4096, np.uint8)
    for src, offset in ((bytes(4095), 0), (bytes(4097), 0), (bytes(4100), 5), (bytes(4096), -1)):
        with pytest.raises(ValueError, match="bytes from offset"):
            copy_sums(src, offset, dst)
    assert not dst.any()  # nothing copied
    read_only = np.zeros(4096, np.uint8)
    read_only.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        copy_sums(bytes(4096), 0, read_only)
    with pytest.raises(ValueError, match="C-contiguous"):
        copy_checksum(bytes(2048), 0, np.zeros(4096, np.uint8)[::2])


@needs_core
@pytest.mark.parametrize("kv_bytes", [100, 4096, 5 * 4096 + 8, 65536])
def test_records_written_and_read_with_either_pass_are_the_same(kv_bytes: int, restore: None) -> None:
    kv = np.random.default_rng(kv_bytes).integers(0, 256, kv_bytes, dtype=np.uint8)
    tokens = np.arange(16, dtype=np.int32)
    fields = dict(key=b"k" * 16, ns_tag=b"n" * 16, tokens=tokens, kv=kv, seq=3)
    size = record.record_size(16, 0, 16, kv_bytes)
    written = []
    for fn in (CORE.copy_sums, None):
        use_copy_sums(fn)
        out = bytearray(size)
        record.encode_into(out, **fields)  # type: ignore[arg-type]
        written.append(bytes(out))
    assert written[0] == written[1]
    bad = bytearray(written[0])
    bad[-1] ^= 1  # a flipped KV bit
    for fn in (CORE.copy_sums, None):
        use_copy_sums(fn)
        dst = np.zeros(kv_bytes, np.uint8)
        assert record.read_into(written[0], key=b"k" * 16, ns_tag=b"n" * 16, tokens=tokens, dst=dst)
        assert dst.tobytes() == kv.tobytes()
        assert not record.read_into(bytes(bad), key=b"k" * 16, ns_tag=b"n" * 16, tokens=tokens, dst=dst)


@needs_core
@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 9), tail=st.integers(0, ROW_BYTES - 1), offset=st.integers(0, 17),
    start=st.integers(0, 2**32 - 1), step=st.sampled_from([1, 2]), seed=st.integers(0, 99),
)
def test_the_compiled_sums_give_the_reference_checksum(
    rows: int, tail: int, offset: int, start: int, step: int, seed: int
) -> None:
    """Any length, unaligned (an offset into a bytes object) and strided
    (``step`` 2: summed from a contiguous copy)."""
    n = rows * ROW_BYTES + tail
    raw = np.random.default_rng(seed).integers(0, 256, offset + n * step, dtype=np.uint8).tobytes()
    kv = np.frombuffer(raw, dtype=np.uint8, offset=offset)[::step]
    assert kv.size == n
    before = checksums._sums
    try:
        use_sums(CORE.kv_sums)
        fused = kv_checksum(kv, start)
        use_sums(None)
        plain = kv_checksum(kv, start)
    finally:
        use_sums(before)
    assert fused == plain == kv_checksum(np.array(kv), start)


@needs_core
def test_the_compiled_sums_take_a_contiguous_buffer_only() -> None:
    with pytest.raises((BufferError, ValueError)):
        CORE.kv_sums(np.zeros(8192, np.uint8)[::2])
    rows, cols = CORE.kv_sums(bytes(4095))
    assert rows.size == 0 and not cols.any()

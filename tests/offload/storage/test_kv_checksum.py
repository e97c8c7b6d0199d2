"""The KV checksum of record v3 (offload/storage/kv_checksum.py): its exact format,
checked against a plain-Python reference, and the errors it detects (and one
it is documented to miss)."""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt
import pytest

from radixcache.offload.storage.kv_checksum import ROW_BYTES, kv_checksum

MASK = 2**64 - 1


def reference(data: bytes, start: int = 0) -> int:
    """The format, spelled out with Python ints: little-endian 64-bit words
    in rows of 512, row sums then column sums modulo 2**64 as little-endian
    bytes, then the tail, all through one crc32."""
    rows = len(data) // ROW_BYTES
    row_sums = [0] * rows
    col_sums = [0] * 512
    for r in range(rows):
        for c in range(512):
            at = r * ROW_BYTES + 8 * c
            word = int.from_bytes(data[at : at + 8], "little")
            row_sums[r] = (row_sums[r] + word) & MASK
            col_sums[c] = (col_sums[c] + word) & MASK
    summary = b"".join(s.to_bytes(8, "little") for s in row_sums)
    if rows:
        summary += b"".join(s.to_bytes(8, "little") for s in col_sums)
    return zlib.crc32(summary + data[rows * ROW_BYTES :], start)


def page(nbytes: int, seed: int = 0) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.parametrize("nbytes", [0, 1, 7, 1024, 4095, 4096, 4097, 3 * 4096 + 100, 8 * 4096])
def test_the_format_matches_the_reference(nbytes: int) -> None:
    kv = page(nbytes, seed=nbytes)
    assert kv_checksum(kv) == reference(kv.tobytes())
    assert kv_checksum(kv, 12345) == reference(kv.tobytes(), 12345)  # chains like zlib.crc32


def test_a_known_answer_pins_the_format_across_machines() -> None:
    # words 0, 1, 2, ... as little-endian uint64 over two rows, then a 3-byte tail
    words = np.arange(1024, dtype="<u8").view(np.uint8)
    kv = np.concatenate([words, np.array([1, 2, 3], np.uint8)])
    assert kv_checksum(kv) == reference(kv.tobytes()) == 0x1C8F7843


def test_unaligned_and_shaped_buffers_give_the_same_checksum() -> None:
    kv = page(5 * ROW_BYTES + 40, seed=1)
    backing = np.zeros(kv.size + 3, dtype=np.uint8)
    unaligned = backing[3:]  # the KV bytes of an LMDB value need not be 8-aligned
    unaligned[:] = kv
    assert unaligned.ctypes.data % 8 != 0
    assert kv_checksum(unaligned) == kv_checksum(kv)
    assert kv_checksum(kv[: 5 * ROW_BYTES].reshape(5, 64, 64)) == kv_checksum(kv[: 5 * ROW_BYTES])


def test_any_single_bit_flip_is_detected() -> None:
    """Every bit of the first and last word of each row and of the tail, and
    2,000 sampled bits elsewhere, on 3 rows plus a 100-byte tail."""
    kv = page(3 * ROW_BYTES + 100, seed=2)
    good = kv_checksum(kv)
    rng = np.random.default_rng(3)
    ends = (*range(8), *range(ROW_BYTES - 8, ROW_BYTES))
    firsts = [r * ROW_BYTES + b for r in range(3) for b in ends]
    tail = list(range(3 * ROW_BYTES, kv.size))
    sampled = rng.integers(0, kv.size, 2000).tolist()
    for at in [*firsts, *tail, *sampled]:
        for bit in range(8) if at in firsts or at in tail else [int(rng.integers(8))]:
            kv[at] ^= 1 << bit
            assert kv_checksum(kv) != good, (at, bit)
            kv[at] ^= 1 << bit
    assert kv_checksum(kv) == good


def test_single_bit_flips_in_a_2_mib_page_are_detected() -> None:
    kv = page(2 << 20, seed=4)
    good = kv_checksum(kv)
    for at in np.random.default_rng(5).integers(0, kv.size, 200).tolist():
        kv[at] ^= 0x80
        assert kv_checksum(kv) != good, at
        kv[at] ^= 0x80


def _swapped(kv: npt.NDArray[np.uint8], a: int, b: int) -> npt.NDArray[np.uint8]:
    """A copy of ``kv`` with 64-bit words ``a`` and ``b`` swapped."""
    out = kv.copy()
    words = out[: kv.size // 8 * 8].view("<u8")
    words[a], words[b] = words[b], words[a]
    return out


def test_two_words_swapped_in_one_row_are_detected() -> None:
    kv = page(4 * ROW_BYTES, seed=6)
    words = kv.view("<u8")
    good = kv_checksum(kv)
    rng = np.random.default_rng(7)
    for _ in range(300):
        row = int(rng.integers(4))
        a, b = (row * 512 + int(c) for c in rng.choice(512, 2, replace=False))
        assert words[a] != words[b]
        assert kv_checksum(_swapped(kv, a, b)) != good, (a, b)
    # columns 64 words apart (the classes a cheaper one-pass code would merge)
    assert kv_checksum(_swapped(kv, 5, 5 + 64)) != good


def test_two_words_swapped_in_one_column_are_detected() -> None:
    kv = page(6 * ROW_BYTES, seed=8)
    good = kv_checksum(kv)
    rng = np.random.default_rng(9)
    for _ in range(300):
        col = int(rng.integers(512))
        r1, r2 = rng.choice(6, 2, replace=False)
        assert kv_checksum(_swapped(kv, int(r1) * 512 + col, int(r2) * 512 + col)) != good


def test_swapped_or_repeated_4_kib_rows_are_detected() -> None:
    kv = page(8 * ROW_BYTES, seed=10)
    rows = kv.reshape(8, ROW_BYTES)
    good = kv_checksum(kv)
    swapped = rows[[0, 1, 5, 3, 4, 2, 6, 7]].reshape(-1)
    assert kv_checksum(swapped) != good
    repeated = rows[[0, 1, 2, 3, 3, 5, 6, 7]].reshape(-1)  # a row written twice, one lost
    assert kv_checksum(repeated) != good
    zeroed = kv.copy()
    zeroed[2 * ROW_BYTES : 3 * ROW_BYTES] = 0  # a torn write left a block of zeros
    assert kv_checksum(zeroed) != good


def test_a_zeroed_or_truncated_tail_and_a_truncated_page_are_detected() -> None:
    kv = page(2 * ROW_BYTES + 300, seed=11)
    good = kv_checksum(kv)
    zeroed = kv.copy()
    zeroed[2 * ROW_BYTES :] = 0
    assert kv_checksum(zeroed) != good
    for cut in (1, 8, 300, 301, ROW_BYTES + 300):
        assert kv_checksum(kv[:-cut]) != good, cut
    # records check their lengths before the checksum: see test_record_v3


def test_a_rectangle_of_compensating_changes_is_not_detected() -> None:
    """The documented blind spot: +d and -d on two words of one row, -d and
    +d on the same columns of another row keep every row and column sum."""
    kv = page(4 * ROW_BYTES, seed=12)
    words = kv.view("<u8")
    good = kv_checksum(kv)
    d = np.uint64(12345)
    with np.errstate(over="ignore"):
        words[0 * 512 + 7] += d
        words[0 * 512 + 9] -= d
        words[2 * 512 + 7] -= d
        words[2 * 512 + 9] += d
    assert kv_checksum(kv) == good

"""The KV checksum of a storage record (version 3): a 2-D sum code, folded by crc32.

A page's KV bytes are read as little-endian 64-bit words, laid out in rows
of 512 words (4 KiB); the bytes after the last full row are the tail::

             col 0    col 1   ...   col 511
    row 0    w[0]     w[1]    ...   w[511]      --> row sum 0
    row 1    w[512]   w[513]  ...   w[1023]     --> row sum 1
    ...
    row R-1  ...                                --> row sum R-1
               |        |             |
               v        v             v
             col sum 0 ...          col sum 511
    tail     n mod 4096 bytes, taken as they are

    checksum = crc32(row sums || column sums || tail), each sum a
               little-endian uint64 (sums wrap modulo 2**64)

Why: two numpy reductions (row sums, column sums) run at memory speed,
where zlib's crc32 runs at ~7 GB/s on this machine; only the summary
(8 B per 4 KiB row, plus 4 KiB of column sums and the tail) goes through
crc32, ~1 us for a 2 MiB page.

What it catches, beyond the 2**-32 chance that the final crc32 collides:

* any change to one word (a flipped bit changes a word by +-2**k, never 0
  modulo 2**64): its row sum changes;
* any change confined to one row or one column that does not sum to 0
  there, any number of bits;
* two unequal words swapped: in one row, their column sums change; in one
  column, their row sums change; anywhere else, both;
* two 4 KiB rows swapped or one copied over another (unless the two rows
  have equal sums): the row sums change order or value;
* any change to the tail (crc32 of its bytes: every burst up to 32 bits);
* truncation and padding: the record's lengths are checked before this.

What it misses: changes that keep every row sum and every column sum, e.g.
+d and -d on two words of one row together with -d and +d on the same two
columns of another row, or a permutation of equal words. It is an
accident detector, not a MAC: anyone who can write the store can forge a
matching checksum. Records also carry and check the full key (keys are
blake2b digests of the tokens), the namespace tag, the token ids and the
model fingerprint; those are compared, not summed.

Numpy reduces unaligned buffers correctly (more slowly: an LMDB value's KV
bytes need not be 8-aligned); readers sum the copy in the host page, which
is aligned.

Records are read and written by copying their KV bytes (out of a value into
a host page, out of a host page into a record), and ``copy_checksum`` takes
the checksum of what it copies. Below it is numpy's copy, then the sums over
the copy: three passes over the bytes. The engine may hand in one C pass
that copies and sums at once (``use_copy_sums``: its compiled core's
``copy_sums``, at about the speed of the copy alone), and one that sums
where the bytes lie (``use_sums``: ``kv_sums``, one pass instead of numpy's
two, without the GIL), which ``kv_checksum`` then takes: a pool writer sends
the host page itself and sums it there, a pool reader sums the page it
received into. This layer imports nothing above it, so it does not look for
either itself.
"""

from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

ROW_WORDS = 512  # 64-bit words per row
ROW_BYTES = 8 * ROW_WORDS  # 4 KiB
_WORDS = np.dtype("<u8")  # explicit: records move between machines

# (src, offset, dst) -> (row sums, column sums) in this machine's byte order,
# dst holding a copy of src[offset:]: the engine's compiled pass, or None.
CopySums = Callable[[object, int, npt.NDArray[np.uint8]], tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]
_copy_sums: CopySums | None = None
# (src) -> (row sums, column sums) of src's bytes where they lie: the engine's
# compiled pass, or None.
Sums = Callable[[object], tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]
_sums: Sums | None = None


def use_copy_sums(fn: CopySums | None) -> None:
    """Copy and sum with ``fn`` from now on (None: numpy's copy, then
    ``kv_checksum``). Ignored on a big-endian machine, where the sums of
    native words are not the little-endian ones records carry."""
    global _copy_sums
    _copy_sums = fn if sys.byteorder == "little" else None


def use_sums(fn: Sums | None) -> None:
    """Sum with ``fn`` in ``kv_checksum`` from now on (None: numpy's two
    reductions). Ignored on a big-endian machine, as ``use_copy_sums``."""
    global _sums
    _sums = fn if sys.byteorder == "little" else None


def _fold(row_sums: npt.NDArray[np.uint64], col_sums: npt.NDArray[np.uint64],
          flat: npt.NDArray[np.uint8], start: int) -> int:  # fmt: skip
    """The checksum from a compiled pass's sums (native order, on a
    little-endian machine the records' order) and the tail of ``flat``."""
    crc = start
    if row_sums.size:
        crc = zlib.crc32(row_sums.data, crc)
        crc = zlib.crc32(col_sums.data, crc)
    tail = flat.size % ROW_BYTES
    if tail:
        crc = zlib.crc32(flat[flat.size - tail :].data, crc)
    return crc


def kv_checksum(kv: npt.NDArray[np.uint8], start: int = 0) -> int:
    """The checksum of the bytes of ``kv`` in C order (a host page: one
    contiguous block; a strided view is summed from a copy), chained onto
    ``start`` (a crc32 value, e.g. of the record's head) the way
    ``zlib.crc32(data, start)`` chains. Reads ``kv``; mutates nothing."""
    if not kv.flags.c_contiguous:  # (a strided view: summed from a copy)
        kv = np.ascontiguousarray(kv)
    flat = kv.reshape(-1)
    fused = _sums
    if fused is not None:
        return _fold(*fused(flat), flat, start)
    rows = flat.size // ROW_BYTES
    crc = start
    if rows:
        words = flat[: rows * ROW_BYTES].view(_WORDS).reshape(rows, ROW_WORDS)
        # einsum's row sums run ~1.4x faster here than words.sum(axis=1)
        row_sums = np.einsum("ij->i", words)
        crc = zlib.crc32(row_sums.astype(_WORDS, copy=False), crc)
        crc = zlib.crc32(words.sum(axis=0).astype(_WORDS, copy=False), crc)
    if flat.size > rows * ROW_BYTES:
        crc = zlib.crc32(flat[rows * ROW_BYTES :].data, crc)
    return crc



def copy_checksum(src: object, offset: int, dst: npt.NDArray[np.uint8], start: int = 0) -> int:
    """Copy the bytes of ``src`` (a buffer) from ``offset`` on into ``dst``
    (a C-contiguous page of exactly that many bytes) and return their
    checksum, chained onto ``start``: ``kv_checksum(dst, start)`` after the
    copy, taken in the same pass when the engine handed in one (module doc).
    Mutates ``dst`` only."""
    if not dst.flags.c_contiguous:
        raise ValueError("copy_checksum copies into a C-contiguous page only")
    flat = dst.reshape(-1)
    fused = _copy_sums
    if fused is None:
        np.copyto(flat, np.frombuffer(src, dtype=np.uint8, offset=offset))  # type: ignore[call-overload]
        return kv_checksum(flat, start)
    return _fold(*fused(src, offset, flat), flat, start)


class LateChecksum:
    """A buffer (a record's head) whose KV checksum field is still to fill:
    ``finish`` writes ``kv_checksum(kv, crc)`` at ``at`` (a little-endian
    uint32), once, and returns the buffer.

    For a writer that sends the head and, right after it, the KV bytes
    themselves (a host page, not copied): summed just before the send, the
    page is in the processor's cache when the send copies it, so it is read
    from memory once. Summed when the head is built, a whole send chunk
    before it goes out, it is read from memory twice."""

    __slots__ = ("buf", "_at", "_crc", "_kv")

    def __init__(self, buf: bytearray, at: int, crc: int, kv: npt.NDArray[np.uint8]) -> None:
        self.buf = buf
        self._at = at
        self._crc = crc
        self._kv: npt.NDArray[np.uint8] | None = kv

    def __len__(self) -> int:
        return len(self.buf)

    def after(self, prefix: bytes) -> LateChecksum:
        """The same, with ``prefix`` before the buffer (e.g. a chunk's head)."""
        if self._kv is None:
            raise RuntimeError("the checksum was already written: prefix the buffer before")
        return LateChecksum(bytearray(prefix) + self.buf, self._at + len(prefix), self._crc, self._kv)

    def finish(self) -> bytearray:
        """The buffer, its checksum written (taken now, the first time)."""
        kv = self._kv
        if kv is not None:
            struct.pack_into("<I", self.buf, self._at, kv_checksum(kv, self._crc))
            self._kv = None
        return self.buf

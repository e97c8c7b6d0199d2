"""The on-disk format of one stored page: an LMDB key and a self-checking value.

Key (24 bytes), bound to the model fingerprint (invariant 8)::

    [ fingerprint digest (8) | page key (16) ]

so records of one fingerprint sort together and a store written for another
model, layout or rank never answers a lookup.

Value, one page per record::

    offset   size    field
    0        4       magic b"RXKV"
    4        2       format version (1)
    6        2       reserved (0)
    8        4       crc32 of every byte after this field (header rest,
                     tokens, KV bytes)
    12       4       token count (P)
    16       8       KV byte count (spec.page_bytes)
    24       8       write sequence number (recency order after a restart)
    32       16      namespace tag (the namespace index's key)
    48       4 * P   token ids, little-endian int32
    48 + 4P  ...     KV bytes, in the host pool's page-first layout

The checksum is zlib's crc32: it runs at ~4 GB/s here, 3.5x blake2b (1.2 GB/s)
and 2x sha1, and catches every burst error up to 32 bits; the record is a
cache entry, not a security boundary. A read copies the KV bytes into the
destination host page first and checksums that copy, so what is verified is
exactly what is served.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import numpy as np
import numpy.typing as npt

MAGIC = b"RXKV"
VERSION = 1
HEADER = struct.Struct("<4sHHIIQQ16s")  # see the table above; 48 bytes
_CRC = struct.Struct("<I")
_CRC_OFFSET = 8  # where the crc32 field sits
_COVERED = 12  # the crc covers value[_COVERED:]
FINGERPRINT_BYTES = 8  # the key prefix
NS_TAG_BYTES = 16

assert HEADER.size == 48, HEADER.size


def record_key(prefix: bytes, page_key: bytes) -> bytes:
    """The LMDB key of a page key under a fingerprint digest ``prefix``."""
    return prefix + page_key


def namespace_tag(prefix: bytes, namespace: bytes) -> bytes:
    """The namespace index key: bound to the fingerprint like record keys."""
    return hashlib.blake2b(namespace, digest_size=NS_TAG_BYTES, key=prefix).digest()


def record_size(page_size: int, page_bytes: int) -> int:
    """Bytes of one record value for pages of ``page_size`` tokens."""
    return HEADER.size + 4 * page_size + page_bytes


def encode_into(
    out: bytearray,
    kv: npt.NDArray[np.uint8],
    tokens: npt.NDArray[np.int32],
    seq: int,
    ns_tag: bytes,
) -> None:
    """Write the record of page bytes ``kv`` holding ``tokens`` into ``out``.

    ``out`` must be exactly ``record_size`` bytes. The writer reuses one such
    buffer for every record: a fresh 2 MiB allocation per page costs more in
    page faults than the checksum does.
    """
    p = int(tokens.size)
    kv_at = HEADER.size + 4 * p
    assert len(out) == kv_at + kv.size, f"record buffer of {len(out)} B for {kv_at + kv.size} B"
    view = np.frombuffer(out, dtype=np.uint8)
    view[HEADER.size : kv_at] = tokens.astype("<i4", copy=False).view(np.uint8)
    view[kv_at:] = kv
    HEADER.pack_into(out, 0, MAGIC, VERSION, 0, 0, p, kv.size, seq, ns_tag)
    _CRC.pack_into(out, _CRC_OFFSET, zlib.crc32(memoryview(out)[_COVERED:]))


def read_into(
    value: memoryview | bytes, tokens: npt.NDArray[np.int32], dst: npt.NDArray[np.uint8]
) -> bool:
    """Verify a record against ``tokens`` and copy its KV bytes into ``dst``.

    True only if the layout, the token ids and the checksum all match. On
    False, ``dst`` may already have been overwritten.
    """
    p = int(tokens.size)
    kv_at = HEADER.size + 4 * p
    if len(value) != kv_at + dst.size:
        return False  # truncated, padded, or written for another page size
    magic, version, _reserved, crc, count, kv_bytes, _seq, _tag = HEADER.unpack_from(value, 0)
    if magic != MAGIC or version != VERSION or count != p or kv_bytes != dst.size:
        return False
    src = np.frombuffer(value, dtype=np.uint8)
    if not np.array_equal(src[HEADER.size : kv_at].view("<i4"), tokens):
        return False
    np.copyto(dst, src[kv_at:])
    view = memoryview(value)
    return zlib.crc32(dst.data, zlib.crc32(view[_COVERED:kv_at])) == crc


def read_seq(value: memoryview | bytes) -> int | None:
    """The write sequence number of a record, or None if it has no header."""
    if len(value) < HEADER.size or bytes(value[:4]) != MAGIC:
        return None
    seq: int = HEADER.unpack_from(value, 0)[6]
    return seq


def read_namespace_tag(value: memoryview | bytes) -> bytes | None:
    """The namespace tag of a record (a copy), or None if it has no header."""
    if len(value) < HEADER.size or bytes(value[:4]) != MAGIC:
        return None
    tag: bytes = HEADER.unpack_from(value, 0)[7]
    return tag

"""The stored form of one page: a self-checking value, the same bytes in every
storage backend (LMDB on local disk, a shared pool).

A record proves on every read that it belongs where it was found: it carries
the full key it was written under, the namespace tag, the token ids (or the
raw flag for pages an engine keys itself), the KV byte count and a checksum.
A value moved under another key or another tenant's key, truncated, written
for another page size or flipped by one bit fails the read: a miss, never a
hit. It also carries what a router needs to hear of the page after a restart
(block id, parent block id, depth, namespace info), so the pages found in
storage at start can be announced.

Value layout (version 3; all integers little-endian)::

    offset  size  field
    0       4     magic b"RXKV"
    4       2     format version (3; 2 is still read)
    6       2     flags: bit 0 = raw page (no token ids; the engine's own key),
                  bit 1 = sealed (encrypted at rest: the layout after the key
                  is offload/storage/crypt/sealed.py's, the checksum field 0)
    8       4     checksum (below)
    12      4     token count T (the page size; 0 for a raw page)
    16      8     KV byte count
    24      8     write sequence number (recency order after a restart)
    32      16    namespace tag (the forget index's key; bound to the fingerprint)
    48      8     block id: the page's event id, signed; -1 = none
    56      8     parent block id; -1 = none (first page of its prefix)
    64      4     depth: page index within its prefix (0 for raw pages)
    68      2     key length K
    70      2     info length I
    72      K     the full key the record was written under
    72+K    I     info: engine bytes describing the namespace for events
    ...     4T    token ids, int32
    ...     rest  KV bytes, in the host pool's page-first layout

Checksum, version 3: ``kv_checksum(KV, crc32(bytes 12 .. KV start))``, the
2-D sum code of offload/storage/kv_checksum.py over the KV bytes (row and column
sums of 64-bit words, folded by crc32) chained onto a crc32 of the rest of
the head; it runs at memory speed, where zlib's crc32 runs at ~7 GB/s here.
Version 2 (the same layout) held ``crc32(bytes 12 .. end)``; its records,
written before the upgrade, are still read and verified that way.

Keys and namespace tags are compared, not hashed, and token ids compared
too, so the checksum only has to catch accidents (see offload/storage/kv_checksum.py
for what it does and does not catch), not adversaries: a forged value would
have to be written into the store by someone who can write any bytes there
anyway. A read copies the KV bytes into the destination page first and
checksums that copy, so what is verified is exactly what is served.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage.kv_checksum import LateChecksum, copy_checksum, kv_checksum

MAGIC = b"RXKV"
VERSION = 3  # written
VERSION_CRC32 = 2  # read: the checksum is zlib's crc32 of bytes 12 .. end
FLAG_RAW = 1  # no token ids: a page keyed by the engine itself
FLAG_SEALED = 2  # encrypted at rest (offload/storage/crypt/sealed.py)
HEADER = struct.Struct("<4sHHIIQQ16sqqIHH")  # see the table above; 72 bytes
_CRC = struct.Struct("<I")
_CRC_OFFSET = 8  # where the checksum field sits
_COVERED = 12  # the checksum covers value[_COVERED:]
FINGERPRINT_BYTES = 8  # the key prefix of every record of one fingerprint
NS_TAG_BYTES = 16
MAX_KEY_BYTES = 256 + FINGERPRINT_BYTES  # full keys: fingerprint digest + page key
MAX_INFO_BYTES = 4096

assert HEADER.size == 72, HEADER.size


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """What a record says about its page, besides the KV bytes."""

    key: bytes  # the full key it was written under
    ns_tag: bytes  # namespace tag
    block_id: int | None  # the page's event id
    parent_block_id: int | None  # the previous page's event id; None for a first page
    depth: int  # page index within its prefix
    seq: int  # write sequence number
    info: bytes  # engine bytes describing the namespace (may be empty)
    num_tokens: int  # token ids held (0 for a raw page)
    kv_bytes: int  # KV bytes held
    raw: bool  # a raw page (engine key, no token ids)


def record_key(prefix: bytes, page_key: bytes) -> bytes:
    """The full key of a page key under a fingerprint digest ``prefix``."""
    return prefix + page_key


def namespace_tag(prefix: bytes, namespace: bytes) -> bytes:
    """The namespace tag: bound to the fingerprint like record keys."""
    return hashlib.blake2b(namespace, digest_size=NS_TAG_BYTES, key=prefix).digest()


def record_size(key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> int:
    """Bytes of one record value."""
    return HEADER.size + key_len + info_len + 4 * num_tokens + kv_bytes


def _id(value: int | None) -> int:
    if value is None:
        return -1
    if not 0 <= value < 2**63:
        raise ValueError(f"block ids lie in [0, 2**63), got {value}")
    return value


def encode_into(
    out: bytearray | memoryview,
    *,
    key: bytes,
    ns_tag: bytes,
    tokens: npt.NDArray[np.int32] | None,
    kv: npt.NDArray[np.uint8],
    seq: int,
    block_id: int | None = None,
    parent_block_id: int | None = None,
    depth: int = 0,
    info: bytes = b"",
) -> None:
    """Write the record of page bytes ``kv`` into ``out`` (exactly
    ``record_size`` bytes; writers reuse one buffer: a fresh 2 MiB allocation
    per page costs more in page faults than the checksum). ``tokens`` None
    writes a raw page."""
    kv_at = head_size(len(key), len(info), 0 if tokens is None else int(tokens.size))
    if len(out) != kv_at + kv.size:
        raise ValueError(f"record buffer of {len(out)} B for a record of {kv_at + kv.size} B")
    head_crc = _write_head(
        memoryview(out)[:kv_at], key=key, ns_tag=ns_tag, tokens=tokens, kv_size=kv.size,
        seq=seq, block_id=block_id, parent_block_id=parent_block_id, depth=depth, info=info,
    )  # fmt: skip
    # the bytes copied are summed as they are copied (a bad copy into ``out``
    # fails its reads)
    summed = copy_checksum(np.ascontiguousarray(kv).reshape(-1), 0, np.frombuffer(out, dtype=np.uint8)[kv_at:], head_crc)
    _CRC.pack_into(out, _CRC_OFFSET, summed)


def pack_header(
    head: memoryview,
    *,
    flags: int,
    num_tokens: int,
    kv_size: int,
    seq: int,
    ns_tag: bytes,
    block_id: int | None,
    parent_block_id: int | None,
    depth: int,
    key: bytes,
    info_len: int,
) -> None:
    """Check a record's fields and write its header (checksum field 0) and
    its key into ``head`` (at least ``HEADER.size + len(key)`` bytes); what
    follows the key is the caller's (clear: info and token ids; sealed:
    offload/storage/crypt/sealed.py)."""
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"record keys are 1 to {MAX_KEY_BYTES} bytes, got {len(key)}")
    if len(ns_tag) != NS_TAG_BYTES:
        raise ValueError(f"namespace tags are {NS_TAG_BYTES} bytes, got {len(ns_tag)}")
    if info_len > MAX_INFO_BYTES:
        raise ValueError(f"record info is at most {MAX_INFO_BYTES} bytes, got {info_len}")
    head[HEADER.size : HEADER.size + len(key)] = key
    HEADER.pack_into(
        head, 0, MAGIC, VERSION, flags, 0, num_tokens, kv_size, seq,
        ns_tag, _id(block_id), _id(parent_block_id), depth, len(key), info_len,
    )  # fmt: skip


def _write_head(
    head: memoryview,
    *,
    key: bytes,
    ns_tag: bytes,
    tokens: npt.NDArray[np.int32] | None,
    kv_size: int,
    seq: int,
    block_id: int | None,
    parent_block_id: int | None,
    depth: int,
    info: bytes,
) -> int:
    """Write a record's head (every byte before the KV bytes; checksum field
    0) into ``head`` (exactly ``head_size`` bytes), checking every field.
    Returns the crc32 of the head's bytes that the checksum covers, for
    ``kv_checksum`` to chain onto."""
    t = 0 if tokens is None else int(tokens.size)
    tok_at = HEADER.size + len(key) + len(info)
    assert len(head) == tok_at + 4 * t, f"head buffer of {len(head)} B for {tok_at + 4 * t} B"
    pack_header(
        head, flags=0 if tokens is not None else FLAG_RAW, num_tokens=t, kv_size=kv_size,
        seq=seq, ns_tag=ns_tag, block_id=block_id, parent_block_id=parent_block_id,
        depth=depth, key=key, info_len=len(info),
    )  # fmt: skip
    head[HEADER.size + len(key) : tok_at] = info
    if tokens is not None:
        head[tok_at:] = tokens.astype("<i4", copy=False).reshape(-1).view(np.uint8).data
    return zlib.crc32(head[_COVERED:])


def parse_header(value: memoryview | bytes) -> tuple[int, ...] | None:
    """The header fields (``HEADER``'s order) of a record of a version this
    code reads, whatever its flags, else None."""
    if len(value) < HEADER.size:
        return None
    fields: tuple[int, ...] = HEADER.unpack_from(value, 0)
    if fields[0] != MAGIC or fields[1] not in (VERSION, VERSION_CRC32):
        return None
    return fields


def _checksum_matches(
    h: tuple[int, ...], head: bytes | memoryview, kv: npt.NDArray[np.uint8]
) -> bool:
    """Whether the stored checksum (header ``h``) matches ``head`` (every byte
    before the KV bytes) and the KV bytes ``kv``, by the record's version."""
    covered = zlib.crc32(memoryview(head)[_COVERED:])
    if h[1] == VERSION_CRC32:
        return zlib.crc32(kv.reshape(-1).data, covered) == h[3]
    return kv_checksum(kv, covered) == h[3]


def read_into(
    value: memoryview | bytes,
    *,
    key: bytes,
    ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None,
    dst: npt.NDArray[np.uint8],
) -> bool:
    """Verify a record and copy its KV bytes into ``dst``.

    True only if it is a record (version 3, or 2) written under exactly ``key``, for
    ``ns_tag`` (unless None: not known to the reader), holding ``tokens``
    (None: a raw page, and the record must be raw), ``dst.size`` KV bytes, and
    its checksum matches the copy in ``dst``. On False, ``dst`` may already
    have been overwritten.
    """
    kv_at = len(value) - dst.size  # the head ends where the KV bytes begin
    if kv_at < HEADER.size:
        return False
    view = memoryview(value)
    return read_split_into(view[:kv_at], view[kv_at:], key=key, ns_tag=ns_tag, tokens=tokens, dst=dst)


def read_split_into(
    head: bytes | memoryview, tail: memoryview, *, key: bytes, ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
) -> bool:  # fmt: skip
    """``read_into`` for a record kept in two places: ``head`` (every byte
    before the KV bytes) and ``tail`` (the KV bytes, e.g. a view of a mapped
    file), copied into ``dst`` and summed in one pass. Same checks."""
    h = parse_header(head)
    if h is None or len(tail) != dst.size:
        return False
    if not _head_matches(head, h, key, ns_tag, tokens, dst.size):
        return False
    if h[1] == VERSION_CRC32:  # (an older record: the copy, then its crc32)
        np.copyto(dst.reshape(-1), np.frombuffer(tail, dtype=np.uint8))
        return _checksum_matches(h, head, dst)
    covered = zlib.crc32(memoryview(head)[_COVERED:])
    return copy_checksum(tail, 0, dst, covered) == h[3]  # (copied and summed in one pass)


def _head_matches(
    head: bytes | memoryview,
    h: tuple[int, ...],
    key: bytes,
    ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None,
    kv_size: int,
) -> bool:
    """Every check of a record but its checksum, on its head (every byte
    before the KV bytes) and parsed header ``h``: a record layout of exactly
    this length, written under ``key``, for ``ns_tag`` (None: not known),
    holding ``tokens`` (None: a raw page) and ``kv_size`` KV bytes."""
    _m, _v, flags, _crc, count, kv_bytes, _seq, tag, _b, _p, _d, klen, ilen = h
    t = 0 if tokens is None else int(tokens.size)
    if bool(flags & FLAG_RAW) != (tokens is None) or count != t or kv_bytes != kv_size:
        return False
    if len(head) != head_size(klen, ilen, t) or klen != len(key):
        return False  # truncated, padded, or another key's length
    if memoryview(head)[HEADER.size : HEADER.size + klen] != key:
        return False  # stored under another key than it was written for
    if ns_tag is not None and tag != ns_tag:
        return False  # another tenant's page
    if tokens is None:
        return True
    stored = memoryview(head)[HEADER.size + klen + ilen :]
    return stored == tokens.astype("<i4", copy=False).reshape(-1).view(np.uint8).data


def read_meta(value: memoryview | bytes) -> RecordMeta | None:
    """The header fields of a record (no KV bytes read), or None if ``value``
    is not a record of a version this code reads."""
    h = parse_header(value)
    if h is None:
        return None
    _m, _v, flags, _crc, count, kv_bytes, seq, tag, bid, pid, depth, klen, ilen = h
    if len(value) < HEADER.size + klen + ilen + 4 * count:
        return None
    view = memoryview(value)
    return RecordMeta(
        key=bytes(view[HEADER.size : HEADER.size + klen]),
        ns_tag=bytes(tag),
        block_id=None if bid < 0 else bid,
        parent_block_id=None if pid < 0 else pid,
        depth=depth,
        seq=seq,
        info=bytes(view[HEADER.size + klen : HEADER.size + klen + ilen]),
        num_tokens=count,
        kv_bytes=kv_bytes,
        raw=bool(flags & FLAG_RAW),
    )


def read_tokens(value: memoryview | bytes) -> npt.NDArray[np.int32]:
    """A copy of a record's token ids (empty for a raw page or a non-record)."""
    h = parse_header(value)
    if h is None:
        return np.empty(0, dtype=np.int32)
    count, klen, ilen = h[4], h[11], h[12]
    at = HEADER.size + klen + ilen
    return np.frombuffer(value, dtype="<i4", count=count, offset=at).astype(np.int32)


def read_seq(value: memoryview | bytes) -> int | None:
    """The write sequence number of a record, or None if it is not a record."""
    h = parse_header(value)
    return None if h is None else h[6]


def read_namespace_tag(value: memoryview | bytes) -> bytes | None:
    """The namespace tag of a record (a copy), or None if it is not a record."""
    h = parse_header(value)
    return None if h is None else bytes(h[7])


def page_record_size(page_size: int, page_bytes: int, info_len: int = 0) -> int:
    """Bytes of the record of one tree page (a 16-byte page key under the
    fingerprint prefix, ``page_size`` token ids), for capacity planning."""
    return record_size(FINGERPRINT_BYTES + 16, info_len, page_size, page_bytes)


def head_size(key_len: int, info_len: int, num_tokens: int) -> int:
    """Bytes of a record before its KV bytes (header, key, info, token ids)."""
    return HEADER.size + key_len + info_len + 4 * num_tokens


def encode_head(
    out: bytearray | memoryview,
    *,
    key: bytes,
    ns_tag: bytes,
    tokens: npt.NDArray[np.int32] | None,
    kv: npt.NDArray[np.uint8],
    seq: int,
    block_id: int | None = None,
    parent_block_id: int | None = None,
    depth: int = 0,
    info: bytes = b"",
    late: bool = False,
) -> LateChecksum | None:
    """Write everything of ``kv``'s record but the KV bytes into ``out``
    (exactly ``head_size`` bytes): the record is ``out`` followed by ``kv``,
    byte for byte what ``encode_into`` writes. For writers that send the two
    parts without joining them (no copy of the KV bytes); ``kv`` is read for
    the checksum only. With ``late`` (``out`` a bytearray) the checksum
    field stays 0 and the returned ``LateChecksum`` writes it when finished;
    ``kv`` must not change until then."""
    size = head_size(len(key), len(info), 0 if tokens is None else int(tokens.size))
    if len(out) != size:
        raise ValueError(f"record head buffer of {len(out)} B for a head of {size} B")
    if late and not isinstance(out, bytearray):
        raise TypeError("a late checksum is written into a bytearray head (the LateChecksum keeps it)")
    head_crc = _write_head(
        memoryview(out), key=key, ns_tag=ns_tag, tokens=tokens, kv_size=kv.size, seq=seq,
        block_id=block_id, parent_block_id=parent_block_id, depth=depth, info=info,
    )  # fmt: skip
    if late:
        assert isinstance(out, bytearray)  # (checked above)
        return LateChecksum(out, _CRC_OFFSET, head_crc, kv)
    _CRC.pack_into(out, _CRC_OFFSET, kv_checksum(kv, head_crc))
    return None


def late_head(**fields: Any) -> LateChecksum:
    """``encode_head(..., late=True)`` (the same keywords) into a new buffer:
    the head with its checksum left to whoever sends the KV bytes, to take
    right before (``LateChecksum.finish``)."""
    tokens, info = fields["tokens"], fields.get("info", b"")
    out = bytearray(head_size(len(fields["key"]), len(info), 0 if tokens is None else int(tokens.size)))
    late = encode_head(out, late=True, **fields)
    assert late is not None
    return late


def verify_parts(
    head: bytes | memoryview, kv: npt.NDArray[np.uint8], *, key: bytes, ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None,
) -> bool:  # fmt: skip
    """``read_into`` for a record already read in two parts, where they belong:
    ``head`` (every byte before the KV bytes) and ``kv`` (the KV bytes, e.g.
    received straight into a host page). Same checks, no copy."""
    h = parse_header(head)
    if h is None or not _head_matches(head, h, key, ns_tag, tokens, kv.size):
        return False
    return _checksum_matches(h, head, kv)

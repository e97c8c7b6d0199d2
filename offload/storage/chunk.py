"""Several pages in one stored value: a chunk of self-checking records.

A backend may store a run of consecutive pages of one prefix as one value
(a shared pool does: fewer keys, fewer commands per page). The unit inside
stays one self-checking record per page (``record.py``), verified on its
own on every read, so a chunk adds framing only::

    offset  size  field (little-endian)
    0       4     magic b"RXCK"
    4       2     chunk version (1)
    6       2     count m: records that follow, 2 to MAX_RECORDS
    8       ...   m records, back to back, in page order (each one exactly
                  as record.py lays it out: header, key, info, tokens, KV)

A value of one page is that page's bare record (magic b"RXKV"), the same
bytes as before chunks existed, so stores written one page per value are
read unchanged. Nothing in the framing is trusted: a count or record
length that does not add up makes the value unreadable past that point,
and every record is checked against the key, tokens and checksum the
reader expects, so a forged or damaged frame can only cost hits.

A per-record transform (encryption at rest, offload/storage/crypt/) applies
to each record: every record of a chunk is sealed and verified on its own,
and the framing stays outside it. A sealed record is cut the same way: its
"head" is everything before its last KV-size bytes (``record_span``), as
``Framing.verify_parts`` takes it.
"""

from __future__ import annotations

import struct

from radixcache.offload.storage import record
from radixcache.offload.storage.crypt.codec import SEAL_BYTES

CHUNK_MAGIC = b"RXCK"
CHUNK_VERSION = 1
CHUNK = struct.Struct("<4sHH")  # magic, version, count: 8 bytes
MAX_RECORDS = 4096  # records one chunk may claim (a bound on what a reader trusts)
PREFIX_BYTES = CHUNK.size  # what ``value_count`` needs of a value's start


def chunk_head(count: int) -> bytes:
    """The 8 bytes that open a chunk of ``count`` records (2 or more)."""
    if not 2 <= count <= MAX_RECORDS:
        raise ValueError(f"a chunk holds 2 to {MAX_RECORDS} records, got {count}")
    return CHUNK.pack(CHUNK_MAGIC, CHUNK_VERSION, count)


def value_count(prefix: bytes | memoryview) -> int:
    """How many records a value claims to hold, from its first ``PREFIX_BYTES``
    bytes: the chunk's count, or 1 for anything else (a bare record, or a
    value that is no record at all: its one "record" fails verification)."""
    if len(prefix) >= CHUNK.size:
        magic, version, count = CHUNK.unpack_from(prefix, 0)
        if magic == CHUNK_MAGIC and version == CHUNK_VERSION and 2 <= count <= MAX_RECORDS:
            return int(count)
    return 1


def record_span(header: bytes | memoryview) -> tuple[int, int] | None:
    """(head bytes, KV bytes) of the record whose first ``record.HEADER.size``
    bytes are ``header``, read from its length fields; None if ``header`` is
    not the start of a record of a version this code reads. For readers that
    take a value apart as it arrives (the head into a buffer, the KV bytes
    straight into a page); the lengths are checked against the page later."""
    if len(header) < record.HEADER.size:
        return None
    fields = record.HEADER.unpack_from(header, 0)
    magic, version, flags, _crc, count, kv_bytes, *_rest, klen, ilen = fields
    if magic != record.MAGIC or version not in (record.VERSION, record.VERSION_CRC32):
        return None
    head = record.head_size(klen, ilen, count)
    if flags & record.FLAG_SEALED:  # sealed at rest: its last KV-size bytes end in its tag
        head += SEAL_BYTES
    return head, int(kv_bytes)


def split_value(value: bytes | memoryview) -> list[memoryview]:
    """The records of a stored value, in page order, as views of it.

    A bare record (or anything that is not a chunk) is one record: the value
    itself. A chunk is cut by its records' own length fields; where they do
    not add up (truncated, padded, forged), the rest of the value is one last
    "record" that fails verification, so pages up to there are still served."""
    view = memoryview(value)
    count = value_count(view[: CHUNK.size])
    if count == 1:
        return [view]
    out: list[memoryview] = []
    at = CHUNK.size
    for _ in range(count):
        span = record_span(view[at : at + record.HEADER.size])
        end = at + span[0] + span[1] if span is not None else -1
        if span is None or end > len(view):
            out.append(view[at:])  # unreadable from here on
            return out
        out.append(view[at:end])
        at = end
    if at != len(view):
        out[-1] = view[at - len(out[-1]) :]  # padded: the last record fails its length check
    return out

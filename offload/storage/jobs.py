"""The work a backend's threads do for the owner: read, put, delete, forget, invalidate a tag.

``StorageBase`` turns each call into one job, with every input validated and
copied (record keys, token ids, host page ids); the job is then owned by the
backend's threads until its ticket is finished. Keys in a job are **record
keys**: the fingerprint digest followed by the page key, the key every
record is written under and verified against (``record.FINGERPRINT_BYTES``
+ page key). A backend derives its own keys from them (LMDB uses them as
they are; a pool puts its key prefix before them).

``PutJob`` also frames its pages' records (``encode_into`` for a whole
record in a buffer, ``encode_parts`` for a head and a body sent without
joining them), so every backend writes the same bytes with the same event
ids, parents and depths. Both jobs carry the ``Framing`` their records are
framed and verified with (offload/storage/crypt/codec.py: in the clear, or
sealed with the key of the job's tenant); a backend never sees a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import record
from radixcache.offload.storage.contract import HostPages, PageBuffer, PutMeta, TokenPages
from radixcache.offload.storage.crypt.codec import PLAIN, Body, Framing
from radixcache.offload.storage.kv_checksum import LateChecksum
from radixcache.transfer.ticket import FutureTicket


def page_key(rkey: bytes) -> bytes:
    """The page key of a record key (the fingerprint digest cut off)."""
    return rkey[record.FINGERPRINT_BYTES :]


@dataclass(slots=True)
class ReadJob:
    """Read the pages of ``keys`` into host pages, verified, up to the first miss."""

    keys: list[bytes]  # record keys (fingerprint digest + page key)
    tokens: TokenPages | None  # [n, P] token ids, a private copy; None: raw pages
    host: PageBuffer  # the caller's page buffer (written on a reader thread)
    host_pages: HostPages  # [n] host page ids to fill, a private copy
    ns_tag: bytes | None  # the namespace tag records must carry; None: any
    ticket: FutureTicket  # finished with the leading pages served
    framing: Framing = PLAIN  # verifies the records (clear, or sealed: the tenant's key)
    note: Any = None  # the backend's own bookkeeping of this read (e.g. which value held a page)

    def token_row(self, i: int) -> npt.NDArray[np.int32] | None:
        """The token ids page ``i`` must hold (None: a raw page)."""
        return None if self.tokens is None else self.tokens[i]


@dataclass(slots=True)
class PutJob:
    """Write host pages as the records of ``keys`` (keys already stored are kept)."""

    keys: list[bytes]  # record keys (fingerprint digest + page key)
    tokens: TokenPages | None  # [n, P] token ids, a private copy; None: raw pages
    host: PageBuffer  # the caller's page buffer (read on the writer's threads)
    host_pages: HostPages  # [n] host page ids holding the pages, a private copy
    ns_tag: bytes  # the namespace tag written into each record
    ticket: FutureTicket  # finished with the leading keys stored
    meta: PutMeta | None = None  # event ids, parent, depth, info
    result: int = 0  # leading keys stored so far (a backend's bookkeeping)
    framing: Framing = PLAIN  # frames the records (clear, or sealed: the tenant's key)
    tenant: bytes | None = None  # the tenant put() named (a backend's quotas count it)

    def page_keys(self) -> list[bytes]:
        """The page keys of the job, in order."""
        return [page_key(k) for k in self.keys]

    def record_bytes(self, i: int) -> int:
        """Size of the record of page ``i``."""
        t = 0 if self.tokens is None else int(self.tokens.shape[1])
        info = 0 if self.meta is None else len(self.meta.info)
        return self.framing.record_size(len(self.keys[i]), info, t, self.host.page_bytes)

    def encode_into(self, out: bytearray, i: int, seq: int, kv: npt.NDArray[np.uint8]) -> None:
        """Write the whole record of page ``i`` (KV bytes ``kv``, write
        sequence number ``seq``) into ``out`` (exactly ``record_bytes(i)``)."""
        self.framing.encode_into(out, **self._fields(i, seq, kv))

    def encode_parts(self, i: int, seq: int, kv: npt.NDArray[np.uint8]) -> tuple[bytes, Body]:
        """Page ``i``'s record as (head, body), the record being the two
        joined: in the clear the body is ``kv`` itself (not copied: the caller
        keeps the page untouched until it is sent); sealed, its ciphertext."""
        return self.framing.encode_parts(**self._fields(i, seq, kv))

    def late_parts(
        self, i: int, seq: int, kv: npt.NDArray[np.uint8]
    ) -> tuple[bytes | LateChecksum, Body]:
        """``encode_parts``, but in the clear the head's checksum is taken by
        the sender (``LateChecksum.finish``, right before it sends ``kv``)."""
        if self.framing.sealed:  # (a sealed record carries no KV checksum)
            return self.encode_parts(i, seq, kv)
        return record.late_head(**self._fields(i, seq, kv)), kv.reshape(-1).data

    def encode_head(self, i: int, seq: int, kv: npt.NDArray[np.uint8]) -> bytes:
        """The head of page ``i``'s record in the clear: the record is this
        head followed by ``kv``, byte for byte. Sealed records are framed
        with ``encode_parts`` (their body is not ``kv``)."""
        head, _body = self.encode_parts(i, seq, kv)
        if self.framing.sealed:
            raise RuntimeError("a sealed record's body is its ciphertext: use encode_parts")
        return head

    def _fields(self, i: int, seq: int, kv: npt.NDArray[np.uint8]) -> dict[str, Any]:
        """The record fields of page ``i``: its key, tags and tokens, and the
        event ids ``meta`` gives it (its parent is the page before it)."""
        meta = self.meta
        return {
            "key": self.keys[i],
            "ns_tag": self.ns_tag,
            "tokens": None if self.tokens is None else self.tokens[i],
            "kv": kv,
            "seq": seq,
            "block_id": None if meta is None else int(meta.block_ids[i]),
            "parent_block_id": (
                None if meta is None
                else meta.parent_block_id if i == 0 else int(meta.block_ids[i - 1])
            ),
            "depth": 0 if meta is None else meta.first_depth + i,
            "info": b"" if meta is None else meta.info,
        }


@dataclass(slots=True)
class DeleteJob:
    """Remove the records of ``keys``."""

    keys: list[bytes]  # record keys
    ticket: FutureTicket | None  # None: a record a reader found corrupt
    result: int = 0  # records that existed and were removed

    def page_keys(self) -> list[bytes]:
        """The page keys of the job, in order."""
        return [page_key(k) for k in self.keys]


@dataclass(slots=True)
class ForgetJob:
    """Remove every record put under one namespace."""

    ns_tag: bytes  # the namespace tag
    ticket: FutureTicket  # finished with the records removed
    result: int = 0  # records removed


@dataclass(slots=True)
class TagJob(ForgetJob):
    """Remove every record of every namespace a put tagged with ``tag``
    (``Storage.invalidate_tag``): a forget of each of those namespaces
    (``ns_tag`` is unused)."""

    tag: str = ""  # the tag (checked: ``checks.check_tag``)


WriteJob = PutJob | DeleteJob | ForgetJob  # a TagJob is a ForgetJob: check for it first


def job_pages(job: WriteJob) -> int:
    """How many pages a write job weighs when jobs are merged into one step."""
    return 1 if isinstance(job, ForgetJob) else max(1, len(job.keys))

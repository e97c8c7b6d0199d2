"""The storage record in the pool: the only place the Valkey backend calls its format.

A record (radixcache.offload.record) is the same bytes as in LMDB: bound to
the full key it was written under, verified on every read. On the way out it
is sent as its head (header, key, info, token ids) followed by the host page
itself, so the KV bytes are never copied; on the way in the KV bytes land in
the host page and are checked there.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from radixcache.offload import record as rec
from radixcache.offload.storage import PutMeta
from radixcache.offload.valkey_link import Scattered


def encode_record(
    *,
    key: bytes,
    ns_tag: bytes,
    tokens: npt.NDArray[np.int32] | None,
    kv: npt.NDArray[np.uint8],
    seq: int,
    meta: PutMeta | None,
    index: int,
) -> Scattered:
    """The record of page ``index`` of a put (``meta`` gives its event ids), as
    its head plus the page itself: the KV bytes are sent from the host page,
    never copied (the caller leaves the page untouched until the ticket is done)."""
    info = b"" if meta is None else meta.info
    head = bytearray(rec.head_size(len(key), len(info), 0 if tokens is None else int(tokens.size)))
    rec.encode_head(
        head,
        key=key,
        ns_tag=ns_tag,
        tokens=tokens,
        kv=kv,
        seq=seq,
        block_id=None if meta is None else int(meta.block_ids[index]),
        parent_block_id=(
            None
            if meta is None
            else meta.parent_block_id if index == 0 else int(meta.block_ids[index - 1])
        ),
        depth=0 if meta is None else meta.first_depth + index,
        info=info,
    )
    return Scattered(bytes(head), kv.data)  # the host page itself, not a copy


def verify_record(
    value: bytes,
    *,
    key: bytes,
    ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None,
    dst: npt.NDArray[np.uint8],
) -> bool:
    """Verify a record read under ``key`` and copy its KV bytes into ``dst``."""
    return rec.read_into(value, key=key, ns_tag=ns_tag, tokens=tokens, dst=dst)


def verify_in_place(
    head: bytes,
    kv: npt.NDArray[np.uint8],
    *,
    key: bytes,
    ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None,
) -> bool:
    """Verify a record read as ``head`` plus KV bytes already in the host page ``kv``."""
    return rec.verify_parts(head, kv, key=key, ns_tag=ns_tag, tokens=tokens)

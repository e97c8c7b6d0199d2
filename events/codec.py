"""The msgpack wire codec for event batches.

Payload layout (one ZMQ message's third frame)::

    [ts: float, events: [event, ...], dp_rank: int | nil]      array of 3

    event (a map; "type" is always the first key):
      {"type": "BlockStored",
       "block_hashes": [int, ...],
       "parent_block_hash": int | nil,
       "token_ids": [int, ...],         # len == len(block_hashes) * block_size
       "block_size": int,
       "lora_id": int | nil,
       "medium": str,
       "lora_name": str | nil,
       "cache_salt": str,               # only for a salted namespace
       "extra_keys": [[...] | nil, ...]}  # only with a salt or extra keys; one per block
      {"type": "BlockRemoved", "block_hashes": [int, ...], "medium": str}
      {"type": "AllBlocksCleared"}

Every key of the first seven is always written, nil where empty: vLLM's and
SGLang's typed decoders declare them without defaults and refuse a map that
lacks one. ``cache_salt`` and ``extra_keys`` have defaults in those decoders,
so they are written only when they carry something. ``medium`` uses SGLang's
names (GPU, CPU_PINNED, DISK, EXTERNAL) unless the encoder is built with the
"vllm" vocabulary (GPU, CPU, STORAGE, EXTERNAL); the decoder reads both.

Encoding builds one map per record and packs the whole batch with one call
of a reused ``msgspec`` encoder (C, no Python work per token). Token ids may
be a list of ints or an integer numpy array (a page's tokens as the engine
keeps them); both give the same bytes.

Decoding is one typed ``msgspec`` pass into the structs below: every shape
and range the format promises is checked in C while the values are built,
which costs what a plain msgpack unpacking costs. What a struct cannot say
(the token count of a store, one extra key per block) is checked right after,
per event. A payload the typed pass refuses is decoded again by
``events.map_decoder``, which accepts exactly the same payloads and raises
a ``DecodeError`` naming the first problem. Keys a decoder does not know are
ignored, so producers may add fields without breaking consumers; where
``"type"`` stands in a map is not checked (vLLM's and SGLang's decoders find
it anywhere too, and finding out would cost a second parse of every event).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal, Union, get_args

import msgspec
import numpy as np

from radixcache.events.checks import check_events
from radixcache.events.map_decoder import CLEARED, CLEARED_EVENT, REMOVED, STORED, DecodeError, decode_maps
from radixcache.events.types import (
    GPU,
    HASH_LIMIT,
    MEDIUM_OF_WIRE,
    VOCABULARIES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

__all__ = ["BatchEncoder", "DecodeError", "check_events", "decode_batch", "decode_typed", "encode_batch"]

_CLEARED_MAP: Final[dict[str, str]] = {"type": CLEARED}


def _as_msgpack(obj: Any) -> Any:
    """What the encoder writes for a value msgspec does not know: an integer
    numpy array (token ids) as a list of ints."""
    if type(obj) is np.ndarray and obj.dtype.kind in "iu":
        return obj.tolist()
    raise TypeError(f"cannot put a {type(obj).__name__} on the event wire")


class BatchEncoder:
    """Encodes batches into payload bytes, reusing one encoder.

    ``media`` picks the medium vocabulary: "sglang" (the default) or "vllm".
    Records are read, never changed. Each thread that encodes owns its own
    encoder.
    """

    __slots__ = ("_encode", "_names")

    def __init__(self, media: str = "sglang") -> None:
        names = VOCABULARIES.get(media)
        if names is None:
            raise ValueError(f"media vocabulary must be one of {sorted(VOCABULARIES)}, got {media!r}")
        self._names = names
        self._encode = msgspec.msgpack.Encoder(enc_hook=_as_msgpack).encode

    def encode(self, events: Sequence[KvEvent], ts: float, dp_rank: int | None = None) -> bytes:
        """The payload of one batch of ``events`` published at ``ts``.

        Raises TypeError for a value that has no msgpack form (and for
        something that is not an event record); run ``check_events`` first
        for a full check of the records.
        """
        names = self._names
        maps: list[dict[str, Any]] = []
        add = maps.append
        for e in events:  # one map per record, keys in wire order, "type" first
            if type(e) is BlockStored:
                m: dict[str, Any] = {
                    "type": STORED,
                    "block_hashes": e.block_hashes,
                    "parent_block_hash": e.parent_block_hash,
                    "token_ids": e.token_ids,
                    "block_size": e.block_size,
                    "lora_id": e.lora_id,
                    "medium": names[e.medium or GPU],
                    "lora_name": e.lora_name,
                }
                if e.cache_salt is not None:
                    m["cache_salt"] = e.cache_salt
                if e.extra_keys is not None:
                    m["extra_keys"] = e.extra_keys
                add(m)
            elif type(e) is BlockRemoved:
                add({"type": REMOVED, "block_hashes": e.block_hashes, "medium": names[e.medium or GPU]})
            elif type(e) is AllBlocksCleared:
                add(_CLEARED_MAP)
            else:
                raise TypeError(f"not an event record: {type(e).__name__}")
        return self._encode((ts, maps, dp_rank))

    def encode_batch(self, batch: EventBatch) -> bytes:
        """The payload of ``batch``."""
        return self.encode(batch.events, batch.ts, batch.dp_rank)


def encode_batch(batch: EventBatch) -> bytes:
    """One-off encoding of ``batch`` (a loop should reuse a ``BatchEncoder``)."""
    return BatchEncoder().encode_batch(batch)


# --------------------------------------------------------------------------
# The typed pass: the wire as msgspec structs (gc=False: they hold no cycles
# and live only until their fields are moved into records).

_Hash = Annotated[int, msgspec.Meta(ge=0, le=HASH_LIMIT - 1)]
_Hashes = Annotated[list[_Hash], msgspec.Meta(min_length=1)]
_WireMedium = Literal["GPU", "CPU_PINNED", "DISK", "EXTERNAL", "CPU", "STORAGE"]  # both vocabularies
assert set(get_args(_WireMedium)) == set(MEDIUM_OF_WIRE), "wire media drifted from types.MEDIUM_OF_WIRE"


class _Stored(msgspec.Struct, tag_field="type", tag=STORED, gc=False):
    block_hashes: _Hashes
    token_ids: list[int]
    block_size: Annotated[int, msgspec.Meta(gt=0)]
    medium: _WireMedium
    parent_block_hash: _Hash | None = None
    lora_id: int | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class _Removed(msgspec.Struct, tag_field="type", tag=REMOVED, gc=False):
    block_hashes: _Hashes
    medium: _WireMedium


class _Cleared(msgspec.Struct, tag_field="type", tag=CLEARED, gc=False):
    pass


_Events = Annotated[list[Union[_Stored, _Removed, _Cleared]], msgspec.Meta(min_length=1)]
_TYPED = msgspec.msgpack.Decoder(tuple[float, _Events, Union[int, None]])


def decode_typed(payload: bytes) -> EventBatch | None:
    """The typed pass alone: the batch, or None where ``decode_maps`` is
    needed to say what is wrong (the two accept the same payloads)."""
    try:
        ts, wire, dp_rank = _TYPED.decode(payload)
    except (msgspec.DecodeError, TypeError, RecursionError):
        return None
    medium_of = MEDIUM_OF_WIRE
    events: list[KvEvent] = []
    add = events.append
    for e in wire:
        if type(e) is _Stored:
            hashes = e.block_hashes
            extra = e.extra_keys
            if len(e.token_ids) != len(hashes) * e.block_size or (extra is not None and len(extra) != len(hashes)):
                return None
            add(BlockStored(
                hashes, e.parent_block_hash, e.token_ids, e.block_size, e.lora_id,
                medium_of[e.medium], e.lora_name, e.cache_salt, extra,
            ))
        elif type(e) is _Removed:
            add(BlockRemoved(e.block_hashes, medium_of[e.medium]))
        else:
            add(CLEARED_EVENT)
    return EventBatch(ts, events, dp_rank)


def decode_batch(payload: bytes) -> EventBatch:
    """Decode and check one payload; raise ``DecodeError`` saying what is wrong.

    The records are new objects; the payload is only read.
    """
    batch = decode_typed(payload)
    return decode_maps(payload) if batch is None else batch

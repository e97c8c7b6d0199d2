"""The msgpack wire codec for event batches.

Payload layout (one ZMQ message's third frame)::

    [ts: float, events: [event, ...], dp_rank: int | nil]      array of 3

    event (a map; "type" is always the first key):
      {"type": "BlockStored", "block_hashes": [int, ...],
       "parent_block_hash": int,        # left out when None
       "token_ids": [int, ...],         # len == len(block_hashes) * block_size
       "block_size": int,
       "lora_id": int,                  # left out when None
       "medium": "GPU" | "CPU_PINNED" | "DISK",
       "lora_name": str}                # left out when None
      {"type": "BlockRemoved", "block_hashes": [int, ...], "medium": str}
      {"type": "AllBlocksCleared"}

Required keys are always written; ``medium`` is required on both stores and
removals (a record's ``medium=None`` is written as ``"GPU"``). Only the
"int or nil" keys are optional, and they are left out when None.

Encoding builds the maps directly from the records and packs the whole batch
with one call of a reused ``msgpack.Packer``: no per-event intermediate
objects besides the map itself. Decoding checks every shape the format
promises and raises ``DecodeError`` naming the first problem; keys it does not
know are ignored, so producers may add fields without breaking consumers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from radixcache.events.types import (
    GPU,
    HASH_LIMIT,
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

STORED: str = "BlockStored"
REMOVED: str = "BlockRemoved"
CLEARED: str = "AllBlocksCleared"

_CLEARED_MAP: dict[str, str] = {"type": CLEARED}
_CLEARED_EVENT = AllBlocksCleared()


class DecodeError(ValueError):
    """A payload that does not follow the wire format; the message says why."""


def _wire_map(e: KvEvent) -> dict[str, Any]:
    """The wire map of one record; keys in wire order, "type" first."""
    if type(e) is BlockStored:
        m: dict[str, Any] = {"type": STORED, "block_hashes": e.block_hashes}
        if e.parent_block_hash is not None:
            m["parent_block_hash"] = e.parent_block_hash
        m["token_ids"] = e.token_ids
        m["block_size"] = e.block_size
        if e.lora_id is not None:
            m["lora_id"] = e.lora_id
        m["medium"] = e.medium or GPU
        if e.lora_name is not None:
            m["lora_name"] = e.lora_name
        return m
    if type(e) is BlockRemoved:
        return {"type": REMOVED, "block_hashes": e.block_hashes, "medium": e.medium or GPU}
    if type(e) is AllBlocksCleared:
        return _CLEARED_MAP
    raise TypeError(f"not an event record: {type(e).__name__}")


class BatchEncoder:
    """Encodes batches into payload bytes, reusing one packer.

    Not thread safe: each thread that encodes owns its own encoder.
    """

    __slots__ = ("_pack",)

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack

    def encode(self, events: Sequence[KvEvent], ts: float, dp_rank: int | None = None) -> bytes:
        """The payload of one batch of ``events`` published at ``ts``."""
        payload: bytes = self._pack([ts, [_wire_map(e) for e in events], dp_rank])
        return payload

    def encode_batch(self, batch: EventBatch) -> bytes:
        """The payload of ``batch``."""
        return self.encode(batch.events, batch.ts, batch.dp_rank)


def encode_batch(batch: EventBatch) -> bytes:
    """One-off encoding of ``batch`` (a loop should reuse a ``BatchEncoder``)."""
    return BatchEncoder().encode_batch(batch)


# --------------------------------------------------------------------------
# Checks shared by the publisher (records) and the decoder (wire maps).


def _hash_problem(hashes: Any, what: str) -> str | None:
    """Why ``hashes`` is not a non-empty list of block hashes, or None."""
    if type(hashes) is not list and type(hashes) is not tuple:
        return f"{what} must be a list of ints, got {type(hashes).__name__}"
    if not hashes:
        return f"{what} is empty"
    for h in hashes:
        if type(h) is not int or h < 0 or h >= HASH_LIMIT:
            return f"{what} holds {h!r}: hashes are ints in [0, 2**63)"
    return None


def _tokens_problem(tokens: Any, blocks: int, block_size: int) -> str | None:
    """Why ``tokens`` is not ``blocks * block_size`` integer token ids, or None."""
    if type(tokens) is not list and type(tokens) is not tuple:
        return f"token_ids must be a list of ints, got {type(tokens).__name__}"
    if len(tokens) != blocks * block_size:
        return (
            f"token_ids has {len(tokens)} tokens, expected {blocks} blocks"
            f" x block_size {block_size} = {blocks * block_size}"
        )
    # sum() runs in C and fails on str/None/containers; a float (or a numpy
    # scalar) anywhere turns the total into a non-int. One pass, no loop here.
    try:
        total = sum(tokens)
    except TypeError:
        total = None
    if type(total) is not int:
        return "token_ids must hold only ints"
    return None


def _event_problem(event: Any) -> str | None:
    """Why a record cannot be published, or None."""
    kind = type(event)
    if kind is BlockStored:
        problem = _hash_problem(event.block_hashes, "block_hashes")
        if problem:
            return problem
        bs = event.block_size
        if type(bs) is not int or bs <= 0:
            return f"block_size must be a positive int, got {bs!r}"
        problem = _tokens_problem(event.token_ids, len(event.block_hashes), bs)
        if problem:
            return problem
        parent = event.parent_block_hash
        if parent is not None and (type(parent) is not int or not 0 <= parent < HASH_LIMIT):
            return f"parent_block_hash {parent!r} is not an int in [0, 2**63)"
        if event.lora_id is not None and type(event.lora_id) is not int:
            return f"lora_id must be an int or None, got {event.lora_id!r}"
        if event.lora_name is not None and type(event.lora_name) is not str:
            return f"lora_name must be a str or None, got {event.lora_name!r}"
    elif kind is BlockRemoved:
        problem = _hash_problem(event.block_hashes, "block_hashes")
        if problem:
            return problem
    elif kind is not AllBlocksCleared:
        return f"not an event record: {kind.__name__}"
    if kind is not AllBlocksCleared and event.medium is not None and event.medium not in MEDIA:
        return f"medium {event.medium!r} is not one of {MEDIA}"
    return None


def check_events(events: Sequence[KvEvent]) -> None:
    """Raise ValueError naming the first record that cannot go on the wire.

    Checked: record types, hashes (ints in [0, 2**63), non-empty lists),
    token count against blocks x block_size, token and lora types, media.
    """
    for i, event in enumerate(events):
        problem = _event_problem(event)
        if problem:
            raise ValueError(f"event {i} ({type(event).__name__}): {problem}")


# --------------------------------------------------------------------------
# Decoding.


_STORED_KEYS = ("block_hashes", "token_ids", "block_size", "medium")
_REMOVED_KEYS = ("block_hashes", "medium")


def _fail(m: dict[str, Any], required: tuple[str, ...], problem: str) -> DecodeError:
    """The error for a bad event: a missing key explains more than a bad value."""
    for key in required:
        if key not in m:
            return DecodeError(f"{m['type']} lacks required key {key!r}")
    return DecodeError(problem)


def _decode_stored(m: dict[str, Any]) -> BlockStored:
    # The hot path of a subscriber: one function, checks inlined, and the
    # diagnosis (which key is missing, which value is bad) only on failure.
    hashes = m.get("block_hashes")
    bs = m.get("block_size")
    tokens = m.get("token_ids")
    medium = m.get("medium")
    if type(hashes) is not list or not hashes:
        raise _fail(m, _STORED_KEYS, _hash_problem(hashes, "block_hashes") or "")
    for h in hashes:
        if type(h) is not int or h < 0 or h >= HASH_LIMIT:
            raise DecodeError(_hash_problem(hashes, "block_hashes") or "")
    if type(bs) is not int or bs <= 0:
        raise _fail(m, _STORED_KEYS, f"block_size must be a positive int, got {bs!r}")
    if type(tokens) is not list or len(tokens) != len(hashes) * bs:
        raise _fail(m, _STORED_KEYS, _tokens_problem(tokens, len(hashes), bs) or "")
    try:
        total = sum(tokens)  # see _tokens_problem: an int total means all ints
    except TypeError:
        total = None
    if type(total) is not int:
        raise DecodeError("token_ids must hold only ints")
    if medium not in MEDIA:  # a tuple: compares, never hashes the value
        raise _fail(m, _STORED_KEYS, f"medium {medium!r} is not one of {MEDIA}")
    parent = m.get("parent_block_hash")
    if parent is not None and (type(parent) is not int or not 0 <= parent < HASH_LIMIT):
        raise DecodeError(f"parent_block_hash {parent!r} is not an int in [0, 2**63)")
    lora_id = m.get("lora_id")
    if lora_id is not None and type(lora_id) is not int:
        raise DecodeError(f"lora_id must be an int or nil, got {lora_id!r}")
    lora_name = m.get("lora_name")
    if lora_name is not None and type(lora_name) is not str:
        raise DecodeError(f"lora_name must be a str or nil, got {lora_name!r}")
    return BlockStored(hashes, parent, tokens, bs, lora_id, medium, lora_name)


def _decode_removed(m: dict[str, Any]) -> BlockRemoved:
    hashes: Any = m.get("block_hashes")
    medium: Any = m.get("medium")
    problem = _hash_problem(hashes, "block_hashes")
    if problem:
        raise _fail(m, _REMOVED_KEYS, problem)
    if medium not in MEDIA:
        raise _fail(m, _REMOVED_KEYS, f"medium {medium!r} is not one of {MEDIA}")
    return BlockRemoved(hashes, medium)


def _decode_event(m: Any) -> KvEvent:
    if type(m) is not dict:
        raise DecodeError(f"an event must be a map, got {type(m).__name__}")
    if next(iter(m), None) != "type":
        raise DecodeError(f"an event's first key must be 'type', got {next(iter(m), None)!r}")
    kind = m["type"]
    if kind == STORED:
        return _decode_stored(m)
    if kind == REMOVED:
        return _decode_removed(m)
    if kind == CLEARED:
        return _CLEARED_EVENT
    raise DecodeError(f"unknown event type {kind!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """Decode and check one payload; raise ``DecodeError`` saying what is wrong."""
    try:
        raw = msgpack.unpackb(payload, raw=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DecodeError(f"payload is not one msgpack object: {exc!r}") from None
    if type(raw) is not list or len(raw) != 3:
        shape = f"an array of {len(raw)}" if type(raw) is list else type(raw).__name__
        raise DecodeError(f"payload must be an array of 3 [ts, events, dp_rank], got {shape}")
    ts, raw_events, dp_rank = raw
    if type(ts) is not float and type(ts) is not int:
        raise DecodeError(f"ts must be a number, got {type(ts).__name__}")
    if dp_rank is not None and type(dp_rank) is not int:
        raise DecodeError(f"dp_rank must be an int or nil, got {type(dp_rank).__name__}")
    if type(raw_events) is not list:
        raise DecodeError(f"events must be an array, got {type(raw_events).__name__}")
    if not raw_events:
        raise DecodeError("a batch never has zero events")
    try:
        events = [_decode_event(m) for m in raw_events]
    except DecodeError:  # the slow path: say which event
        for i, m in enumerate(raw_events):
            try:
                _decode_event(m)
            except DecodeError as exc:
                raise DecodeError(f"event {i}: {exc}") from None
        raise  # pragma: no cover - the loop above re-raises
    return EventBatch(float(ts), events, dp_rank)

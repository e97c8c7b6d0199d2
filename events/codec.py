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
    MEDIUM_OF_WIRE,
    VOCABULARIES,
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


def _wire_map(e: KvEvent, names: dict[str, str]) -> dict[str, Any]:
    """The wire map of one record; keys in wire order, "type" first."""
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
        return m
    if type(e) is BlockRemoved:
        return {"type": REMOVED, "block_hashes": e.block_hashes, "medium": names[e.medium or GPU]}
    if type(e) is AllBlocksCleared:
        return _CLEARED_MAP
    raise TypeError(f"not an event record: {type(e).__name__}")


class BatchEncoder:
    """Encodes batches into payload bytes, reusing one packer.

    ``media`` picks the medium vocabulary: "sglang" (the default) or "vllm".
    Not thread safe: each thread that encodes owns its own encoder.
    """

    __slots__ = ("_names", "_pack")

    def __init__(self, media: str = "sglang") -> None:
        names = VOCABULARIES.get(media)
        if names is None:
            raise ValueError(f"media vocabulary must be one of {sorted(VOCABULARIES)}, got {media!r}")
        self._names = names
        self._pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack

    def encode(self, events: Sequence[KvEvent], ts: float, dp_rank: int | None = None) -> bytes:
        """The payload of one batch of ``events`` published at ``ts``."""
        names = self._names
        payload: bytes = self._pack([ts, [_wire_map(e, names) for e in events], dp_rank])
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
    if _hashes_ok(hashes):
        return None
    for h in hashes:
        if type(h) is not int or h < 0 or h >= HASH_LIMIT:
            return f"{what} holds {h!r}: hashes are ints in [0, 2**63)"
    return None


def _hashes_ok(hashes: Any) -> bool:
    """All ints (not bools) in [0, 2**63), checked in C."""
    return set(map(type, hashes)) == _INT_ONLY and min(hashes) >= 0 and max(hashes) < HASH_LIMIT


_INT_ONLY = {int}


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


def _extra_problem(extra: Any, blocks: int) -> str | None:
    """Why ``extra`` is not None or one tuple (or None) per block, or None."""
    if extra is None:
        return None
    if type(extra) is not list or len(extra) != blocks:
        n = len(extra) if type(extra) is list else type(extra).__name__
        return f"extra_keys must be a list of one entry per block ({blocks}), got {n}"
    for k in extra:
        if k is not None and type(k) is not tuple and type(k) is not list:
            return f"extra_keys entries must be tuples or None, got {type(k).__name__}"
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
        if event.cache_salt is not None and type(event.cache_salt) is not str:
            return f"cache_salt must be a str or None, got {event.cache_salt!r}"
        problem = _extra_problem(event.extra_keys, len(event.block_hashes))
        if problem:
            return problem
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
    if type(hashes) is not list or not hashes or not _hashes_ok(hashes):
        raise _fail(m, _STORED_KEYS, _hash_problem(hashes, "block_hashes") or "")
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
    medium = _medium(m, medium, _STORED_KEYS)
    parent = m.get("parent_block_hash")
    if parent is not None and (type(parent) is not int or not 0 <= parent < HASH_LIMIT):
        raise DecodeError(f"parent_block_hash {parent!r} is not an int in [0, 2**63)")
    lora_id = m.get("lora_id")
    if lora_id is not None and type(lora_id) is not int:
        raise DecodeError(f"lora_id must be an int or nil, got {lora_id!r}")
    lora_name = m.get("lora_name")
    if lora_name is not None and type(lora_name) is not str:
        raise DecodeError(f"lora_name must be a str or nil, got {lora_name!r}")
    salt = m.get("cache_salt")
    extra = m.get("extra_keys")
    if salt is None and extra is None:
        return BlockStored(hashes, parent, tokens, bs, lora_id, medium, lora_name)
    if salt is not None and type(salt) is not str:
        raise DecodeError(f"cache_salt must be a str or nil, got {salt!r}")
    problem = _extra_problem(extra, len(hashes))
    if problem:
        raise DecodeError(problem)
    if extra is not None:
        extra = [None if k is None else tuple(k) for k in extra]
    return BlockStored(hashes, parent, tokens, bs, lora_id, medium, lora_name, salt, extra)


def _medium(m: dict[str, Any], wire: Any, required: tuple[str, ...]) -> Any:
    """The record medium of a wire name (either vocabulary)."""
    medium = MEDIUM_OF_WIRE.get(wire) if type(wire) is str else None
    if medium is None:
        raise _fail(m, required, f"medium {wire!r} is not one of {sorted(MEDIUM_OF_WIRE)}")
    return medium


def _decode_removed(m: dict[str, Any]) -> BlockRemoved:
    hashes: Any = m.get("block_hashes")
    medium: Any = m.get("medium")
    problem = _hash_problem(hashes, "block_hashes")
    if problem:
        raise _fail(m, _REMOVED_KEYS, problem)
    return BlockRemoved(hashes, _medium(m, medium, _REMOVED_KEYS))


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

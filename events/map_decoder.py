"""The strict decoder that explains: payload -> plain maps -> checked records.

``events.codec.decode_batch`` decodes in one typed pass (msgspec structs,
every constraint checked in C). When that pass refuses a payload, this
module decodes it again as plain msgpack values and checks them one by one,
to raise a ``DecodeError`` that names the first problem ("event 3: token_ids
has 7 tokens, expected 2 blocks x block_size 4 = 8").

Both passes accept exactly the same payloads and build the same records
(``tests/events/test_events_codec.py`` compares them on generated
payloads). The rules:

* the payload is one msgpack array of 3: ``[ts, events, dp_rank]``; ``ts``
  a number (not a bool), ``dp_rank`` an int or nil, ``events`` a non-empty
  array of maps with string keys and a ``"type"`` of BlockStored,
  BlockRemoved or AllBlocksCleared;
* BlockStored: ``block_hashes`` a non-empty array of ints in [0, 2**63),
  ``block_size`` a positive int, ``token_ids`` exactly ``blocks *
  block_size`` ints, ``medium`` a known name (either vocabulary);
  ``parent_block_hash`` (a hash), ``lora_id`` (int), ``lora_name`` and
  ``cache_salt`` (str) nil or absent; ``extra_keys`` nil, absent, or one
  array (or nil) per block;
* BlockRemoved: ``block_hashes`` as above and ``medium``;
* keys a decoder does not know are ignored, so producers may add fields.

Where ``"type"`` stands in a map is not checked: producers write it first
(ours does, as vLLM and SGLang do), and the peers' own decoders find it
anywhere, as this one does.
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixcache.events.checks import extra_problem, hash_problem, hashes_ok, optional_problem, tokens_problem
from radixcache.events.types import (
    HASH_LIMIT,
    MEDIUM_OF_WIRE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

STORED: str = "BlockStored"
REMOVED: str = "BlockRemoved"
CLEARED: str = "AllBlocksCleared"
CLEARED_EVENT = AllBlocksCleared()  # every decoded AllBlocksCleared is this one value

_STORED_KEYS = ("block_hashes", "token_ids", "block_size", "medium")
_REMOVED_KEYS = ("block_hashes", "medium")
_PLAIN = msgspec.msgpack.Decoder()  # msgpack -> plain values, as the typed pass reads them


class DecodeError(ValueError):
    """A payload that does not follow the wire format; the message says why."""


def _fail(m: dict[Any, Any], required: tuple[str, ...], problem: str) -> DecodeError:
    """The error for a bad event: a missing key explains more than a bad value."""
    for key in required:
        if key not in m:
            return DecodeError(f"{m['type']} lacks required key {key!r}")
    return DecodeError(problem)


def _medium(m: dict[Any, Any], required: tuple[str, ...]) -> Any:
    """The record medium of the map's wire name (either vocabulary)."""
    wire = m.get("medium")
    medium = MEDIUM_OF_WIRE.get(wire) if type(wire) is str else None
    if medium is None:
        raise _fail(m, required, f"medium {wire!r} is not one of {sorted(MEDIUM_OF_WIRE)}")
    return medium


def _decode_stored(m: dict[Any, Any]) -> BlockStored:
    hashes = m.get("block_hashes")
    bs = m.get("block_size")
    tokens = m.get("token_ids")
    if type(hashes) is not list or not hashes or not hashes_ok(hashes):
        raise _fail(m, _STORED_KEYS, hash_problem(hashes, "block_hashes") or "")
    if type(bs) is not int or bs <= 0:
        raise _fail(m, _STORED_KEYS, f"block_size must be a positive int, got {bs!r}")
    if type(tokens) is not list:
        raise _fail(m, _STORED_KEYS, f"token_ids must be a list of ints, got {type(tokens).__name__}")
    problem = tokens_problem(tokens, len(hashes), bs)
    if problem is None and bool in set(map(type, tokens)):  # the typed pass refuses bools too
        problem = "token_ids must hold only ints"
    if problem:
        raise _fail(m, _STORED_KEYS, problem)
    medium = _medium(m, _STORED_KEYS)
    parent = m.get("parent_block_hash")
    if parent is not None and (type(parent) is not int or not 0 <= parent < HASH_LIMIT):
        raise DecodeError(f"parent_block_hash {parent!r} is not an int in [0, 2**63)")
    lora_id = m.get("lora_id")
    lora_name = m.get("lora_name")
    salt = m.get("cache_salt")
    extra = m.get("extra_keys")
    problem = (
        optional_problem(lora_id, int, "lora_id")
        or optional_problem(lora_name, str, "lora_name")
        or optional_problem(salt, str, "cache_salt")
        or extra_problem(extra, len(hashes))
    )
    if problem:
        raise DecodeError(problem)
    if extra is not None:
        extra = [None if k is None else tuple(k) for k in extra]
    return BlockStored(hashes, parent, tokens, bs, lora_id, medium, lora_name, salt, extra)


def _decode_removed(m: dict[Any, Any]) -> BlockRemoved:
    hashes: Any = m.get("block_hashes")
    problem = hash_problem(hashes, "block_hashes")
    if problem:
        raise _fail(m, _REMOVED_KEYS, problem)
    return BlockRemoved(hashes, _medium(m, _REMOVED_KEYS))


def _decode_event(m: Any) -> KvEvent:
    if type(m) is not dict:
        raise DecodeError(f"an event must be a map, got {type(m).__name__}")
    for key in m:
        if type(key) is not str:
            raise DecodeError(f"an event's keys must be strings, got {key!r}")
    if "type" not in m:
        raise DecodeError(f"an event needs a 'type' key, got keys {sorted(m)}")
    kind = m["type"]
    if kind == STORED:
        return _decode_stored(m)
    if kind == REMOVED:
        return _decode_removed(m)
    if kind == CLEARED:
        return CLEARED_EVENT
    raise DecodeError(f"unknown event type {kind!r}")


def decode_maps(payload: bytes) -> EventBatch:
    """Decode ``payload`` value by value; raise ``DecodeError`` naming the
    first problem (with the event's position)."""
    try:
        raw = _PLAIN.decode(payload)
    except (msgspec.DecodeError, TypeError, RecursionError) as exc:
        raise DecodeError(f"payload is not one msgpack object: {exc}") from None
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
    events = []
    for i, m in enumerate(raw_events):
        try:
            events.append(_decode_event(m))
        except DecodeError as exc:
            raise DecodeError(f"event {i}: {exc}") from None
    return EventBatch(float(ts), events, dp_rank)

"""Record checks: may this record go on the wire?

``check_events`` is what ``ZmqEventPublisher.publish`` runs on the owner
thread, so a bad record raises in the caller that made it, not later on the
publisher thread. The per-field ``*_problem`` functions return a sentence
naming the problem (or None); the strict map decoder (``events.map_decoder``)
uses the same ones on decoded maps, so a record and its wire map are judged
by the same rules.

Token ids may be a list of ints or a one-dimensional integer numpy array (a
page's tokens as the engine keeps them); the encoder writes both the same
way. Everything else is plain Python values.

Cost: ``check_events`` looks at every token once, in C (``sum`` over a list,
a dtype test for an array): about 2 us for a 16-page ``BlockStored`` of
16-token pages with a token list, about 1 us with a token array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radixcache.events.types import HASH_LIMIT, MEDIA, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

_INT_ONLY = {int}


def hashes_ok(hashes: Any) -> bool:
    """All ints (not bools) in [0, 2**63), checked in C; ``hashes`` non-empty."""
    return set(map(type, hashes)) == _INT_ONLY and min(hashes) >= 0 and max(hashes) < HASH_LIMIT


def hash_problem(hashes: Any, what: str) -> str | None:
    """Why ``hashes`` is not a non-empty list of block hashes, or None."""
    if type(hashes) is not list and type(hashes) is not tuple:
        return f"{what} must be a list of ints, got {type(hashes).__name__}"
    if not hashes:
        return f"{what} is empty"
    if hashes_ok(hashes):
        return None
    for h in hashes:
        if type(h) is not int or h < 0 or h >= HASH_LIMIT:
            return f"{what} holds {h!r}: hashes are ints in [0, 2**63)"
    return None


def tokens_ok(tokens: Any) -> bool:
    """A list or tuple of ints, or a 1-D integer numpy array; lengths are
    not looked at.

    One C pass over a list: ``sum`` fails on str/None/containers, and a
    float or a numpy scalar anywhere turns the total into a non-int. A bool
    adds up like an int and passes; a type test per token, which would catch
    it, costs four times as much (the decoders refuse bools).
    """
    kind = type(tokens)
    if kind is list or kind is tuple:
        try:
            total = sum(tokens)
        except TypeError:
            return False
        return type(total) is int
    if kind is np.ndarray:
        return bool(tokens.ndim == 1 and tokens.dtype.kind in "iu")
    return False


def tokens_problem(tokens: Any, blocks: int, block_size: int) -> str | None:
    """Why ``tokens`` is not ``blocks * block_size`` integer token ids, or None."""
    kind = type(tokens)
    if kind is np.ndarray:
        if not tokens_ok(tokens):
            return f"token_ids as an array must be 1-D of an integer dtype, got {tokens.ndim}-D {tokens.dtype}"
    elif kind is not list and kind is not tuple:
        return f"token_ids must be a list of ints, got {kind.__name__}"
    if len(tokens) != blocks * block_size:
        return (
            f"token_ids has {len(tokens)} tokens, expected {blocks} blocks"
            f" x block_size {block_size} = {blocks * block_size}"
        )
    if not tokens_ok(tokens):
        return "token_ids must hold only ints"
    return None


def extra_problem(extra: Any, blocks: int) -> str | None:
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


_A_TYPE = {int: "an int", str: "a str"}


def optional_problem(value: Any, kind: type, what: str) -> str | None:
    """Why ``value`` is neither None nor exactly a ``kind`` (int or str), or None."""
    if value is not None and type(value) is not kind:
        return f"{what} must be {_A_TYPE[kind]} or nil, got {value!r}"
    return None


def stored_problem(event: BlockStored) -> str | None:
    """Why a ``BlockStored`` record cannot go on the wire, or None."""
    problem = hash_problem(event.block_hashes, "block_hashes")
    if problem:
        return problem
    bs = event.block_size
    if type(bs) is not int or bs <= 0:
        return f"block_size must be a positive int, got {bs!r}"
    problem = tokens_problem(event.token_ids, len(event.block_hashes), bs)
    if problem:
        return problem
    parent = event.parent_block_hash
    if parent is not None and (type(parent) is not int or not 0 <= parent < HASH_LIMIT):
        return f"parent_block_hash {parent!r} is not an int in [0, 2**63)"
    return (
        optional_problem(event.lora_id, int, "lora_id")
        or optional_problem(event.lora_name, str, "lora_name")
        or optional_problem(event.cache_salt, str, "cache_salt")
        or extra_problem(event.extra_keys, len(event.block_hashes))
    )


def event_problem(event: Any) -> str | None:
    """Why a record cannot be published, or None."""
    kind = type(event)
    if kind is BlockStored:
        problem = stored_problem(event)
    elif kind is BlockRemoved:
        problem = hash_problem(event.block_hashes, "block_hashes")
    elif kind is AllBlocksCleared:
        return None
    else:
        return f"not an event record: {kind.__name__}"
    if problem is None and event.medium is not None and event.medium not in MEDIA:
        return f"medium {event.medium!r} is not one of {MEDIA}"
    return problem


def check_events(events: Sequence[KvEvent]) -> None:
    """Raise ValueError naming the first record that cannot go on the wire.

    Checked: record types, hashes (ints in [0, 2**63), non-empty lists),
    token ids (ints; count = blocks x block_size), the optional fields'
    types, extra keys (one entry per block) and media. The common record, a
    plain ``BlockStored``, is judged inline; the per-field functions above
    only name the problem.
    """
    for i, e in enumerate(events):
        if type(e) is BlockStored:
            hashes = e.block_hashes
            tokens = e.token_ids
            bs = e.block_size
            parent = e.parent_block_hash
            if (
                type(hashes) is list
                and hashes
                and hashes_ok(hashes)
                and type(bs) is int
                and bs > 0
                and tokens_ok(tokens)
                and len(tokens) == len(hashes) * bs
                and (parent is None or (type(parent) is int and 0 <= parent < HASH_LIMIT))
                and (e.lora_id is None or type(e.lora_id) is int)
                and (e.lora_name is None or type(e.lora_name) is str)
                and e.cache_salt is None
                and e.extra_keys is None
                and (e.medium is None or e.medium in MEDIA)
            ):
                continue
        elif type(e) is BlockRemoved:
            hashes = e.block_hashes
            if type(hashes) is list and hashes and hashes_ok(hashes) and (e.medium is None or e.medium in MEDIA):
                continue
        problem = event_problem(e)
        if problem:
            raise ValueError(f"event {i} ({type(e).__name__}): {problem}")

"""The router's own chained block hash ("local" hash).

A router cannot reproduce an engine's block hashes (they may be salted per
tenant, seeded per process, computed over extra keys the wire doesn't show).
So the index rehashes the token ids of every stored block and answers
queries in that local hash space::

    local(block) = blake2b_8(local(parent) | ns | token_ids as int64 | extra)
    local(parent of a first block) = ROOT (8 zero bytes)
    ns = blake2b_8(repr((lora_id, lora_name, cache_salt)))   the namespace the wire shows
    extra = repr(the block's extra_keys entry), or nothing when it is nil

Stores (``events.block_index``) and queries (``events.index``) build the
same bytes through this module, so a query names a namespace exactly as
the engine published it: a radixcache engine publishes, for every block of a
namespace with a salt or extra keys, the entry ``(cache_salt, *extra_keys)``
(the salt left out when there is none), and ``block_extra`` builds that
entry from a query's arguments.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

ROOT = bytes(8)  # local hash "before" a sequence's first block


def digest(data: bytes) -> bytes:
    """8-byte blake2b of ``data``: one block's local hash."""
    return hashlib.blake2b(data, digest_size=8).digest()


def token_bytes(tokens: Sequence[int] | np.ndarray[Any, Any]) -> bytes:
    """Token ids as native int64 bytes (a list of ints or an integer array).

    Raises ValueError for ids that do not fit int64 (or are not integers).
    """
    if type(tokens) is np.ndarray:
        if tokens.dtype.kind not in "iu" or (tokens.dtype.kind == "u" and tokens.size and tokens.max() >> 63):
            raise ValueError(f"token ids of dtype {tokens.dtype} do not fit int64")
        return tokens.astype(np.int64, copy=False).tobytes()
    try:
        return array("q", tokens).tobytes()
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids do not fit int64: {exc}") from None


def entry_bytes(entry: Sequence[Any] | None) -> bytes:
    """What one block's extra-keys entry adds to its hash input."""
    return b"" if entry is None else repr(tuple(entry)).encode()


def block_extra(cache_salt: str | None, extra_keys: tuple[Any, ...] | None) -> bytes:
    """The bytes a query mixes into every block's local hash for a namespace.

    Matches what a radixcache engine publishes per block: the entry
    ``(cache_salt, *extra_keys)`` (salt left out when None), nothing when
    both are empty.
    """
    entry = ((cache_salt,) if cache_salt is not None else ()) + tuple(extra_keys or ())
    return repr(entry).encode() if entry else b""


class NamespaceKeys:
    """``ns`` of the formula above, computed once per namespace."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[tuple[int | None, str | None, str | None], bytes] = {}

    def key(self, lora_id: int | None, lora_name: str | None, cache_salt: str | None = None) -> bytes:
        """The namespace part of every block hash of this namespace."""
        ident = (lora_id, lora_name, cache_salt)
        ns = self._cache.get(ident)
        if ns is None:
            ns = self._cache[ident] = digest(repr(ident).encode())
        return ns

"""Page hashes, two kinds: storage keys that resist crafted collisions, and
fast block ids for events. Both are stable across processes, restarts and
machines (Python's ``hash()`` and per-process seeds are never used).

Storage keys (16 bytes, bytes objects)::

    key(page i)  = blake2b-128( key(page i-1) || int32-LE tokens of page i )
    key(page -1) = the namespace digest (binds salt, LoRA and extra keys)

A key alone decides which stored KV a read serves, so it is a cryptographic
chain: a crafted collision could otherwise make one prefix's KV be served for
another's. It costs about 0.7 us per page, so compute keys only for pages
that are written to or looked up in storage (the write or the read costs far
more than the hash), never for events.

Event block ids (ints in ``[0, 2**63)``, an int64 array per run of pages)::

    c_i   = content(page i): x = sum_j uint32(tok_ij) * K_j  (mod 2**64)
                             c = x ^ (x >> 29)
    id_i  = (B * id_(i-1) + M * c_i)  mod 2**63
    id_-1 = namespace_seed(namespace digest), or the id of the page before
            the run when the run continues a prefix

``K_j`` are fixed odd 64-bit constants (splitmix64 of j); ``B`` and ``M`` are
fixed odd constants. Because the recurrence is linear, a whole run is a few
numpy operations: with ``W_k = M * B**-k`` (B is odd, so invertible mod
2**64)::

    id_i = B**i * ( B * id_-1 + cumsum_k<=i( W_k * c_k ) )   (mod 2**64, then mod 2**63)

and reducing mod 2**63 after computing mod 2**64 is exact. The chain state
*is* the id, so a run continues from its parent's id alone. Ids are for
routers, not for security: the tree compares real tokens, storage checks
tokens, and routers that need their own hash rehash the tokens.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from radixcache.native import compiled as native_core  # None on the pure-Python path

KEY_BYTES = 16
ID_LIMIT = 1 << 63  # block ids are ints in [0, ID_LIMIT)

BlockIds = npt.NDArray[np.int64]

_U64 = (1 << 64) - 1
_MASK63 = np.uint64(ID_LIMIT - 1)
_B = 0x9E3779B97F4A7C15  # odd: the chain's base
_B_INV = pow(_B, -1, 1 << 64)
_M = 0xBF58476D1CE4E5B9  # odd: spreads each page's content over the word
_SHIFT = np.uint64(29)


# ------------------------------------------------------------------ storage keys
def chain_keys(parent_key: bytes, tokens: npt.NDArray[np.int32], page_size: int) -> bytes:
    """Storage keys of consecutive pages of ``tokens`` after ``parent_key``, concatenated.

    ``tokens`` is int32 with a length that is a multiple of ``page_size``.
    Returns ``KEY_BYTES * len(tokens) // page_size`` bytes. Call it only for
    pages written to or looked up in storage.
    """
    raw = tokens.astype("<i4", copy=False).tobytes()
    step = 4 * page_size
    blake = hashlib.blake2b
    prev = parent_key
    out = []
    for start in range(0, len(raw), step):
        h = blake(prev, digest_size=KEY_BYTES)
        h.update(raw[start : start + step])
        prev = h.digest()
        out.append(prev)
    return b"".join(out)


def split_keys(keys: bytes) -> list[bytes]:
    """Concatenated storage keys as a list of 16-byte keys."""
    return [keys[i : i + KEY_BYTES] for i in range(0, len(keys), KEY_BYTES)]


# ------------------------------------------------------------------ block ids
def namespace_seed(digest: bytes) -> int:
    """The id a namespace's chains start from (``id_-1``), in ``[0, 2**63)``.

    ``digest`` is ``Namespace.digest()``; compute once per namespace and keep.
    """
    h = hashlib.blake2b(digest, digest_size=8, person=b"rxc-block-id-v1")
    return int.from_bytes(h.digest(), "little") & (ID_LIMIT - 1)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Tables:
    """Constant tables, grown on demand; pure functions of their index, so
    sharing one per process changes no result."""

    def __init__(self) -> None:
        self.lanes: dict[int, npt.NDArray[np.uint64]] = {}  # page size -> K_0..K_(P-1)
        self.b_pow = np.ones(1, dtype=np.uint64)  # B**k
        self.w = np.full(1, _M, dtype=np.uint64)  # M * B**-k

    def lane_weights(self, page_size: int) -> npt.NDArray[np.uint64]:
        k = self.lanes.get(page_size)
        if k is None:
            k = _splitmix64(np.arange(page_size, dtype=np.uint64)) | np.uint64(1)
            self.lanes[page_size] = k
        return k

    def powers(self, n: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        if n > self.b_pow.size:
            size = max(n, 2 * self.b_pow.size, 64)
            b = np.full(size, _B, dtype=np.uint64)
            b[0] = 1
            w = np.full(size, _B_INV, dtype=np.uint64)
            w[0] = _M
            with np.errstate(over="ignore"):
                self.b_pow = np.cumprod(b, dtype=np.uint64)  # wraps mod 2**64, as meant
                self.w = np.cumprod(w, dtype=np.uint64)
        return self.b_pow[:n], self.w[:n]


_TABLES = _Tables()


def lane_weights(page_size: int) -> npt.NDArray[np.uint64]:
    """The uint64 lane weights ``K_0 .. K_(P-1)`` of ``block_ids`` for pages
    of ``page_size`` tokens (shared, read only)."""
    return _TABLES.lane_weights(page_size)


def block_ids(
    tokens: npt.NDArray[np.int32], page_size: int, parent: int | None, seed: int
) -> BlockIds:
    """Event block ids of the consecutive pages of ``tokens`` (a new int64 array).

    ``tokens``: int32, C-contiguous, length a multiple of ``page_size`` (not
    checked here: the tree holds only whole pages of validated tokens).
    ``parent``: the id of the page before the run, or None when the run
    starts a sequence, which then chains from ``seed`` (``namespace_seed`` of
    its namespace). Every id is in ``[0, 2**63)``. One C loop when the
    compiled core is there (radixcache/native), else ``vector_block_ids``;
    creates no Python object per page or token.
    """
    start = seed if parent is None else parent
    if native_core is not None:
        return native_core.block_ids(tokens, page_size, start, _TABLES.lane_weights(page_size))
    return vector_block_ids(tokens, page_size, start)


def vector_block_ids(tokens: npt.NDArray[np.int32], page_size: int, start: int) -> BlockIds:
    """``block_ids`` chaining from the id ``start``, in a few numpy
    operations whatever the length (the pure-Python path)."""
    n = tokens.size // page_size
    lanes = tokens.view(np.uint32).reshape(n, page_size)
    c = lanes @ _TABLES.lane_weights(page_size)  # uint64, wraps mod 2**64
    c ^= c >> _SHIFT
    b_pow, w = _TABLES.powers(n)
    c *= w
    if n:
        c[0] = (c.item(0) + _B * start) & _U64
    c = np.add.accumulate(c)  # (np.cumsum costs a Python-level wrapper more)
    c *= b_pow
    c &= _MASK63
    return c.view(np.int64)


def block_id_of_sequence(
    tokens: npt.NDArray[np.int32], page_size: int, parent: int | None, seed: int
) -> list[int]:
    """The same ids computed page by page with Python ints: the definition,
    kept for tests and for readers; far slower than ``block_ids``."""
    k = [int(x) for x in _TABLES.lane_weights(page_size)]
    prev = seed if parent is None else parent
    out = []
    toks = tokens.astype(np.int64) & 0xFFFFFFFF
    for i in range(tokens.size // page_size):
        page = toks[i * page_size : (i + 1) * page_size].tolist()
        x = sum(t * kj for t, kj in zip(page, k)) & _U64
        c = x ^ (x >> 29)
        prev = (_B * prev + _M * c) & (ID_LIMIT - 1)
        out.append(prev)
    return out

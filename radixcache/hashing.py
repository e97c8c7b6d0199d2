"""Chained page hashes, stable across processes and machines.

Each page's key is 16 bytes::

    key(page i) = blake2b-128( key(page i-1) || int32-LE tokens of page i )
    key(page -1) = the namespace digest (binds salt, LoRA and extra keys)

so a key binds the page's tokens, its whole prefix and the namespace. The key
is the storage key (bytes); its first 8 bytes, big-endian, shifted right by
one, are the 63-bit block hash published in events (fits both signed and
unsigned 64-bit decoders). Python's ``hash()`` is never used: it is salted per
process.

A keyed cryptographic hash is used on purpose: a crafted collision could
otherwise make one prefix's stored KV be served for another's. The cost is
about 0.7 us per page, paid once per page (keys are cached on tree nodes).
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

KEY_BYTES = 16


def chain_keys(parent_key: bytes, tokens: npt.NDArray[np.int32], page_size: int) -> bytes:
    """Keys of consecutive pages of ``tokens`` after ``parent_key``, concatenated.

    ``tokens`` is int32 with a length that is a multiple of ``page_size``.
    Returns ``KEY_BYTES * len(tokens) // page_size`` bytes.
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


def block_hash(key: bytes) -> int:
    """The 63-bit integer block hash of one 16-byte page key."""
    return int.from_bytes(key[:8], "big") >> 1


def block_hashes(keys: bytes) -> list[int]:
    """63-bit integer block hashes of concatenated 16-byte page keys."""
    n = len(keys) // KEY_BYTES
    if n <= 16:  # below this, numpy's call overhead costs more than the loop
        return [int.from_bytes(keys[i : i + 8], "big") >> 1 for i in range(0, n * KEY_BYTES, KEY_BYTES)]
    lanes = np.frombuffer(keys, dtype=">u8")[::2] >> np.uint64(1)
    return [int(x) for x in lanes.tolist()]


def split_keys(keys: bytes) -> list[bytes]:
    """Concatenated page keys as a list of 16-byte keys."""
    return [keys[i : i + KEY_BYTES] for i in range(0, len(keys), KEY_BYTES)]

"""Encryption at rest: records sealed with AES-256-GCM, per-tenant keys, key rotation.

    codec.py    how a store frames and verifies records: ``RecordCodec`` and
                ``Framing`` (a codec bound to one tenant), ``PlainRecords``
                (no keys: the Null implementation), ``KeySource`` (where keys
                come from), ``open_codec``, ``Unreadable``
    keys.py     master keys (a key file or an environment variable, the first
                writes, all read) and what HKDF derives from them
    sealed.py   ``SealedRecords``: the sealed record's layout, sealing and opening
    gcm.py      ``Gcm``: AES-256-GCM that opens large messages with the GIL
                free (this Python's libcrypto through ctypes, else
                ``cryptography``'s ``AESGCM``)

The shared storage base (offload/storage/base.py) opens one codec per store
from its backend's key settings and hands each job its tenant's framing, so
every backend (LMDB, Valkey, ...) writes and reads sealed records without a
line of its own. Only keys.py, gcm.py and sealed.py import the
``cryptography`` package (the ``encryption`` extra), and only when a store
has keys.
"""

from __future__ import annotations

from radixcache.offload.storage.contract import ModelFingerprint
from radixcache.offload.storage.crypt.codec import (
    NO_KEYS,
    PLAIN,
    Framing,
    KeyLoadError,
    KeySource,
    PlainRecords,
    RecordCodec,
    Unreadable,
)

__all__ = [
    "NO_KEYS",
    "PLAIN",
    "Framing",
    "KeyLoadError",
    "KeySource",
    "PlainRecords",
    "RecordCodec",
    "Unreadable",
    "open_codec",
]


def open_codec(source: KeySource, fingerprint: ModelFingerprint) -> RecordCodec:
    """The codec ``source`` asks for: plain without keys, else sealed records
    bound to ``fingerprint``. Raises ``KeyLoadError`` (a ValueError) when the
    keys cannot be loaded and ImportError without the ``cryptography``
    package (the ``encryption`` extra)."""
    if not source.enabled:
        return PLAIN
    try:
        from radixcache.offload.storage.crypt.keys import load_key_env, load_key_file
        from radixcache.offload.storage.crypt.sealed import SealedRecords
    except ImportError as exc:
        raise ImportError(
            f"encryption at rest needs the cryptography package ({exc.name}): "
            "pip install 'radixcache[encryption]'"
        ) from exc
    if source.key_file is not None:
        ring = load_key_file(source.key_file)
    else:
        assert source.key_env is not None
        ring = load_key_env(source.key_env)
    return SealedRecords(ring, fingerprint)

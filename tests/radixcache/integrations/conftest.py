"""Shared by the engine integration tests: damaging one stored record on disk."""

from __future__ import annotations

from pathlib import Path

import lmdb


def corrupt_record(path: str | Path, key: bytes) -> None:
    """Flip the last byte (a KV byte) of the record stored under raw ``key``
    in the closed LMDB store at ``path``; the record keeps its length and
    header, so only the checksum can tell."""
    env = lmdb.open(str(path), max_dbs=3, writemap=True)
    try:
        pages = env.open_db(b"pages")
        with env.begin(write=True, db=pages) as txn:
            hits = [bytes(k) for k, _v in txn.cursor() if bytes(k).endswith(key)]
            assert len(hits) == 1, f"{len(hits)} records end with {key!r}"
            value = bytearray(txn.get(hits[0]))
            value[-1] ^= 0xFF
            txn.put(hits[0], bytes(value))
    finally:
        env.close()

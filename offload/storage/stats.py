"""A storage backend's counters: the ``StorageStats`` snapshot every backend
returns, and the thread-safe ``Counters`` behind it.

Every thread of a backend (the owner's calls, the readers, the writer) adds
to one ``Counters``; ``stats()`` takes a consistent snapshot of it together
with the sizes only the backend knows (records, bytes, capacity, queue).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StorageStats:
    """A snapshot of a storage backend's counters (since it was opened)."""

    records: int  # records in the store now (every fingerprint)
    stored_bytes: int  # bytes of those records' values
    capacity_bytes: int  # the configured limit on stored_bytes
    hits: int  # pages served by get(), verified
    misses: int  # pages asked of get() and not served
    corrupt: int  # records that failed a checksum or token check (deleted)
    decrypt_failures: int  # records read that could not be authenticated (offload/storage/crypt)
    evicted: int  # records evicted, least recently used first, to make room
    expired: int  # records removed past their retention deadline (PutMeta.expires_at)
    deleted: int  # records removed by delete(), forget_namespace() or invalidate_tag()
    puts: int  # pages written
    put_skipped: int  # pages a put found already stored (not rewritten)
    write_txns: int  # committed write transactions
    map_full: int  # times the LMDB map filled up (records evicted, map grown)
    failed_ops: int  # tickets failed by a storage error
    queued_writes: int  # write jobs waiting for the writer thread
    # A local store's files (LMDB: the map file and the slot file; 0 for a pool):
    disk_bytes: int = 0  # bytes they take on disk (allocated blocks)
    free_disk_bytes: int = 0  # of those, bytes no record holds that the store reuses
    # before it grows (the slot file's free slots and those waiting for reads)



class Counters:
    """Thread-safe event counters behind ``StorageStats``; any thread adds."""

    NAMES = (
        "hits",
        "misses",
        "corrupt",
        "decrypt_failures",
        "evicted",
        "expired",
        "deleted",
        "puts",
        "put_skipped",
        "write_txns",
        "map_full",
        "failed_ops",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.NAMES, 0)

    def add(self, **deltas: int) -> None:
        """Add ``deltas`` to the counters they name (one of ``NAMES`` each)."""
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] += delta

    def snapshot(
        self, *, records: int, stored_bytes: int, capacity_bytes: int, queued_writes: int,
        disk_bytes: int = 0, free_disk_bytes: int = 0,
    ) -> StorageStats:  # fmt: skip
        """The counters now, with the sizes only the backend knows."""
        with self._lock:
            values = dict(self._values)
        return StorageStats(
            records=records,
            stored_bytes=stored_bytes,
            capacity_bytes=capacity_bytes,
            queued_writes=queued_writes,
            disk_bytes=disk_bytes,
            free_disk_bytes=free_disk_bytes,
            **values,
        )

"""The storage tier's contract and the shared base every backend subclasses.

    contract.py     the ``Storage`` protocol the cache sees, ``NullStorage``,
                    ``ModelFingerprint``, ``PutMeta``, errors, ``StorageOpening``
    stats.py        ``StorageStats`` and the thread-safe ``Counters`` behind it
    record.py       the self-checking record of one page (the same bytes in
                    every backend); kv_checksum.py, its KV checksum
    chunk.py        several pages' records in one value (a pool's chunks)
    checks.py       validation of what callers hand a backend
    jobs.py         read/put/delete/forget/tag jobs; a put frames its records
    base.py         ``StorageBase``: the contract's calls, once for all backends
    reader.py       ``PageReader``: fetch (the backend's), verify, copy, count
    writer.py       ``JobWriter``: the writer thread and its contract
    removals.py     removal accounting: the order removals are published in
    crypt/          encryption at rest: how records are framed and verified
                    (in the clear, or sealed with AES-256-GCM under master
                    keys and per-tenant keys); jobs carry their tenant's framing

A backend (``radixcache.offload.lmdb``, ``radixcache.offload.valkey``)
supplies its transport and little else; ``contract.py`` says what exactly.
This package imports no backend and no client library.
"""

from __future__ import annotations

from radixcache.offload.storage.base import StorageBase, StoreSizes
from radixcache.offload.storage.contract import (
    KEY_BYTES,
    MAX_KEY_BYTES,
    HostPages,
    ModelFingerprint,
    NullStorage,
    PageBuffer,
    PutMeta,
    Storage,
    StorageError,
    StorageOpenError,
    StorageOpening,
    StorageUnavailable,
    TokenPages,
)
from radixcache.offload.storage.jobs import DeleteJob, ForgetJob, PutJob, ReadJob, TagJob, WriteJob
from radixcache.offload.storage.kv_checksum import kv_checksum
from radixcache.offload.storage.reader import PageReader, StoredValue
from radixcache.offload.storage.record import RecordMeta, page_record_size, record_size
from radixcache.offload.storage.removals import HeldRemovalLog, RemovalLog
from radixcache.offload.storage.stats import Counters, StorageStats
from radixcache.offload.storage.writer import JobWriter

__all__ = [
    "KEY_BYTES",
    "MAX_KEY_BYTES",
    "Counters",
    "DeleteJob",
    "ForgetJob",
    "HeldRemovalLog",
    "HostPages",
    "JobWriter",
    "ModelFingerprint",
    "NullStorage",
    "PageBuffer",
    "PageReader",
    "PutJob",
    "PutMeta",
    "ReadJob",
    "RecordMeta",
    "RemovalLog",
    "Storage",
    "StorageBase",
    "StorageError",
    "StorageOpenError",
    "StorageOpening",
    "StorageStats",
    "StorageUnavailable",
    "StoreSizes",
    "StoredValue",
    "TagJob",
    "TokenPages",
    "WriteJob",
    "kv_checksum",
    "page_record_size",
    "record_size",
]

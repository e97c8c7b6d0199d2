"""The LMDB backend: the storage tier as one LMDB environment on local disk.

    config.py     StorageConfig: path, capacity, durability, readers, batches
    storage.py    LmdbStorage: the environment, its owner lock, the index;
                  the contract's calls are the shared base's
    opening.py    open_lmdb_storage: a damaged store is moved aside, an
                  unusable one disables the tier
    index.py      the in-memory recency index (LRU eviction, capacity),
                  per tenant
    quotas.py     per-tenant byte quotas (limit, floor): checks, counters
    reader.py     the read transport: zero-copy values from the memory map
    writer.py     the write transport: one transaction per writer step,
                  making room (eviction, map growth, disk reserve)
    txn.py        what one write transaction does to the records
    space.py      the map's growth and the disk under it
    retention.py  retention deadlines, tags, the sweep; the store's own jobs
                  (tag invalidation, quota changes, sweeps)

It imports the shared base (``radixcache.offload.storage``) and nothing of
any other backend.
"""

from __future__ import annotations

from radixcache.offload.lmdb.config import DURABILITY_MODES, OPEN_ERROR_MODES, StorageConfig
from radixcache.offload.lmdb.opening import open_lmdb_storage
from radixcache.offload.lmdb.quotas import TenantStorageStats
from radixcache.offload.lmdb.storage import LmdbStorage

__all__ = [
    "DURABILITY_MODES",
    "OPEN_ERROR_MODES",
    "LmdbStorage",
    "StorageConfig",
    "TenantStorageStats",
    "open_lmdb_storage",
]

"""Tiers below the device: the host page pool and the LMDB storage tier.

This package may import ``transfer`` (and ``events`` types); it never imports
``radixcache``. It is the only package that talks to LMDB.
"""

from __future__ import annotations

from radixcache.offload.host import HostPool, HostPoolConfig
from radixcache.offload.lmdb_storage import LmdbStorage, StorageConfig
from radixcache.offload.storage import (
    ModelFingerprint,
    NullStorage,
    Storage,
    StorageError,
    StorageOpenError,
    StorageStats,
)

__all__ = [
    "HostPool",
    "HostPoolConfig",
    "LmdbStorage",
    "ModelFingerprint",
    "NullStorage",
    "Storage",
    "StorageConfig",
    "StorageError",
    "StorageOpenError",
    "StorageStats",
]

"""Tiers below the device: the host page pool and the LMDB storage tier.

This package may import ``transfer`` (and ``events`` types); it never imports
``radixcache``. It is the only package that talks to LMDB.
"""

from __future__ import annotations

from offload.host import HostPool, HostPoolConfig
from offload.lmdb_storage import LmdbStorage, StorageConfig
from offload.storage import (
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

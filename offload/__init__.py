"""Tiers below the device: the host page pool, the storage tier, and what moves between them.

    host.py          HostPool: page-first host memory and its page allocator
    policy.py        write and prefetch policies, chosen by name
    controller.py    OffloadController: tier jobs in flight, harvested by the owner
    rate_limit.py    warnings that repeat under load, at most once per interval
    backends.py      open_backend / storage_config: the backend a URL or config names
    storage/         the storage contract and the shared base every backend subclasses
    lmdb/            the LMDB backend (local disk)
    valkey/          the Valkey backend (a pool shared by engines; the ``valkey`` extra)
    mooncake/        the Mooncake Store backend (a pool shared by engines; the ``mooncake`` extra)

This package may import ``transfer`` (and ``events`` types); it never imports
the engine (``radixcache`` itself). It is the only package that talks to
LMDB or a storage server. The names below are resolved lazily, so
``import radixcache.offload`` loads no backend, no client library and no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixcache.offload.lazy import LazyNames

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from radixcache.offload.backends import StorageTarget, open_backend, storage_config
    from radixcache.offload.controller import (
        LATENCY_BOUNDS_S,
        Job,
        JobKind,
        JobOwner,
        LatencyHistogram,
        OffloadController,
        TransferCounters,
    )
    from radixcache.offload.host import HostPool, HostPoolConfig
    from radixcache.offload.lmdb import LmdbStorage, StorageConfig
    from radixcache.offload.mooncake import MooncakeConfig, MooncakeStorage
    from radixcache.offload.policy import (
        PrefetchPolicy,
        WritePolicy,
        make_prefetch_policy,
        make_write_policy,
        prefetch_policy_names,
        write_policy_names,
    )
    from radixcache.offload.rate_limit import RateLimitedLog
    from radixcache.offload.storage import (
        MAX_KEY_BYTES,
        ModelFingerprint,
        NullStorage,
        PutMeta,
        RecordMeta,
        Storage,
        StorageError,
        StorageOpenError,
        StorageOpening,
        StorageStats,
        StorageUnavailable,
    )
    from radixcache.offload.valkey import PoolLookup, ValkeyConfig, ValkeyStorage

_BACKENDS = "radixcache.offload.backends"
_CONTROLLER = "radixcache.offload.controller"
_MOONCAKE = "radixcache.offload.mooncake"
_POLICY = "radixcache.offload.policy"
_STORAGE = "radixcache.offload.storage"
_VALKEY = "radixcache.offload.valkey"

# public name -> module that defines (or exports) it
_NAMES = LazyNames(
    __name__,
    {
        "StorageTarget": _BACKENDS,
        "open_backend": _BACKENDS,
        "storage_config": _BACKENDS,
        "LATENCY_BOUNDS_S": _CONTROLLER,
        "Job": _CONTROLLER,
        "JobKind": _CONTROLLER,
        "JobOwner": _CONTROLLER,
        "LatencyHistogram": _CONTROLLER,
        "OffloadController": _CONTROLLER,
        "TransferCounters": _CONTROLLER,
        "HostPool": "radixcache.offload.host",
        "HostPoolConfig": "radixcache.offload.host",
        "LmdbStorage": "radixcache.offload.lmdb",
        "StorageConfig": "radixcache.offload.lmdb",
        "MooncakeConfig": _MOONCAKE,
        "MooncakeStorage": _MOONCAKE,
        "PrefetchPolicy": _POLICY,
        "WritePolicy": _POLICY,
        "make_prefetch_policy": _POLICY,
        "make_write_policy": _POLICY,
        "prefetch_policy_names": _POLICY,
        "write_policy_names": _POLICY,
        "RateLimitedLog": "radixcache.offload.rate_limit",
        "MAX_KEY_BYTES": _STORAGE,
        "ModelFingerprint": _STORAGE,
        "NullStorage": _STORAGE,
        "PutMeta": _STORAGE,
        "RecordMeta": _STORAGE,
        "Storage": _STORAGE,
        "StorageError": _STORAGE,
        "StorageOpenError": _STORAGE,
        "StorageOpening": _STORAGE,
        "StorageStats": _STORAGE,
        "StorageUnavailable": _STORAGE,
        "PoolLookup": _VALKEY,
        "ValkeyConfig": _VALKEY,
        "ValkeyStorage": _VALKEY,
    },
)
__all__ = _NAMES.all


def __getattr__(name: str) -> Any:
    return _NAMES.resolve(name)


def __dir__() -> list[str]:
    return _NAMES.dir()

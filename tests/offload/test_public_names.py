"""The public surface of ``radixcache.offload`` and its subpackages: the exact
``__all__`` of each, every name resolves, and importing the package loads
neither a backend nor a client library it does not need."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = {
    "radixcache.offload": [
        "HostPool",
        "HostPoolConfig",
        "Job",
        "JobKind",
        "JobOwner",
        "LATENCY_BOUNDS_S",
        "LatencyHistogram",
        "LmdbStorage",
        "MAX_KEY_BYTES",
        "ModelFingerprint",
        "MooncakeConfig",
        "MooncakeStorage",
        "NullStorage",
        "OffloadController",
        "PoolLookup",
        "PrefetchPolicy",
        "PutMeta",
        "RateLimitedLog",
        "RecordMeta",
        "Storage",
        "StorageConfig",
        "StorageError",
        "StorageOpenError",
        "StorageOpening",
        "StorageStats",
        "StorageTarget",
        "StorageUnavailable",
        "TransferCounters",
        "ValkeyConfig",
        "ValkeyStorage",
        "WritePolicy",
        "make_prefetch_policy",
        "make_write_policy",
        "open_backend",
        "prefetch_policy_names",
        "storage_config",
        "write_policy_names",
    ],
    "radixcache.offload.storage": [
        "Counters",
        "DeleteJob",
        "ForgetJob",
        "HeldRemovalLog",
        "HostPages",
        "JobWriter",
        "KEY_BYTES",
        "MAX_KEY_BYTES",
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
    ],
    "radixcache.offload.lmdb": [
        "DURABILITY_MODES",
        "LmdbStorage",
        "OPEN_ERROR_MODES",
        "StorageConfig",
        "TenantStorageStats",
        "open_lmdb_storage",
    ],
    "radixcache.offload.mooncake": [
        "HolderProcess",
        "MasterProcess",
        "MooncakeConfig",
        "MooncakePoolStats",
        "MooncakeStorage",
        "PoolUnavailable",
        "SCHEME",
        "scratch_pool",
    ],
    "radixcache.offload.valkey": [
        "PoolLookup",
        "PoolStats",
        "PoolUnavailable",
        "SCHEMES",
        "ScratchCluster",
        "TenantPoolStats",
        "ValkeyConfig",
        "ValkeyStorage",
        "redact_url",
        "scratch_cluster",
        "scratch_server",
    ],
}


NEEDS_CLIENT = {"radixcache.offload.mooncake": "mooncake.store"}  # resolving every name loads it


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_each_package_exports_exactly_its_public_names(package: str) -> None:
    if package in NEEDS_CLIENT:
        pytest.importorskip(NEEDS_CLIENT[package])
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
        assert name in dir(module), f"{package}.{name} is missing from dir()"


def test_the_package_names_are_the_backends_own_objects() -> None:
    import radixcache.offload as offload
    from radixcache.offload import lmdb, mooncake, storage, valkey

    assert offload.StorageConfig is lmdb.StorageConfig
    assert offload.LmdbStorage is lmdb.LmdbStorage
    assert offload.ValkeyStorage is valkey.ValkeyStorage
    assert offload.ValkeyConfig is valkey.ValkeyConfig
    assert offload.Storage is storage.Storage
    assert issubclass(lmdb.LmdbStorage, storage.StorageBase)
    assert issubclass(valkey.ValkeyStorage, storage.StorageBase)
    assert offload.MooncakeConfig is mooncake.MooncakeConfig
    if importlib.util.find_spec("mooncake") is not None:
        assert offload.MooncakeStorage is mooncake.MooncakeStorage
        assert issubclass(mooncake.MooncakeStorage, storage.StorageBase)
    with pytest.raises(AttributeError, match="no_such_name"):
        offload.no_such_name  # noqa: B018


def _loaded_after(code: str) -> list[str]:
    """The modules of interest loaded by ``code``, in a fresh interpreter."""
    probe = (
        f"import sys\n{code}\n"
        "ours = ('redis', 'lmdb', 'mooncake', 'radixcache.offload.lmdb', 'radixcache.offload.valkey',"
        " 'radixcache.offload.mooncake')\n"
        "print(sorted(m for m in sys.modules for o in ours if m == o or m.startswith(o + '.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return list(eval(out.stdout))  # noqa: S307 - a list of module names we printed


def test_importing_the_package_loads_no_backend_and_no_client_library() -> None:
    assert _loaded_after("import radixcache.offload") == []


def test_lmdb_users_never_load_the_pool_client() -> None:
    loaded = _loaded_after(
        "from radixcache.offload import HostPoolConfig, StorageConfig, open_backend\n"
        "from radixcache.offload import storage_config\n"
        "storage_config('lmdb:///tmp/x?capacity_gib=1')"
    )
    assert "lmdb" in loaded and "radixcache.offload.lmdb" in loaded
    assert not [m for m in loaded if m == "redis" or m.startswith("redis.")], loaded
    assert not [m for m in loaded if m == "mooncake" or m.startswith("mooncake.")], loaded
    assert "radixcache.offload.valkey.storage" not in loaded, loaded


def test_a_pool_config_loads_no_client_library() -> None:
    loaded = _loaded_after(
        "from radixcache.offload import ValkeyConfig\nValkeyConfig.from_url('valkey://h:1/0')"
    )
    assert not [m for m in loaded if m == "redis" or m.startswith("redis.")], loaded


def test_a_mooncake_config_loads_no_client_library() -> None:
    loaded = _loaded_after(
        "from radixcache.offload import MooncakeConfig, storage_config\n"
        "MooncakeConfig.from_url('mooncake://h:1'); storage_config('mooncake://h:2?protocol=tcp')"
    )
    assert not [m for m in loaded if m == "mooncake" or m.startswith("mooncake.")], loaded
    assert "radixcache.offload.mooncake.storage" not in loaded, loaded

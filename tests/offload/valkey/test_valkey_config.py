"""Choosing the backend by URL, and the pool's configuration (credentials never shown)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from radixcache.offload import LmdbStorage, NullStorage, StorageConfig, ValkeyStorage
from radixcache.offload.backends import PASSWORD_ENV, open_backend, storage_config
from radixcache.offload.valkey import ValkeyConfig, redact_url

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit

SECRET = "p@ss:w/rd"


def test_urls_name_the_backend(tmp_path: Path) -> None:
    assert storage_config(None) is None
    lmdb = storage_config(f"lmdb://{tmp_path}/rx?capacity_gib=0.5&durability=fast")
    assert isinstance(lmdb, StorageConfig)
    assert (str(lmdb.path), lmdb.capacity_bytes, lmdb.durability) == (f"{tmp_path}/rx", 1 << 29, "fast")
    assert isinstance(storage_config(str(tmp_path / "plain")), StorageConfig)
    single = storage_config("valkey://10.0.0.5:6380/2")
    assert isinstance(single, ValkeyConfig)
    assert (single.host, single.port, single.db, single.cluster, single.tls) == ("10.0.0.5", 6380, 2, False, False)
    cluster = storage_config("redis://node1:7000?cluster=true")
    assert isinstance(cluster, ValkeyConfig) and cluster.cluster and cluster.port == 7000
    tls = storage_config("rediss://alice@pool.internal/0")
    assert isinstance(tls, ValkeyConfig) and tls.tls and tls.username == "alice" and tls.port == 6379
    assert storage_config(tls) is tls


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/x", "unknown scheme 'ftp'"),
        ("valkey://host:6379/zero", "database number"),
        ("valkey://host:6379?cluster=maybe", "cluster must be true or false"),
        ("valkey://host:6379/1?cluster=true", "only database 0"),
        ("valkey://host:6379?timeout=3", "unknown option 'timeout'"),
        ("lmdb:///x?durability=never", "durability must be one of"),
        ("lmdb:///x?size=3", "unknown option 'size'"),
        ("", "empty"),
    ],
)
def test_bad_urls_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage_config(url)


def test_the_password_never_appears_in_reprs_or_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"valkey://alice:{SECRET.replace('@', '%40').replace('/', '%2F')}@host:6379/0"
    config = storage_config(url)
    assert isinstance(config, ValkeyConfig)
    assert config.password == SECRET and config.username == "alice"
    for text in (repr(config), str(config), config.describe(), redact_url(url)):
        assert SECRET not in text and "w%2Frd" not in text, text
    assert config.describe() == "valkey://alice:***@host:6379/0"
    with pytest.raises(ValueError) as err:
        storage_config(f"valkey://alice:{SECRET.replace('@', '%40').replace('/', '%2F')}@host:6379/x")
    assert "w%2Frd" not in str(err.value) and "***" in str(err.value)
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    from_env = storage_config("valkey://alice@host:6379/0")
    assert isinstance(from_env, ValkeyConfig) and from_env.password == SECRET
    assert SECRET not in repr(from_env)


def test_bad_config_values_are_refused() -> None:
    with pytest.raises(ValueError, match="socket_timeout_s"):
        ValkeyConfig(socket_timeout_s=0)
    with pytest.raises(ValueError, match="port"):
        ValkeyConfig(port=70000)
    with pytest.raises(ValueError, match="key_prefix"):
        ValkeyConfig(key_prefix=b"")
    with pytest.raises(TypeError, match="password"):
        ValkeyConfig(password=123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="storage must be"):
        storage_config(42)  # type: ignore[arg-type]


def test_open_backend_opens_each_backend(single_kit: PoolKit, tmp_path: Path) -> None:
    fp, spec = single_kit.fingerprint, single_kit.spec
    assert isinstance(open_backend(None, spec, fp).storage, NullStorage)
    opening = open_backend(f"lmdb://{tmp_path}/store", spec, fp)
    try:
        assert isinstance(opening.storage, LmdbStorage) and opening.state == "opened"
    finally:
        opening.storage.close()
    opening = open_backend(single_kit.url, spec, fp)
    pool = opening.storage
    assert opening.state == "opened"
    try:
        assert isinstance(pool, ValkeyStorage)
        host = single_kit.host(2)
        keys = single_kit.keys(2)
        assert single_kit.done(pool.put(keys, single_kit.tokens(2), host, single_kit.ids(0, 1), b"ns")) == 2
        assert pool.longest_prefix(keys) == 2
        stats = pool.pool_stats()
        assert stats.removals_observed and stats.policy == "volatile-lru" and stats.maxmemory == 256 << 20
    finally:
        pool.close()


def test_tier_config_takes_a_storage_url_and_keeps_the_password_out(tmp_path: Path) -> None:
    from radixcache.offload import StorageConfig, ValkeyConfig
    from radixcache.tiers.config import TierConfig

    pool = TierConfig(storage="valkey://alice:hunter2@127.0.0.1:6399/0?cluster=true")
    assert isinstance(pool.storage, ValkeyConfig)
    assert "hunter2" not in repr(pool) and "hunter2" not in str(pool.storage)
    disk = TierConfig(storage=str(tmp_path / "kv"))
    assert isinstance(disk.storage, StorageConfig) and str(disk.storage.path) == str(tmp_path / "kv")
    assert TierConfig().storage is None
    with pytest.raises(ValueError) as bad:
        TierConfig(storage="memcached://bob:hunter2@127.0.0.1:1")
    assert "memcached" in str(bad.value) and "hunter2" not in str(bad.value)

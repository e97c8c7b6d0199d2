"""Storage byte quotas set through the cache's quotas reach the LMDB store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixcache.cache_config import storage_quotas
from radixcache.namespace import Namespace
from radixcache.offload import StorageConfig
from radixcache.tenants.quota import QuotaBook, TenantQuota, parse_quotas
from radixcache.tiers.config import TierConfig, open_storage
from radixcache.transfer import KVSpec

SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.float16, page_size=4)


def test_storage_fields_are_validated_and_read_from_json() -> None:
    q = TenantQuota.from_json({"storage_bytes": 1000, "storage_floor": 10})
    assert (q.storage_bytes, q.storage_floor) == (1000, 10)
    with pytest.raises(ValueError, match="storage_floor=11 is above storage_bytes=10"):
        TenantQuota(storage_bytes=10, storage_floor=11)
    with pytest.raises(ValueError, match="storage_bytes must be a non-negative int or None"):
        TenantQuota(storage_bytes=-1)
    with pytest.raises(ValueError, match="storage_floor must be a non-negative int, got None"):
        TenantQuota(storage_floor=None)  # type: ignore[arg-type]


def test_the_cache_quotas_are_laid_over_the_store_config(tmp_path: Path) -> None:
    book = parse_quotas({"*": {"storage_bytes": 5000}, "a": {"storage_floor": 100},
                         "b": {"device_pages": 3}})
    quotas, default = storage_quotas(book)
    a = Namespace("a").tenant
    assert quotas == {a: (None, 100)} and default == (5000, 0)  # b sets no storage quota
    assert storage_quotas(QuotaBook()) == ({}, None) and storage_quotas(None) == ({}, None)
    b = Namespace("b").tenant
    tiers = TierConfig(storage=StorageConfig(path=tmp_path / "s", tenant_quotas={b: (7, 0)}))
    opening = open_storage(tiers, SPEC, quotas, default)
    try:
        config = opening.storage.config  # type: ignore[attr-defined]
        assert config.tenant_quotas == {a: (None, 100), b: (7, 0)}
        assert config.tenant_quota_default == (5000, 0)
        assert config.tenant_quota(Namespace("c").tenant) == (5000, 0)
    finally:
        opening.storage.close()


def _limit_in_force(storage: object, tenant: bytes | None, want: int | None) -> int | None:
    """The tenant's limit as the store reports it, once the writer thread has
    applied the last change (a run-time change is queued behind earlier jobs)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        got = storage.tenant_stats()[tenant].limit_bytes  # type: ignore[attr-defined]
        if got == want or time.monotonic() > deadline:
            return got  # type: ignore[no-any-return]
        time.sleep(0.01)


def test_a_quota_cleared_at_run_time_gives_the_tenant_its_configured_one_back(tmp_path: Path) -> None:
    """The book is laid over the store's config as the user wrote it, at open
    and at every run-time change alike: clearing the cache's quota of a
    tenant brings back the one its ``StorageConfig`` sets, and a change for
    one tenant leaves another's configured quota alone."""
    from radixcache import CacheConfig, RadixCache
    from radixcache.offload import HostPoolConfig

    a, b = Namespace("a").tenant, Namespace("b").tenant
    own = StorageConfig(path=tmp_path / "s", tenant_quotas={a: (7000, 0), b: (9000, 0)})
    tiers = TierConfig(host=HostPoolConfig(pages=8), storage=own)
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers,
                                   quotas={"a": TenantQuota(storage_bytes=5000)}))
    try:
        storage = cache.tiers.storage  # type: ignore[attr-defined]
        assert _limit_in_force(storage, a, 5000) == 5000  # the book's, at open
        cache.tenants.set_quota("a", TenantQuota(storage_bytes=6000))
        assert _limit_in_force(storage, a, 6000) == 6000
        assert _limit_in_force(storage, b, 9000) == 9000
        cache.tenants.set_quota("a", TenantQuota())  # cleared: the store's own again
        assert _limit_in_force(storage, a, 7000) == 7000
        assert _limit_in_force(storage, b, 9000) == 9000
    finally:
        cache.close()

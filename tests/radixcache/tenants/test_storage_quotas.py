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

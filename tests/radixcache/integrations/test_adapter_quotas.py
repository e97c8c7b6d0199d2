"""Quotas through both adapters, with the engines' real classes: the
``quotas`` setting of vLLM's tier entry (through vLLM's own spec factory and
tiering manager, vllm_kit.py) and of SGLang's extra config (SGLang's host
pools, sglang_kit.py); a bad one stops the start with the key named; each
tenant's retention deadline reaches the LMDB store's ``put``; a tenant over
its ``storage_bytes`` evicts only its own pages."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixcache.config import ConfigError
from radixcache.integrations.pagestore import PageStore
from radixcache.integrations.tenants import tenant_namespace
from radixcache.offload import LmdbStorage
from radixcache.transfer.ticket import Ticket

ACME = tenant_namespace("acme")


def vllm_kit() -> Any:
    return pytest.importorskip("tests.radixcache.integrations.vllm_kit")


def sglang_kit() -> Any:
    return pytest.importorskip("tests.radixcache.integrations.sglang_kit")


def record_puts(store: PageStore) -> list[tuple[float | None, bytes | None]]:
    """Wrap the real LMDB store's ``put`` so that each call's deadline
    (``PutMeta.expires_at``) and tenant are recorded; the put itself runs."""
    lmdb = store._storage
    assert isinstance(lmdb, LmdbStorage)
    seen: list[tuple[float | None, bytes | None]] = []
    real_put = lmdb.put

    def put(*args: Any, **kw: Any) -> Ticket:
        meta, tenant = args[5], args[6]
        seen.append((None if meta is None else meta.expires_at, tenant))
        return real_put(*args, **kw)

    lmdb.put = put  # type: ignore[method-assign]
    return seen


def tenant_records(store: PageStore, salt: str) -> int:
    lmdb = store._storage
    assert isinstance(lmdb, LmdbStorage)
    stats = lmdb.tenant_stats().get(tenant_namespace(salt).tenant)
    return 0 if stats is None else stats.records


# -- vLLM ------------------------------------------------------------------------
def test_vllm_tier_entry_quotas_are_decoded_and_a_bad_one_names_its_key(tmp_path: Path) -> None:
    kit = vllm_kit()
    for quotas, message in (
        ({"noisy": {"storage_byte": 1}},
         r"secondary tier 'RadixcacheTier': quotas\['noisy'\]: unknown key 'storage_byte'"),
        ({"*": {"device_pages": 64}},
         r"secondary tier 'RadixcacheTier': quotas\['\*'\]: `device_pages` is not enforced by a "
         r"page store on lmdb \(it enforces storage_bytes, storage_floor, ttl_s\)"),
        ({"q": {"storage_floor": 9, "storage_bytes": 4}}, r"quotas\['q'\]: TenantQuota: "
         r"storage_floor=9 is above storage_bytes=4"),
        ("noisy=1", r"Expected `object \| null`, got `str` - at `\$.quotas`"),
    ):
        entry = kit.tier_entry(tmp_path / "s", quotas=quotas)
        with pytest.raises(ConfigError, match=message):
            with kit.stack(kit.offloading_config([entry])):
                pass


def test_vllm_puts_carry_their_tenants_deadline(tmp_path: Path) -> None:
    kit = vllm_kit()
    entry = kit.tier_entry(tmp_path / "s", quotas={"acme": {"ttl_s": 60}})
    with kit.stack(kit.offloading_config([entry])) as s:
        seen = record_puts(s.tier.store)
        s.write(0, kit.random_block(1))
        before = time.time()
        s.tier.submit_store(kit.job(1, [kit.key(1)], [0], req=kit.ctx("a", salt="acme")))
        s.tier.submit_store(kit.job(2, [kit.key(2)], [0], req=kit.ctx("b")))
        after = time.time()
        assert [r.success for r in s.drain()] == [True, True]
        (acme_deadline, acme_tenant), (plain_deadline, plain_tenant) = seen
        assert acme_deadline is not None and before + 60 <= acme_deadline <= after + 60
        assert (acme_tenant, plain_deadline, plain_tenant) == (ACME.tenant, None, None)
        # the page reads back under its tenant, bit-exact
        s.tier.submit_load(kit.job(3, [kit.key(1)], [5], load=True, req=kit.ctx("a2", "acme")))
        assert [r.success for r in s.drain()] == [True]
        assert np.array_equal(s.read(5), kit.random_block(1))


def test_vllm_a_tenant_over_its_storage_bytes_evicts_its_own_pages(tmp_path: Path) -> None:
    kit = vllm_kit()
    limit = 3 * (kit.BLOCK_BYTES + 256)  # three records (a page and a header of ~130 B), not four
    entry = kit.tier_entry(tmp_path / "s", enable_kv_events=True,
                           quotas={"noisy": {"storage_bytes": limit}})
    noisy, quiet = kit.ctx("n", salt="noisy"), kit.ctx("q", salt="quiet")
    with kit.stack(kit.offloading_config([entry])) as s:
        for chunk in range(7):
            s.write(chunk, kit.random_block(chunk))
        s.tier.submit_store(kit.job(1, [kit.key(101), kit.key(102)], [0, 1], req=quiet))
        assert [r.success for r in s.drain()] == [True]
        for i in range(5):  # one page at a time: each put over the limit evicts the oldest
            s.tier.submit_store(kit.job(10 + i, [kit.key(i)], [2 + i], req=noisy))
            assert [r.success for r in s.drain()] == [True]
        assert tenant_records(s.tier.store, "noisy") == 3
        assert tenant_records(s.tier.store, "quiet") == 2
        hits = {n: s.tier.lookup(kit.key(n), req).name for n, req in (
            (0, noisy), (1, noisy), (2, noisy), (3, noisy), (4, noisy), (101, quiet),
            (102, quiet))}
        assert hits == {0: "MISS", 1: "MISS", 2: "HIT", 3: "HIT", 4: "HIT", 101: "HIT",
                        102: "HIT"}
        removed = [k for e in s.tier.take_events() if e.removed for k in e.keys]
        assert removed == [kit.key(0), kit.key(1)]  # announced, the quiet tenant's kept


# -- SGLang ----------------------------------------------------------------------
def sglang_backend(kit: Any, path: Path, host: Any, quotas: Any) -> Any:
    from radixcache.integrations.sglang import RadixcacheHiCacheStorage

    return RadixcacheHiCacheStorage(kit.storage_config(path, host, quotas=quotas), {})


def salt(name: str | None) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

    return HiCacheStorageExtraInfo(extra_info={"cache_salt": name} if name else None)


def test_sglang_extra_config_quotas_are_checked_at_construction(tmp_path: Path) -> None:
    kit = sglang_kit()
    host = kit.mha_pools("page_first")[1]
    source = r"--hicache-storage-backend-extra-config: "
    with pytest.raises(ConfigError, match=source + r"quotas\['acme'\]: unknown key 'ttl' "):
        sglang_backend(kit, tmp_path, host, {"acme": {"ttl": 5}})
    with pytest.raises(ConfigError, match=source + r"quotas\['acme'\]: TenantQuota.ttl_s must "
                                                   r"be a number of seconds"):
        sglang_backend(kit, tmp_path, host, {"acme": {"ttl_s": -1}})
    with pytest.raises(ConfigError, match=source + r"quotas\['\(none\)'\]: `storage_bytes` is "
                                                   r"not enforced by a page store on valkey"):
        sglang_backend(kit, "valkey://127.0.0.1:1/0", host, {"(none)": {"storage_bytes": 10}})
    store = sglang_backend(kit, tmp_path, host, {"acme": {"ttl_s": 30}, "*": {"ttl_s": 600}})
    assert store.quotas.get(ACME.tenant).ttl_s == 30 and store.quotas.default.ttl_s == 600


def test_sglang_puts_carry_their_tenants_deadline(tmp_path: Path) -> None:
    kit = sglang_kit()
    host = kit.mha_pools("page_first")[1]
    store = sglang_backend(kit, tmp_path, host, {"acme": {"ttl_s": 30}})
    store.register_mem_pool_host(host)
    try:
        seen = record_puts(store.store)
        kit.fill(host, 5)
        keys = kit.keys(3)
        before = time.time()
        assert store.batch_set_v1(keys[:2], kit.indices(0, 1), salt("acme")) == [True, True]
        assert store.batch_set_v1(keys[2:], kit.indices(2), salt(None)) == [True]
        after = time.time()
        (acme_deadline, acme_tenant), (plain_deadline, plain_tenant) = seen
        assert acme_deadline is not None and before + 30 <= acme_deadline <= after + 30
        assert (acme_tenant, plain_deadline, plain_tenant) == (ACME.tenant, None, None)
        assert store.batch_get_v1(keys[:2], kit.indices(4, 5), salt("acme")) == [True, True]
        assert kit.equal_pages(host, [4, 5], [0, 1])
    finally:
        store.close()


def test_sglang_a_tenant_over_its_storage_bytes_evicts_its_own_pages(tmp_path: Path) -> None:
    kit = sglang_kit()
    host = kit.mha_pools("page_first")[1]
    store = sglang_backend(kit, tmp_path, host, {})
    store.register_mem_pool_host(host)
    page_bytes = store.store.page_bytes
    store.close()
    limit = 3 * (page_bytes + 256)  # three records (a page and a header of ~160 B), not four
    store = sglang_backend(kit, tmp_path / "q", host, {"noisy": {"storage_bytes": limit}})
    store.register_mem_pool_host(host)
    try:
        kit.fill(host, 6)
        keys = kit.keys(7)
        assert store.batch_set_v1(keys[5:], kit.indices(5, 6), salt("quiet")) == [True, True]
        for i in range(5):
            assert store.batch_set_v1(keys[i:i + 1], kit.indices(i), salt("noisy")) == [True]
        exists = [store.batch_exists([k], salt("noisy")) for k in keys[:5]]
        assert exists == [0, 0, 1, 1, 1]
        assert store.batch_exists(keys[5:], salt("quiet")) == 2
        assert tenant_records(store.store, "noisy") == 3
    finally:
        store.close()

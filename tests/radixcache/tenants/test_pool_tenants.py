"""Tenants on a shared Valkey pool through the cache (a real ``valkey-server``
started by the test): a TTL reaches the values the cache stores (their expiry
is at most the deadline), ``pool_bytes`` limits a tenant's values in the pool
(set at open, changed at run time), and ``invalidate(tag)`` removes the pool's
values of every namespace put with the tag, also for a second engine that
never admitted it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

pytest.importorskip("redis")

from radixcache import CacheConfig, KVSpec, Namespace, RadixCache  # noqa: E402
from radixcache.offload import HostPoolConfig, storage_config  # noqa: E402
from radixcache.tenants import TenantQuota  # noqa: E402
from radixcache.tiers import HostTiers, TierConfig  # noqa: E402
from tests.offload.valkey.valkey_servers import ValkeyServer  # noqa: E402
from tests.radixcache.tenants.kit import P, prompt, serve  # noqa: E402

SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.float32, page_size=P)


@pytest.fixture(scope="module")
def server() -> Iterator[ValkeyServer]:
    s = ValkeyServer(maxmemory=64 << 20)
    yield s
    s.stop()


def make(server: ValkeyServer, quotas: object, model: str) -> RadixCache:
    tiers = TierConfig(host=HostPoolConfig(pages=32), write_policy="write_through",
                       prefetch_policy="wait_complete", model_id=model,
                       storage=storage_config(server.url))
    return RadixCache(CacheConfig(spec=SPEC, device_pages=32, tiers=tiers,
                                  quotas=quotas))  # type: ignore[arg-type]


def test_a_ttl_bounds_the_expiry_of_the_values_the_cache_stores(server: ValkeyServer) -> None:
    with server.client() as raw:
        raw.flushall()
    cache = make(server, {"a": TenantQuota(ttl_s=30)}, "pool-ttl")
    try:
        serve(cache, Namespace("a"), prompt(1, 3))
        cache.drain()
        with server.client() as raw:
            a_ttls = {key: raw.pttl(key) for key in raw.scan_iter(count=1000)}
        serve(cache, Namespace("b"), prompt(1, 3))
        cache.drain()
        with server.client() as raw:
            b_ttls = {key: raw.pttl(key) for key in raw.scan_iter(count=1000) if key not in a_ttls}
        a_values = [t for t in a_ttls.values() if t > 0]  # (sets and indexes have none)
        b_values = [t for t in b_ttls.values() if t > 0]
        assert a_values and all(t <= 30_000 for t in a_values)  # at most the deadline
        assert b_values and all(t > 30_000 for t in b_values)  # no TTL: the pool's ttl_s
    finally:
        cache.close()


def test_invalidate_removes_the_tag_from_the_pool_for_every_engine(server: ValkeyServer) -> None:
    writer = make(server, None, "pool-tags")
    tagged, plain = Namespace("t1", tags=("template:v8",)), Namespace("t2")
    try:
        serve(writer, tagged, prompt(2, 3))
        serve(writer, plain, prompt(2, 3))
        writer.drain()
    finally:
        writer.close()
    other = make(server, None, "pool-tags")  # a second engine: never admitted `tagged`
    try:
        req = other.admit(prompt(2, 3), Namespace("t1"))
        assert req.cached_len == 12  # the pool has it
        other.release(req)
        other.drain()
        other.reset()
        other.invalidate("template:v8")
        assert other.admit(prompt(2, 3), Namespace("t1")).cached_len == 0
        assert other.admit(prompt(2, 3), plain).cached_len == 12
    finally:
        other.close()


def test_pool_bytes_keep_a_tenant_within_its_share_of_the_pool(server: ValkeyServer) -> None:
    cache = make(server, {"noisy": TenantQuota(pool_bytes=1)}, "pool-quota")
    try:
        serve(cache, Namespace("quiet"), prompt(3, 2))
        serve(cache, Namespace("noisy"), prompt(3, 2))
        cache.drain()
        pool = cache.tiers.storage  # type: ignore[attr-defined]
        stats = pool.tenant_stats()
        noisy = Namespace("noisy").tenant
        assert stats[noisy].dropped_pages == 2 and stats[noisy].stored_bytes == 0
        cache.tenants.set_quota("noisy", TenantQuota(pool_bytes=1 << 20))  # run time
        serve(cache, Namespace("noisy"), prompt(4, 2))
        cache.drain()
        assert pool.tenant_stats()[noisy].stored_bytes > 0
        cache.reset()
        assert cache.admit(prompt(3, 2), Namespace("quiet")).cached_len == 8
    finally:
        cache.close()


def test_pages_read_back_from_the_pool_keep_their_values_deadline(server: ValkeyServer) -> None:
    """A tenant's pages stored with a 60 s TTL and read back from the pool by a
    fresh engine 2 s later are dated by the value's PTTL: on the device until
    the deadline they were written with, not 2 s longer. (The clock is real
    time plus a jump the test makes, since the server's PTTL runs in real time.)"""
    import time
    from dataclasses import replace

    jump = [0.0]

    def clock() -> float:
        return time.time() + jump[0]

    def engine() -> RadixCache:
        pool = replace(storage_config(server.url), clock=clock)  # type: ignore[type-var]
        tiers = TierConfig(host=HostPoolConfig(pages=32), write_policy="write_through",
                           prefetch_policy="wait_complete", model_id="pool-readback", storage=pool)
        return RadixCache(CacheConfig(spec=SPEC, device_pages=32, tiers=tiers,
                                      quotas={"a": TenantQuota(ttl_s=60)}), clock=clock)

    first = engine()
    try:
        written = clock()
        serve(first, Namespace("a"), prompt(5, 3))
        first.drain()
    finally:
        first.close()
    time.sleep(2.0)
    second = engine()
    try:
        req = second.admit(prompt(5, 3), Namespace("a"))
        assert req.cached_len == 12  # from the pool
        second.reserve(req, 1)
        second.release(req)
        second.drain()
        assert second.peek(prompt(5, 3), Namespace("a")) == 12  # kept on the device
        jump[0] = written + 59 - time.time()
        second.poll()
        assert second.peek(prompt(5, 3), Namespace("a")) == 12  # 59 s into its life
        jump[0] = written + 61 - time.time()  # past its deadline, not past read + 60 s
        second.poll()
        assert second.peek(prompt(5, 3), Namespace("a")) == 0
    finally:
        second.close()


def test_a_run_time_quota_change_keeps_the_limits_set_on_the_pool_config(server: ValkeyServer) -> None:
    """The book is laid over the ``ValkeyConfig`` as the user wrote it, at
    open and at each change: a tenant limited only by the pool config stays
    limited after another tenant's quota changes, and a cleared quota gives a
    tenant its configured limit back."""
    from dataclasses import replace

    a, b = Namespace("a").tenant, Namespace("b").tenant
    pool = replace(storage_config(server.url), tenant_quotas={a: 3000, b: 4000})
    tiers = TierConfig(host=HostPoolConfig(pages=32), write_policy="write_through",
                       prefetch_policy="wait_complete", model_id="pool-own-limits", storage=pool)
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=32, tiers=tiers,
                                   quotas={"a": TenantQuota(pool_bytes=1000)}))
    try:
        storage = cache.tiers.storage  # type: ignore[attr-defined]
        limits = {t: s.limit_bytes for t, s in storage.tenant_stats().items()}
        assert limits[a] == 1000 and limits[b] == 4000  # at open
        cache.tenants.set_quota("a", TenantQuota(pool_bytes=2000))
        limits = {t: s.limit_bytes for t, s in storage.tenant_stats().items()}
        assert limits[a] == 2000 and limits[b] == 4000  # b's own limit stays
        cache.tenants.set_quota("a", TenantQuota())
        assert storage.tenant_stats()[a].limit_bytes == 3000  # the pool config's again
    finally:
        cache.close()

"""Per-tenant byte quotas in the pool: a tenant over its limit evicts its own
oldest values, other tenants are untouched, what cannot fit is dropped and
counted; limits change at run time; stale figures are dropped, not evicted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyCluster, ValkeyServer

A, B = b"s:tenant-a", b"s:tenant-b"


def _put(kit: PoolKit, pool, keys: list[bytes], tenant: bytes | None, host, start: int = 0) -> int:  # type: ignore[no-untyped-def]
    n = len(keys)
    pages = np.arange(n, dtype=np.int32) % host.num_pages
    ns = b"ns-" + (tenant or b"none")
    result: int = kit.done(pool.put(keys, kit.tokens(n, start), host, pages, ns, tenant=tenant))
    return result


def _value_bytes(kit: PoolKit, server: ValkeyServer) -> int:
    """Bytes of one stored one-page value (what a quota counts)."""
    pool = kit.pool()
    key = kit.keys(1, b"probe")
    _put(kit, pool, key, None, kit.host(1))
    with server.client() as raw:
        size = int(raw.strlen(pool.pool_keys(key)[0]))
        raw.delete(pool.pool_keys(key)[0])
    return size


def test_a_tenant_over_its_limit_evicts_its_own_oldest_values(
    single_kit: PoolKit, valkey_server: ValkeyServer
) -> None:
    size = _value_bytes(single_kit, valkey_server)
    pool = single_kit.pool(tenant_quotas={A: 5 * size})
    host = single_kit.host(8)
    a_keys = single_kit.keys(9, b"a")
    b_keys = single_kit.keys(6, b"b")
    assert _put(single_kit, pool, b_keys, B, host) == 6  # no limit for B
    assert _put(single_kit, pool, a_keys[:3], A, host) == 3
    assert _put(single_kit, pool, a_keys[3:7], A, host, 3) == 4  # 7 > 5: the 2 oldest go
    present = [pool.longest_prefix([k]) for k in a_keys[:7]]
    assert present == [0, 0, 1, 1, 1, 1, 1]
    assert pool.longest_prefix(b_keys) == 6  # another tenant's values are never evicted
    stats = pool.tenant_stats()[A]
    assert (stats.stored_bytes, stats.values, stats.limit_bytes) == (5 * size, 5, 5 * size)
    assert (stats.quota_evicted, stats.dropped_pages) == (2, 0)
    assert pool.stats().evicted == 2
    assert set(a_keys[:2]) <= set(pool.take_removed())  # reported as removals
    assert B not in pool.tenant_stats()  # not counted: no limit, nothing dropped


def test_a_put_never_evicts_its_own_pages_and_a_value_over_the_limit_is_dropped(
    single_kit: PoolKit, valkey_server: ValkeyServer
) -> None:
    size = _value_bytes(single_kit, valkey_server)
    pool = single_kit.pool(tenant_quotas={A: 4 * size, None: size - 1})
    host = single_kit.host(8)
    keys = single_kit.keys(7)
    assert _put(single_kit, pool, keys, A, host) == 4  # the leading pages that fit
    assert pool.longest_prefix(keys) == 4
    stats = pool.tenant_stats()[A]
    assert (stats.values, stats.quota_evicted, stats.dropped_pages) == (4, 0, 3)
    assert pool.stats().failed_ops == 0
    lone = single_kit.keys(2, b"default")
    assert _put(single_kit, pool, lone, None, host) == 0  # larger than the default tenant's limit
    assert pool.longest_prefix(lone) == 0
    assert pool.tenant_stats()[None].dropped_pages == 2


def test_limits_change_at_run_time(single_kit: PoolKit, valkey_server: ValkeyServer) -> None:
    size = _value_bytes(single_kit, valkey_server)
    pool = single_kit.pool()
    host = single_kit.host(8)
    keys = single_kit.keys(8)
    pool.set_tenant_quotas({A: 6 * size})
    assert _put(single_kit, pool, keys[:6], A, host) == 6
    pool.set_tenant_quotas({}, default=3 * size)  # A falls under the default now
    assert _put(single_kit, pool, keys[6:7], A, host, 6) == 1
    assert [pool.longest_prefix([k]) for k in keys[:7]] == [0, 0, 0, 0, 1, 1, 1]
    assert pool.tenant_stats()[A].values == 3
    pool.set_tenant_quotas({A: None}, default=3 * size)  # unlimited again: not counted
    assert _put(single_kit, pool, keys[7:], A, host, 7) == 1
    assert pool.longest_prefix(keys[4:]) == 4
    with pytest.raises(ValueError, match="non-negative int"):
        pool.set_tenant_quotas({A: -1})
    with pytest.raises(TypeError, match="bytes or None"):
        pool.set_tenant_quotas({"a": 5})  # type: ignore[dict-item]


def test_values_gone_behind_the_counter_are_dropped_from_it_not_evicted(
    single_kit: PoolKit, valkey_server: ValkeyServer
) -> None:
    size = _value_bytes(single_kit, valkey_server)
    pool = single_kit.pool(tenant_quotas={A: 3 * size})
    host = single_kit.host(8)
    keys = single_kit.keys(5)
    assert _put(single_kit, pool, keys[:3], A, host) == 3
    with valkey_server.client() as raw:  # expired or evicted by the server: the counter is stale
        raw.delete(pool.pool_keys(keys[:1])[0])
    assert pool.tenant_stats()[A].values == 3
    assert _put(single_kit, pool, keys[3:4], A, host, 3) == 1
    assert [pool.longest_prefix([k]) for k in keys[:4]] == [0, 1, 1, 1]  # nothing live evicted
    stats = pool.tenant_stats()[A]
    assert (stats.values, stats.stored_bytes, stats.quota_evicted) == (3, 3 * size, 0)


def test_engines_share_one_count_per_tenant(single_kit: PoolKit, valkey_server: ValkeyServer) -> None:
    size = _value_bytes(single_kit, valkey_server)
    first = single_kit.pool(tenant_quotas={A: 4 * size})
    second = single_kit.pool(tenant_quotas={A: 4 * size})
    host = single_kit.host(8)
    keys = single_kit.keys(6)
    assert _put(single_kit, first, keys[:3], A, host) == 3
    assert _put(single_kit, second, keys[3:6], A, host, 3) == 3
    assert [first.longest_prefix([k]) for k in keys] == [0, 0, 1, 1, 1, 1]
    assert second.tenant_stats()[A].quota_evicted == 2
    assert first.tenant_stats()[A].values == 4


def test_on_a_cluster_each_node_keeps_its_share(valkey_cluster: ValkeyCluster, pool_kit_at) -> None:  # type: ignore[no-untyped-def]
    valkey_cluster.flush()
    kit = pool_kit_at(valkey_cluster.url)
    probe = kit.pool()
    key = kit.keys(1, b"probe")
    _put(kit, probe, key, None, kit.host(1))
    node = valkey_cluster.nodes[valkey_cluster.node_of(probe.pool_keys(key)[0])]
    with node.client() as raw:
        size = int(raw.strlen(probe.pool_keys(key)[0]))
    limit = 30 * size
    pool = kit.pool(tenant_quotas={A: limit})
    host = kit.host(16)
    a_keys = kit.keys(90, b"cluster-a")
    b_keys = kit.keys(20, b"cluster-b")
    assert _put(kit, pool, b_keys, B, host) == 20
    stored = 0
    for start in range(0, 90, 10):
        stored += _put(kit, pool, a_keys[start : start + 10], A, host, start)
    stats = pool.tenant_stats()[A]
    assert stats.stored_bytes <= limit
    assert stats.values == sum(pool.longest_prefix([k]) for k in a_keys)  # exact per node
    assert stats.quota_evicted > 0 and stats.quota_evicted + stats.values == stored
    assert pool.longest_prefix(b_keys) == 20

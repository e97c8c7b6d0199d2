"""Host quotas: a tenant's host limit (own evictions, dropped backups and
fetches), its host floor against other tenants, the events, exact per-tenant
host counts after every step, run-time changes, and the cache without quotas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixcache import CacheConfig, Namespace, RadixCache
from radixcache.events.types import BlockRemoved, BlockStored
from radixcache.offload import HostPoolConfig, StorageConfig
from radixcache.tenants import TenantQuota, tenant_label
from radixcache.tenants.host_eviction import TenantHostEviction
from radixcache.tiers import HostTiers, TierConfig
from radixcache.tiers.host_eviction import HostEviction
from radixcache.tiers.load_jobs import FetchJob
from radixcache.tiers.write_jobs import BackupJob
from tests.radixcache.tiers.tierkit import SPEC

P = SPEC.page_size
A, B = Namespace("a"), Namespace("b")
HOST = "CPU_PINNED"


def make(
    quotas: object = None,
    host_pages: int = 32,
    device_pages: int = 64,
    events: bool = False,
    storage: Path | None = None,
) -> RadixCache:
    store = None if storage is None else StorageConfig(path=storage, capacity_bytes=1 << 20)
    tiers = TierConfig(host=HostPoolConfig(pages=host_pages), write_policy="write_through",
                       prefetch_policy="wait_complete", storage=store, model_id="test-model")
    return RadixCache(CacheConfig(spec=SPEC, device_pages=device_pages, tiers=tiers,
                                  quotas=quotas, record_events=events))  # type: ignore[arg-type]


def tiers_of(cache: RadixCache) -> HostTiers:
    assert isinstance(cache.tiers, HostTiers)
    return cache.tiers


def prompt(i: int, pages: int) -> np.ndarray:
    """``pages`` whole pages of tokens plus one, distinct per ``i``."""
    return np.arange(i * 1000, i * 1000 + pages * P + 1, dtype=np.int32)


def recount(cache: RadixCache) -> dict[str, int]:
    """Host pages per tenant, counted over every tree node."""
    out: dict[str, int] = {}
    for node in cache.tree.nodes():
        if node.host is not None:
            label = tenant_label(node.namespace.tenant)
            out[label] = out.get(label, 0) + int(node.host.size)
    return out


def recount_in_flight(cache: RadixCache) -> dict[str, int]:
    """Host pages that live backups and fetches own, per tenant."""
    out: dict[str, int] = {}
    for job in tiers_of(cache).jobs:
        if isinstance(job, BackupJob):
            ns = job.last.namespace
        elif isinstance(job, FetchJob):
            ns = job.namespace
        else:
            continue
        label = tenant_label(ns.tenant)
        out[label] = out.get(label, 0) + int(job.host_pages().size)
    return out


def check(cache: RadixCache) -> dict[str, int]:
    """The integrity check, the ledger's host counts against a recount of the
    tree (and, with quotas, its pages in flight against the jobs'), and every
    host limit kept; returns the recount."""
    cache.check_integrity()
    host = recount(cache)
    stats = cache.tenants.stats()
    assert {k: s.host_pages for k, s in stats.items() if s.host_pages} == host
    ledger = tiers_of(cache).index.ledger
    if cache.tenants.quotas_on:
        flying = {tenant_label(k): v for k, v in ledger.host_in_flight.items()}  # type: ignore[attr-defined]
        assert flying == recount_in_flight(cache)
        for label, s in stats.items():
            limit = s.quota.host_pages
            if limit is not None:
                assert host.get(label, 0) + flying.get(label, 0) <= limit, label
    return host


def serve(cache: RadixCache, ns: Namespace, tokens: np.ndarray, drain: bool = True,
          release: bool = True):  # type: ignore[no-untyped-def]
    """Admit, compute and commit ``tokens``; release; let the tier jobs land."""
    req = cache.admit(tokens, ns)
    check(cache)
    n = tokens.size - req.num_computed
    cache.reserve(req, n)
    cache.commit(req, n)
    check(cache)
    if release:
        cache.release(req)
        check(cache)
    if drain:
        cache.drain()
        check(cache)
    return req


def on_host(cache: RadixCache, ns: Namespace, tokens: np.ndarray) -> int:
    """Pages of ``tokens``' cached prefix that have a host copy."""
    node = cache.tree.match(ns, tokens[:-1]).last_device_node
    pages = 0
    while node is not None and node.parent is not None:
        pages += 0 if node.host is None else int(node.host.size)
        node = node.parent
    return pages


def test_a_tenant_at_its_host_limit_evicts_its_own_copies_and_no_one_elses() -> None:
    cache = make({"a": TenantQuota(host_pages=4)})
    assert isinstance(tiers_of(cache).index.eviction, TenantHostEviction)
    serve(cache, B, prompt(99, 4))
    for i in range(4):
        serve(cache, A, prompt(i, 2))
        assert check(cache).get("a", 0) == min(4, 2 * (i + 1))
    assert check(cache) == {"a": 4, "b": 4}  # the pool had room: B was never touched
    stats = cache.tenants.stats()
    assert stats["a"].counters.host_own_evicted_pages == 4
    assert stats["a"].counters.host_dropped_pages == 0
    assert stats["b"].counters.host_own_evicted_pages == 0
    assert stats["b"].counters.host_pressure_evicted_pages == 0
    assert tiers_of(cache).stats().host_evicted_pages == 4
    # the oldest copies went, the newest stay; the device copies were untouched
    assert [on_host(cache, A, prompt(i, 2)) for i in range(4)] == [0, 0, 2, 2]
    assert all(cache.tree.peek(A, prompt(i, 2)) == 2 * P for i in range(4))
    cache.close()


def test_backups_in_flight_count_against_the_limit_and_what_cannot_fit_is_dropped() -> None:
    cache = make({"a": TenantQuota(host_pages=4)})
    tiers = tiers_of(cache)
    serve(cache, A, prompt(0, 2), drain=False)
    serve(cache, A, prompt(1, 2), drain=False)
    assert cache.tiers.index.ledger.host_in_flight == {A.tenant: 4}  # type: ignore[attr-defined]
    serve(cache, A, prompt(2, 2), drain=False)  # 4 in flight: nothing of its own can go yet
    stats = cache.tenants.stats()["a"]
    assert stats.counters.host_dropped_pages == 2
    assert stats.counters.host_own_evicted_pages == 0
    assert tiers.stats().backups_skipped == 1
    cache.drain()
    assert check(cache) == {"a": 4}
    assert on_host(cache, A, prompt(2, 2)) == 0  # skipped, not cached on the host
    # a backup larger than the whole limit is dropped without evicting anything
    serve(cache, A, prompt(3, 5))
    stats = cache.tenants.stats()["a"]
    assert stats.counters.host_dropped_pages == 2 + 5
    assert stats.counters.host_own_evicted_pages == 0
    assert check(cache) == {"a": 4}
    cache.close()


def test_copies_live_requests_lock_are_not_evicted_the_backup_is_dropped() -> None:
    cache = make({"a": TenantQuota(host_pages=4)})
    live = [serve(cache, A, prompt(i, 2), release=False) for i in range(2)]
    serve(cache, A, prompt(2, 2))  # A's copies are all locked by live requests
    stats = cache.tenants.stats()["a"]
    assert stats.counters.host_dropped_pages == 2 and stats.counters.host_own_evicted_pages == 0
    for req in live:
        cache.release(req)
        check(cache)
    serve(cache, A, prompt(3, 2))  # free now: its oldest copy goes
    stats = cache.tenants.stats()["a"]
    assert stats.counters.host_own_evicted_pages == 2
    assert [on_host(cache, A, prompt(i, 2)) for i in range(4)] == [0, 2, 0, 2]
    cache.close()


def test_a_host_floor_holds_against_another_tenant_page_exact() -> None:
    cache = make({"b": TenantQuota(host_floor=4)}, host_pages=8, events=True)
    serve(cache, B, prompt(50, 6))  # one 6-page node of B, 2 pages above its floor
    stored = [e for e in cache.take_events() if isinstance(e, BlockStored) and e.medium == HOST]
    b_hashes = [h for e in stored for h in e.block_hashes]
    assert len(b_hashes) == 6
    serve(cache, A, prompt(1, 4))  # 2 free: B's oldest copy goes, cut to its tail
    assert check(cache) == {"a": 4, "b": 4}
    removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved) and e.medium == HOST]
    assert [h for e in removed for h in e.block_hashes] == b_hashes[4:]  # only the tail
    serve(cache, A, prompt(2, 4))  # B at its floor: A's own older copy goes instead
    assert check(cache) == {"a": 4, "b": 4}
    assert [on_host(cache, A, prompt(i, 4)) for i in (1, 2)] == [0, 4]
    stats = cache.tenants.stats()
    assert stats["b"].counters.host_pressure_evicted_pages == 2
    assert stats["a"].counters.host_pressure_evicted_pages == 4
    assert stats["b"].counters.host_own_evicted_pages == 0
    # B's head is still on the host: once off the device, it loads back from there
    cache.evict(cache.stats().evictable_pages)
    check(cache)
    req = cache.admit(prompt(50, 6), B)
    assert req.cached_len == 4 * P
    assert tiers_of(cache).stats().host_hit_tokens == 4 * P
    cache.release(req)
    check(cache)
    cache.close()


def test_a_tenant_at_its_floor_is_never_taken_below_it_when_the_pool_is_short() -> None:
    cache = make({"b": TenantQuota(host_floor=6)}, host_pages=8)
    serve(cache, B, prompt(50, 3))
    serve(cache, B, prompt(51, 3))  # B holds 6 host pages: its whole floor
    for i in range(4):
        serve(cache, A, prompt(i, 2))
        assert check(cache).get("b") == 6
    stats = cache.tenants.stats()
    assert stats["b"].counters.host_pressure_evicted_pages == 0
    assert stats["a"].counters.host_pressure_evicted_pages == 3 * 2
    serve(cache, A, prompt(9, 3))  # more than the pool less B's floor: not backed up,
    assert check(cache) == {"a": 2, "b": 6}  # and nothing evicted for it
    assert on_host(cache, A, prompt(9, 3)) == 0
    assert tiers_of(cache).stats().backups_skipped == 1
    # B's own pressure may take B below its floor
    serve(cache, B, prompt(52, 4))
    assert check(cache).get("b", 0) < 6
    cache.close()


def test_quota_evictions_are_announced_as_host_removals() -> None:
    cache = make({"a": TenantQuota(host_pages=2)}, events=True)
    serve(cache, A, prompt(0, 2))
    first = [h for e in cache.take_events()
             if isinstance(e, BlockStored) and e.medium == HOST for h in e.block_hashes]
    serve(cache, A, prompt(1, 2))
    events = cache.take_events()
    removed = [h for e in events if isinstance(e, BlockRemoved) and e.medium == HOST
               for h in e.block_hashes]
    stored = [h for e in events if isinstance(e, BlockStored) and e.medium == HOST
              for h in e.block_hashes]
    assert removed == first and len(stored) == 2
    assert not [e for e in events if isinstance(e, BlockRemoved) and e.medium != HOST]
    # a consumer applying the host events in order holds what the host holds
    cache.tenants.set_quota("a", TenantQuota(host_pages=0))
    gone = [h for e in cache.take_events() if isinstance(e, BlockRemoved) and e.medium == HOST
            for h in e.block_hashes]
    assert gone == stored
    assert check(cache) == {}
    assert cache.tenants.stats()["a"].counters.host_own_evicted_pages == 4
    cache.close()


def test_set_quota_enforces_a_lowered_host_limit_and_set_default_too() -> None:
    cache = make({})
    for i in range(3):
        serve(cache, A, prompt(i, 2))
    serve(cache, B, prompt(9, 2))
    assert check(cache) == {"a": 6, "b": 2}
    assert cache.tenants.set_quota("a", TenantQuota(host_pages=3)) == 0  # no device page went
    assert check(cache) == {"a": 2, "b": 2}  # whole copies go: 4 pages, the 2 oldest
    assert cache.tenants.stats()["a"].counters.host_own_evicted_pages == 4
    cache.tenants.set_default(TenantQuota(host_pages=0))
    assert check(cache) == {"a": 2}  # A has its own quota; B's default now forbids copies
    serve(cache, B, prompt(10, 1))
    assert cache.tenants.stats()["b"].counters.host_dropped_pages == 1
    cache.close()


def test_forget_and_reset_keep_the_host_counts_exact() -> None:
    cache = make({"a": TenantQuota(host_pages=6)})
    serve(cache, A, prompt(0, 2))
    serve(cache, B, prompt(1, 2))
    serve(cache, A, prompt(2, 2), drain=False)  # a backup of A in flight
    cache.forget_namespace(A)
    check(cache)
    cache.drain()
    assert check(cache) == {"b": 2}
    serve(cache, A, prompt(0, 3))
    assert check(cache) == {"a": 3, "b": 2}
    cache.reset()
    assert check(cache) == {}
    assert tiers_of(cache).index.ledger.host_in_flight == {}  # type: ignore[attr-defined]
    serve(cache, A, prompt(0, 3))
    assert check(cache) == {"a": 3}
    cache.close()


def test_a_fetch_from_storage_is_limited_like_a_backup(tmp_path: Path) -> None:
    store = tmp_path / "s"
    writer = make(storage=store)
    serve(writer, A, prompt(0, 4))
    serve(writer, A, prompt(1, 2))
    writer.close()
    cache = make({"a": TenantQuota(host_pages=3)}, storage=store)
    req = cache.admit(prompt(0, 4), A)  # 4 pages in storage: more than the limit
    assert req.cached_len == 0
    check(cache)
    assert cache.tenants.stats()["a"].counters.host_dropped_pages == 4
    cache.release(req)
    req = cache.admit(prompt(1, 2), A)  # 2 pages fit: fetched into host pages
    assert req.cached_len == 2 * P
    check(cache)
    assert recount_in_flight(cache) == {"a": 2}
    cache.drain()
    assert check(cache) == {"a": 2}
    cache.release(req)
    check(cache)
    cache.close()


def test_without_quotas_host_allocation_is_unchanged_and_counts_stay_exact() -> None:
    cache = make(host_pages=8)
    tiers = tiers_of(cache)
    assert type(tiers.index.eviction) is HostEviction
    assert tiers.allocate_host.__func__ is HostTiers.allocate_host  # type: ignore[attr-defined]
    for i in range(3):
        serve(cache, A if i % 2 else B, prompt(i, 3))
    assert check(cache) == {"a": 3, "b": 3}  # the pool (8) made room in LRU order
    assert tiers.stats().host_evicted_pages == 3
    assert tiers.index.ledger.host_in_flight == {}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="quotas are off"):
        cache.tenants.set_quota("a", TenantQuota(host_pages=1))
    cache.close()


def test_random_steps_keep_counts_limits_floors_and_the_event_stream() -> None:
    """Three tenants with host limits and floors on a small host pool (the
    device never evicts: every host eviction is a quota's or the pool's),
    random prompts sharing prefixes, jobs landing now or later. After every
    step: ``check`` (integrity, ledger against a recount, limits); no tenant
    below its floor because of another tenant; a consumer applying the host
    events holds exactly as many host pages as the tree."""
    rng = np.random.default_rng(7)
    quotas = {None: TenantQuota(host_pages=6, host_floor=3), "a": TenantQuota(host_floor=4),
              "b": TenantQuota(host_pages=5)}
    floors = {"(none)": 3, "a": 4, "b": 0}
    cache = make(quotas, host_pages=12, device_pages=320, events=True)
    tenants = [Namespace(), A, B]
    on_host_events: set[int] = set()
    for _ in range(150):
        ns = tenants[int(rng.integers(3))]
        before = recount(cache)
        serve(cache, ns, prompt(int(rng.integers(20)), int(rng.integers(1, 5))),
              drain=bool(rng.integers(2)))
        after = check(cache)
        me = tenant_label(ns.tenant)
        for label, had in before.items():
            if label != me:
                assert after.get(label, 0) >= min(had, floors[label]), (label, had, after)
        for e in cache.take_events():
            if isinstance(e, BlockStored) and e.medium == HOST:
                on_host_events.update(e.block_hashes)
            elif isinstance(e, BlockRemoved) and e.medium == HOST:
                on_host_events.difference_update(e.block_hashes)
        assert len(on_host_events) == sum(after.values())
    assert cache.stats().evicted_pages == 0  # (the device never had to evict)
    c = {k: s.counters for k, s in cache.tenants.stats().items()}
    assert c["(none)"].host_own_evicted_pages > 0 and c["b"].host_own_evicted_pages > 0
    assert sum(x.host_pressure_evicted_pages for x in c.values()) > 0
    assert sum(x.host_dropped_pages for x in c.values()) > 0
    cache.close()

"""Device quotas: a tenant's limit, its floor against other tenants, the
counters, the events, and run-time changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixcache import CacheConfig, KVSpec, Namespace, OutOfPagesError, RadixCache
from radixcache.events.types import BlockRemoved
from radixcache.tenants import QuotaBook, TenantQuota, parse_quotas, tenant_key
from tests.radixcache.tenants.kit import P, prompt, serve

A, B = Namespace("a"), Namespace("b")


def make(pages: int = 16, quotas: object = None, events: bool = False) -> RadixCache:
    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
    return RadixCache(CacheConfig(spec=spec, device_pages=pages, allocate_kv=False,
                                  quotas=quotas, record_events=events))  # type: ignore[arg-type]


def held(cache: RadixCache, ns: Namespace) -> int:
    return sum(int(n.device.size) for n in cache.tree.nodes()
               if n.device is not None and n.namespace.tenant == ns.tenant)


def test_a_tenant_at_its_limit_evicts_its_own_pages_and_no_one_elses() -> None:
    cache = make(32, {"a": TenantQuota(device_pages=6)})
    serve(cache, B, prompt(99, 4))
    for i in range(5):
        serve(cache, A, prompt(i, 3))
        assert held(cache, A) <= 6
    assert held(cache, B) == 4  # the pool had room: B was never touched
    stats = cache.tenants.stats()
    assert stats["a"].device_pages == held(cache, A) == 6
    assert stats["a"].counters.own_evicted_pages == 5 * 3 - 6
    assert stats["b"].counters.own_evicted_pages == stats["b"].counters.pressure_evicted_pages == 0
    # the most recent prompts of A are the ones kept
    assert cache.admit(prompt(4, 3), A).cached_len == 12


def test_what_does_not_fit_a_limit_is_dropped_counted_and_stays_private() -> None:
    cache = make(32, {"a": TenantQuota(device_pages=4)})
    live = serve(cache, A, prompt(0, 3), release=False)  # 3 pages cached and locked
    req = serve(cache, A, prompt(1, 3), release=False)  # only 1 more fits
    assert held(cache, A) == 4
    assert req.shared_pages == 1
    assert cache.tenants.stats()["a"].counters.dropped_pages == 2
    free = cache.stats().free_pages
    cache.release(req)
    assert cache.stats().free_pages == free + 3  # the 2 dropped pages and the partial one
    cache.release(live)
    cache.check_integrity()


def test_a_floor_holds_against_another_tenants_pressure_and_refusals_evict_nothing() -> None:
    cache = make(16, {"b": TenantQuota(device_floor=5)})
    serve(cache, B, prompt(50, 4))
    serve(cache, B, prompt(51, 4))  # B holds 8 pages, 3 above its floor
    for i in range(6):
        serve(cache, A, prompt(i, 3))
        assert held(cache, B) >= 5
    assert held(cache, B) == 5
    assert cache.tenants.stats()["b"].counters.pressure_evicted_pages == 3
    # A now asks for more than the pool less B's floor: refused, nothing evicted
    before = (held(cache, A), held(cache, B), cache.stats().free_pages)
    req = cache.admit(prompt(70, 12), A)
    with pytest.raises(OutOfPagesError):
        cache.reserve(req, 12 * P)
    assert (held(cache, A), held(cache, B), cache.stats().free_pages) == before
    cache.release(req)
    # B's own requests may take B below its floor
    serve(cache, B, prompt(52, 10))
    cache.check_integrity()


def test_a_floor_cuts_a_victim_page_exact() -> None:
    cache = make(12, {"b": TenantQuota(device_floor=3)})
    serve(cache, B, prompt(50, 5))  # one 5-page node
    serve(cache, A, prompt(1, 8))  # needs 9 pages, 7 free: 2 of B's go, not all 5
    assert held(cache, B) == 3
    assert cache.admit(prompt(50, 5), B).cached_len == 3 * P  # the head stayed


def test_quota_evictions_are_announced() -> None:
    cache = make(32, {"a": TenantQuota(device_pages=3)}, events=True)
    serve(cache, A, prompt(0, 3))
    cache.take_events()
    serve(cache, A, prompt(1, 3))
    removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert sum(len(e.block_hashes) for e in removed) == 3


def test_set_quota_at_run_time_enforces_a_lowered_limit() -> None:
    cache = make(32, {})
    assert cache.tenants.quotas_on
    for i in range(3):
        serve(cache, A, prompt(i, 3))
    assert held(cache, A) == 9
    assert cache.tenants.set_quota("a", TenantQuota(device_pages=4)) == 5
    assert held(cache, A) == 4
    assert cache.tenants.quota("a").device_pages == 4
    assert cache.tenants.set_quota("a", None) == 0
    assert cache.tenants.quota("a") == TenantQuota()
    assert cache.tenants.set_default(TenantQuota(device_pages=2)) == 2
    assert held(cache, A) == 2
    with pytest.raises(TypeError):
        cache.tenants.set_quota("a", {"device_pages": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.tenants.set_quota(3, TenantQuota())  # type: ignore[arg-type]
    assert held(cache, A) == 2


def test_quotas_off_still_count_per_tenant_and_refuse_set_quota() -> None:
    cache = make(32)
    serve(cache, A, prompt(0, 2))
    serve(cache, A, prompt(0, 2))
    stats = cache.tenants.stats()["a"]
    assert stats.device_pages == 2 and stats.counters.requests == 2
    assert stats.counters.device_hit_tokens == 2 * P
    assert 0 < stats.hit_ratio < 1
    with pytest.raises(ValueError, match="quotas are off"):
        cache.tenants.set_quota("a", TenantQuota(device_pages=1))


def test_quota_values_and_json_are_checked() -> None:
    with pytest.raises(ValueError, match="device_floor=5 is above device_pages=4"):
        TenantQuota(device_pages=4, device_floor=5)
    with pytest.raises(ValueError, match="host_pages"):
        TenantQuota(host_pages=-1)
    with pytest.raises(ValueError, match="unknown key 'device'"):
        parse_quotas({"a": {"device": 3}})
    with pytest.raises(ValueError, match="tenant name"):
        parse_quotas({"": {}})
    book = parse_quotas({"*": {"device_pages": 8}, "(none)": {"device_floor": 2}, "a": {}})
    assert book.get(tenant_key("zzz")).device_pages == 8
    assert book.get(None).device_floor == 2
    assert book.get(tenant_key("a")) == TenantQuota()
    with pytest.raises(TypeError, match="quotas must be"):
        make(8, [("a", TenantQuota())])
    cache = make(8, book)
    cache.tenants.set_quota("b", TenantQuota(device_pages=1))
    assert book.get(tenant_key("b")).device_pages == 8  # the cache has its own copy
    assert isinstance(book, QuotaBook)


def test_the_readme_example_runs() -> None:
    """The Python block of the README's "Tenants and quotas" section, with a
    small ``spec`` (the only name it leaves to the reader)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = text.split("## Tenants and quotas", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the section has no python example"
    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
    scope: dict[str, object] = {"spec": spec}
    exec(compile(code.group(1), "README.md", "exec"), scope)
    cache = scope["cache"]
    assert isinstance(cache, RadixCache)
    assert cache.tenants.quota("tenant-b").device_pages == 512
    assert cache.tenants.quota("tenant-a").device_floor == 1024
    assert cache.tenants.quota("zzz").device_pages == 1024


def test_pages_left_out_by_a_limit_are_counted_once_across_commits() -> None:
    cache = make(64, {"a": TenantQuota(device_pages=2)})
    tokens = prompt(0, 10)
    req = cache.admit(tokens, A)
    cache.reserve(req, 10 * P)
    cache.commit(req, 10 * P)  # 10 pages computed, 2 fit
    assert cache.tenants.stats()["a"].counters.dropped_pages == 8
    for i in range(2 * P):  # decode: one token per commit, 2 more pages
        cache.extend(req, [7])
        cache.reserve(req, 1)
        cache.commit(req, 1)
    assert req.shared_pages == 2
    assert cache.tenants.stats()["a"].counters.dropped_pages == 10  # 8 + the 2 new pages
    cache.release(req)
    cache.check_integrity()

"""Per-tenant metrics: the exported text, read back with prometheus-client's
parser, against ``cache.tenants.stats()``; the bounded ``tenant`` label; and
counters that never go down while the ranking of tenants changes."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
import torch

from radixcache import CacheConfig, KVSpec, Namespace, RadixCache
from radixcache.metrics import MetricsExporter, TenantSeries, snapshot
from radixcache.metrics.tenant_series import COUNTERS, OTHER
from radixcache.offload import HostPoolConfig
from radixcache.tenants import TenantQuota, TenantStats
from radixcache.tiers import HostTiers, TierConfig

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

P = 4
SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
Key = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


def make(pages: int = 16, quotas: object = None, host_pages: int = 0) -> RadixCache:
    tiers = None if not host_pages else TierConfig(host=HostPoolConfig(pages=host_pages),
                                                   write_policy="write_through",
                                                   prefetch_policy="wait_complete")
    return RadixCache(CacheConfig(spec=SPEC, device_pages=pages, quotas=quotas,  # type: ignore[arg-type]
                                  tiers=tiers, allocate_kv=tiers is not None))


def prompt(i: int, pages: int) -> np.ndarray:
    """``pages`` whole pages of tokens plus one, distinct per ``i``."""
    return np.arange(i * 1000, i * 1000 + pages * P + 1, dtype=np.int32)


def serve(cache: RadixCache, ns: Namespace, tokens: np.ndarray) -> None:
    req = cache.admit(tokens, ns)
    n = tokens.size - req.num_computed
    cache.reserve(req, n)
    cache.commit(req, n)
    cache.release(req)


def scrape(exporter: MetricsExporter) -> dict[Key, float]:
    """Every tenant sample of the exported text, parsed back, with its type checked."""
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(exporter.render().decode()):
        if not family.name.startswith("radixcache_tenant"):
            continue
        want = "gauge" if family.name.endswith(("_pages", "_bytes", "_in_other")) \
            and "evicted" not in family.name and "dropped" not in family.name else "counter"
        assert family.type == want, family.name
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scraped: dict[Key, float], name: str, **labels: str) -> float:
    return scraped[(f"radixcache_{name}", tuple(sorted(labels.items())))]


# Every counter series and the field of TenantCounters it shows, written out
# here on purpose (not read from the exporter's own table).
FIELDS: list[tuple[str, dict[str, str], str]] = [
    ("tenant_requests", {}, "requests"),
    ("tenant_prompt_tokens", {}, "prompt_tokens"),
    ("tenant_hit_tokens", {"tier": "device"}, "device_hit_tokens"),
    ("tenant_hit_tokens", {"tier": "lower"}, "lower_hit_tokens"),
    ("tenant_evicted_pages", {"tier": "device", "cause": "own_quota"}, "own_evicted_pages"),
    ("tenant_evicted_pages", {"tier": "device", "cause": "pressure"}, "pressure_evicted_pages"),
    ("tenant_evicted_pages", {"tier": "host", "cause": "own_quota"}, "host_own_evicted_pages"),
    ("tenant_evicted_pages", {"tier": "host", "cause": "pressure"}, "host_pressure_evicted_pages"),
    ("tenant_evicted_pages", {"tier": "device_host", "cause": "ttl"}, "expired_pages"),
    ("tenant_evicted_pages", {"tier": "device", "cause": "invalidation"}, "invalidated_pages"),
    ("tenant_evicted_pages", {"tier": "device", "cause": "forget"}, "forgotten_pages"),
    ("tenant_dropped_pages", {"tier": "device"}, "dropped_pages"),
    ("tenant_dropped_pages", {"tier": "host"}, "host_dropped_pages"),
]


def expected(stats: TenantStats, page_bytes: int) -> dict[Key, float]:
    """Every series of one tenant as the exporter should show it, from its stats."""
    c = stats.counters

    def key(name: str, **labels: str) -> Key:
        return (f"radixcache_{name}", tuple(sorted({"tenant": stats.tenant, **labels}.items())))

    out = {key(f"{n}_total", **labels): float(getattr(c, f)) for n, labels, f in FIELDS}
    out[key("tenant_prefix_cache_hits_total")] = float(c.device_hit_tokens + c.lower_hit_tokens)
    for tier, pages in (("device", stats.device_pages), ("host", stats.host_pages)):
        out[key("tenant_cached_pages", tier=tier)] = float(pages)
        out[key("tenant_cached_bytes", tier=tier)] = float(pages * page_bytes)
    return out


def tenants_of(scraped: dict[Key, float]) -> set[str]:
    return {dict(labels)["tenant"] for _n, labels in scraped if "tenant" in dict(labels)}


def test_every_tenant_series_matches_the_tenant_stats() -> None:
    a, b, c = Namespace("a"), Namespace("b"), Namespace(b"\x01c")
    cache = make(16, {"a": TenantQuota(device_pages=4), "b": TenantQuota(device_floor=2)})
    serve(cache, a, prompt(0, 3))
    serve(cache, a, prompt(1, 3))  # own evictions to stay within 4 pages
    serve(cache, a, prompt(1, 3))  # a device hit of 12 tokens
    serve(cache, b, prompt(2, 4))
    for i in range(3, 6):
        serve(cache, c, prompt(i, 4))  # pressure on b (down to its floor) and on a
    serve(cache, Namespace(), prompt(9, 1))
    exporter = MetricsExporter(cache)
    try:
        scraped = scrape(exporter)
        stats = cache.tenants.stats()
        assert set(stats) == {"a", "b", "hex:01" + b"c".hex(), "(none)"}
        for s in stats.values():
            for key, want in expected(s, SPEC.page_bytes).items():
                assert scraped[key] == want, key
        assert tenants_of(scraped) == set(stats) | {OTHER}
        # the workload reached every kind of counter it can without a host tier
        ca, cb = stats["a"].counters, stats["b"].counters
        assert ca.own_evicted_pages > 0 and ca.device_hit_tokens == 12
        assert cb.pressure_evicted_pages == 2 and stats["b"].device_pages == 2
        assert value(scraped, "tenant_prefix_cache_hits_total", tenant="a") == 12
        assert {n for n, _l, _h, _g in COUNTERS} == {n for n, _l, _f in FIELDS} | \
            {"tenant_prefix_cache_hits"}
        for name, labels, _f in FIELDS:  # nothing is summed under other
            assert value(scraped, f"{name}_total", tenant=OTHER, **labels) == 0, name
        assert value(scraped, "tenants_in_other") == 0
        # the per-tenant figures add up to the cache's
        total = cache.stats()
        for name, want in (("tenant_requests_total", total.requests),
                           ("tenant_prompt_tokens_total", total.prompt_tokens)):
            assert sum(v for (n, _l), v in scraped.items() if n == f"radixcache_{name}") == want
        held = sum(v for (n, lab), v in scraped.items()
                   if n == "radixcache_tenant_cached_pages" and ("tier", "device") in lab)
        assert held == total.cached_pages
    finally:
        exporter.close()
        cache.close()


def test_lower_tier_hits_and_host_pages_are_the_tenant_stats() -> None:
    cache = make(8, {}, host_pages=16)
    a = Namespace("a")
    tokens = prompt(0, 2)
    serve(cache, a, tokens)
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    tiers.drain()
    cache.evict(8)
    serve(cache, a, tokens)  # 8 tokens found on the host
    tiers.drain()
    exporter = MetricsExporter(cache)
    try:
        scraped = scrape(exporter)
        stats = cache.tenants.stats()
        assert stats["a"].counters.lower_hit_tokens == 8
        for s in stats.values():
            for key, want in expected(s, SPEC.page_bytes).items():
                assert scraped[key] == want, key
        assert value(scraped, "tenant_hit_tokens_total", tenant="a", tier="lower") == 8
    finally:
        exporter.close()
        cache.close()


def test_many_tenants_get_at_most_n_labels_and_the_rest_sum_under_other() -> None:
    cache = make(256)
    names = [f"t{i}" for i in range(40)]
    for i, name in enumerate(names):
        for _ in range(1 + i % 7):  # traffic differs per tenant
            serve(cache, Namespace(name), prompt(i, 1 + i % 3))
    exporter = MetricsExporter(cache, tenant_labels=5)
    try:
        scraped = scrape(exporter)
        labels = tenants_of(scraped)
        assert OTHER in labels and len(labels) == 6
        stats = cache.tenants.stats()
        busiest = sorted(stats, key=lambda n: (-stats[n].counters.prompt_tokens,
                                               -stats[n].counters.requests, n))[:5]
        assert labels - {OTHER} == set(busiest)
        assert value(scraped, "tenants_in_other") == 35
        total = cache.stats()
        for name, want in (("tenant_requests_total", total.requests),
                           ("tenant_prompt_tokens_total", total.prompt_tokens)):
            got = sum(v for (n, _l), v in scraped.items() if n == f"radixcache_{name}")
            assert got == want, name  # first scrape: other holds the rest's totals
        rest = sum(s.device_pages for n, s in stats.items() if n not in busiest)
        assert value(scraped, "tenant_cached_pages", tenant=OTHER, tier="device") == rest
        assert rest > 0
        for name in {n for n, _l in scraped}:  # every family stays within N+1 tenants
            assert len({dict(lab).get("tenant") for n, lab in scraped.items() if n == name}) <= 6
    finally:
        exporter.close()
        cache.close()


def _increments(before: dict[str, TenantStats], after: dict[str, TenantStats],
                tenants: Iterable[str], field: str) -> int:
    return sum(getattr(after[t].counters, field) -
               (getattr(before[t].counters, field) if t in before else 0) for t in tenants)


def test_counters_never_go_down_while_the_ranking_changes() -> None:
    cache = make(64)
    exporter = MetricsExporter(cache, tenant_labels=2)
    phases = [["a", "b", "c"], ["c", "c", "d"], ["d", "d", "e", "e"], ["e", "a", "a", "f"],
              ["b"] * 6, ["g"] * 9, ["a", "b", "c", "d", "e", "f", "g"]]
    last: dict[Key, float] = {}
    before = cache.tenants.stats()
    label_sets = []
    try:
        for step, phase in enumerate(phases):
            for j, name in enumerate(phase):
                serve(cache, Namespace(name), prompt(step * 20 + j, 2))
            exporter.update()
            scraped = scrape(exporter)
            after = cache.tenants.stats()
            own = tenants_of(scraped) - {OTHER}
            assert len(own) <= 2
            label_sets.append(own)
            for key, v in scraped.items():
                if key[0].endswith("_total") and key in last:
                    assert v >= last[key], (step, key, last[key], v)
            # every increment is counted once: in its tenant's series or in other
            prev_other = last.get(("radixcache_tenant_requests_total", (("tenant", OTHER),)), 0.0)
            other = value(scraped, "tenant_requests_total", tenant=OTHER)
            assert other - prev_other + _increments(before, after, own, "requests") == \
                _increments(before, after, after, "requests")
            last.update(scraped)
            before = after
        changes = sum(1 for x, y in zip(label_sets, label_sets[1:]) if x != y)
        assert changes >= 2, label_sets  # the premise: the ranking did change
        assert "g" in label_sets[-1]  # the busiest tenant won a label
    finally:
        exporter.close()
        cache.close()


def test_tenants_of_similar_traffic_do_not_trade_the_label_every_scrape() -> None:
    cache = make(64)
    exporter = MetricsExporter(cache, tenant_labels=1)
    owners = []
    try:
        for i in range(12):  # x and y take turns, y a little ahead after its turn
            serve(cache, Namespace("xy"[i % 2]), prompt(i, 8 + i % 2))
            exporter.update()
            owners.append(tenants_of(scrape(exporter)) - {OTHER})
        assert all(o == {"x"} for o in owners), owners
        for i in range(4):  # y is now well ahead (370 tokens to 198): it takes the label
            serve(cache, Namespace("y"), prompt(50 + i, 9))
        exporter.update()
        assert tenants_of(scrape(exporter)) == {"y", OTHER}
    finally:
        exporter.close()
        cache.close()


def test_a_tenant_named_other_is_summed_under_other_and_n_is_checked() -> None:
    cache = make(32)
    serve(cache, Namespace("other"), prompt(0, 2))
    serve(cache, Namespace("a"), prompt(1, 1))
    flat = snapshot(cache)
    assert flat[f"tenant_requests{{tenant={OTHER}}}"] == 1
    assert flat["tenant_requests{tenant=a}"] == 1
    assert flat[f"tenant_cached_pages{{tenant={OTHER},tier=device}}"] == 2
    series = TenantSeries(0)
    samples = series.samples(cache.tenants.stats(), SPEC.page_bytes)
    assert {lab["tenant"] for _n, _k, _h, lab, _v in samples if "tenant" in lab} == {OTHER}
    for bad in (-1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="tenant_labels"):
            MetricsExporter(cache, tenant_labels=bad)  # type: ignore[arg-type]
    cache.close()


def test_removals_by_cause_and_the_storage_share_per_tenant(tmp_path: object) -> None:
    """TTL, invalidation and forget each count under their cause; with an LMDB
    store, each tenant's stored bytes, quota evictions and dropped pages
    (the store's own per-tenant figures) are series under tier="storage"."""
    from radixcache.offload import StorageConfig

    now = [100.0]
    tiers = TierConfig(host=HostPoolConfig(pages=32), write_policy="write_through",
                       prefetch_policy="wait_complete", model_id="metrics",
                       storage=StorageConfig(path=tmp_path, capacity_bytes=1 << 20,  # type: ignore[arg-type]
                                             clock=lambda: now[0]))
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=32, tiers=tiers, quotas={
        "a": TenantQuota(ttl_s=10), "b": TenantQuota(storage_bytes=1)}), clock=lambda: now[0])
    exporter = MetricsExporter(cache)
    try:
        serve(cache, Namespace("a"), prompt(0, 2))
        serve(cache, Namespace("b"), prompt(1, 3))
        serve(cache, Namespace("c", tags=("t",)), prompt(2, 2))
        serve(cache, Namespace("d"), prompt(3, 1))
        serve(cache, Namespace("e"), prompt(4, 2))
        cache.drain()
        now[0] += 10
        cache.poll()  # a's pages are past their TTL
        cache.invalidate("t")
        cache.forget_namespace(Namespace("d"))
        exporter.update()
        stats = cache.tenants.stats()
        scraped = scrape(exporter)
        assert stats["a"].counters.expired_pages == 4  # 2 device + 2 host copies
        assert stats["c"].counters.invalidated_pages == 2
        assert stats["d"].counters.forgotten_pages == 1
        for s in stats.values():
            for key, want in expected(s, SPEC.page_bytes).items():
                assert scraped[key] == want, key
        share = stats["b"].storage
        assert share is not None and share.medium == "DISK"
        assert share.dropped_pages == 3 and share.stored_bytes == 0  # over its 1-byte limit
        kept = stats["e"].storage
        assert kept is not None and kept.stored_bytes > 0
        # a's records went past their deadline too (swept by the store's next writes)
        assert stats["a"].storage is not None and stats["a"].storage.stored_bytes == 0
        assert value(scraped, "tenant_dropped_pages_total", tenant="b", tier="storage") == 3
        assert value(scraped, "tenant_cached_bytes", tenant="e", tier="storage") == \
            kept.stored_bytes
        assert value(scraped, "tenant_evicted_pages_total", tenant="b", tier="storage",
                     cause="own_quota") == share.quota_evicted
    finally:
        exporter.close()
        cache.close()

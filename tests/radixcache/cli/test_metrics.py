"""Metrics: the snapshot API and the Prometheus exposition over HTTP."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from radixcache.cache import RadixCache
from radixcache.metrics import MetricsExporter, snapshot
from radixcache.tiers import HostTiers
from tests.radixcache.tiers.tierkit import make_tiered, prefill

pytest.importorskip("prometheus_client")


def warm_cache():  # type: ignore[no-untyped-def]
    cache = make_tiered()
    prompt = np.arange(9, dtype=np.int32)
    cache.release(prefill(cache, prompt))
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    tiers.drain()
    cache.evict(8)
    req = cache.admit(prompt)  # host hit, loaded back
    cache.reserve(req, 1)
    cache.release(req)
    return cache


def test_snapshot_has_every_tier() -> None:
    cache = warm_cache()
    flat = snapshot(cache)
    assert flat["hit_tokens{tier=device}"] == 0
    assert flat["hit_tokens{tier=host}"] == 8
    assert flat["moved_pages{direction=device_to_host}"] == 2
    assert flat["moved_pages{direction=host_to_device}"] == 2
    assert flat["evicted_pages{tier=device}"] == 2
    assert flat["requests"] == 2 and flat["inflight_copies"] == 0
    cache.close()


def test_prometheus_endpoint_serves_the_latest_update() -> None:
    cache = warm_cache()
    exporter = MetricsExporter(cache)
    port = exporter.serve(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'radixcache_hit_tokens_total{tier="host"} 8.0' in body
        assert 'radixcache_moved_bytes_total{direction="host_to_device"}' in body
        assert "radixcache_inflight_copies 0.0" in body
        req = cache.admit(np.arange(9, dtype=np.int32))  # a device hit, seen after update()
        cache.release(req)
        assert 'radixcache_hit_tokens_total{tier="device"} 0.0' in exporter.render().decode()
        exporter.update()
        assert 'radixcache_hit_tokens_total{tier="device"} 8.0' in exporter.render().decode()
    finally:
        exporter.close()
        cache.close()


def storage_round_trip(tmp_path: Path) -> RadixCache:
    """A page set written through host to storage, then (after a restart) read
    back from storage: every tier job kind ran at least once."""
    prompt = np.arange(9, dtype=np.int32)
    first = make_tiered(storage=tmp_path)
    first.release(prefill(first, prompt))
    first.close()  # finishes the backups and the storage writes
    cache = make_tiered(storage=tmp_path)
    req = cache.admit(prompt)  # storage hit: fetched into host, loaded back
    cache.reserve(req, 1)
    cache.release(req)
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    tiers.drain()
    cache.evict(8)  # the device drops both pages (they stay on host)
    req = cache.admit(prompt)  # host hit
    cache.reserve(req, 1)
    cache.release(req)
    tiers.drain()
    return cache


def test_token_series_for_vllm_and_sglang_dashboards(tmp_path: Path) -> None:
    cache = storage_round_trip(tmp_path)
    flat = snapshot(cache)
    assert flat["prefix_cache_queries"] == 18  # two prompts of 9 tokens
    assert flat["prefix_cache_hits"] == 16  # 8 from storage, then 8 from host
    assert flat["cached_tokens{cache_source=device}"] == 0
    assert flat["cached_tokens{cache_source=host}"] == 8
    assert flat["cached_tokens{cache_source=storage}"] == 8
    assert flat["evicted_tokens{tier=device}"] == 8  # 2 pages of 4 tokens
    assert flat["loaded_back_tokens"] == 16
    # page-level series are still there
    assert flat["evicted_pages{tier=device}"] == 2 and flat["hit_tokens{tier=storage}"] == 8
    for name in ("load_back_seconds", "storage_read_seconds"):
        assert flat[f"{name}_count"] >= 1 and flat[f"{name}_sum"] > 0, name
    assert flat["storage_write_seconds_count"] == 0  # nothing new to write after the restart
    # the LMDB store's files on disk (tiny pages: every record inline, no idle slot)
    assert flat["storage_disk_bytes"] >= os.stat(tmp_path / "data.mdb").st_blocks * 512 > 0
    assert flat["storage_free_disk_bytes"] == 0
    cache.close()


def test_histograms_and_token_counters_over_http(tmp_path: Path) -> None:
    cache = storage_round_trip(tmp_path)
    exporter = MetricsExporter(cache)
    port = exporter.serve(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        lines = body.splitlines()
        assert "radixcache_prefix_cache_queries_total 18.0" in lines
        assert "radixcache_prefix_cache_hits_total 16.0" in lines
        assert 'radixcache_cached_tokens_total{cache_source="storage"} 8.0' in lines
        assert 'radixcache_evicted_tokens_total{tier="device"} 8.0' in lines
        assert "radixcache_loaded_back_tokens_total 16.0" in lines
        assert "# TYPE radixcache_load_back_seconds histogram" in lines
        for name in ("load_back_seconds", "storage_read_seconds", "storage_write_seconds"):
            inf = [ln for ln in lines if ln.startswith(f'radixcache_{name}_bucket{{le="+Inf"}}')]
            count = [ln for ln in lines if ln.startswith(f"radixcache_{name}_count ")]
            assert len(inf) == 1 and len(count) == 1, name
            assert inf[0].split()[-1] == count[0].split()[-1]  # +Inf bucket == count
        buckets = [float(ln.split()[-1]) for ln in lines
                   if ln.startswith("radixcache_load_back_seconds_bucket")]
        assert buckets == sorted(buckets) and buckets[-1] >= 1  # cumulative
    finally:
        exporter.close()
        cache.close()


def test_storage_writes_are_timed(tmp_path: Path) -> None:
    cache = make_tiered(storage=tmp_path)
    cache.release(prefill(cache, np.arange(9, dtype=np.int32)))
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    tiers.drain()
    flat = snapshot(cache)
    assert flat["storage_write_seconds_count"] >= 1 and flat["backup_seconds_count"] >= 1
    assert flat["storage_read_seconds_count"] == 0
    cache.close()


def test_hit_rate_per_tier_and_vllms_kv_offload_series() -> None:
    cache = warm_cache()
    flat = snapshot(cache)
    # two requests of 9 tokens; the second found 8 in host memory
    assert flat["cache_hit_rate{tier=host}"] == pytest.approx(8 / 18)
    assert flat["cache_hit_rate{tier=device}"] == 0.0
    assert flat["cache_hit_rate{tier=all}"] == pytest.approx(8 / 18)
    page_bytes = cache.spec.page_bytes
    assert flat["kv_offload_store_bytes"] == 2 * page_bytes  # device -> host, vLLM's "store"
    assert flat["kv_offload_load_bytes"] == 2 * page_bytes  # host -> device, vLLM's "load"
    assert flat["kv_offload_store_time"] > 0 and flat["kv_offload_load_time"] > 0
    assert flat["kv_offload_load_time"] == flat["load_back_seconds_sum"]
    exporter = MetricsExporter(cache)
    try:
        body = exporter.render().decode()
        assert 'radixcache_cache_hit_rate{tier="host"} 0.444' in body
        assert f"radixcache_kv_offload_store_bytes_total {float(2 * page_bytes)}" in body
        assert "radixcache_kv_offload_load_time_total " in body
    finally:
        exporter.close()
        cache.close()

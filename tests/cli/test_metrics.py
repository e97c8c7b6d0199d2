"""Metrics: the snapshot API and the Prometheus exposition over HTTP."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from radixcache.metrics import MetricsExporter, snapshot
from radixcache.tiers import HostTiers
from tests.radixcache.tierkit import make_tiered, prefill

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

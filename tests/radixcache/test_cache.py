"""The allocator API a model runner drives: admit, reserve, extend, commit, release."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from radixcache import (
    CacheConfig,
    KVSpec,
    Namespace,
    OutOfPagesError,
    RadixCache,
    RequestStateError,
)
from tests.radixcache.conftest import P, seq

MakeCache = Callable[..., RadixCache]


def run_prefill(cache: RadixCache, tokens: np.ndarray, ns: Namespace = Namespace()) -> object:
    req = cache.admit(tokens, ns)
    n = tokens.size - req.num_computed
    cache.reserve(req, n)
    cache.commit(req, n)
    cache.check_integrity()
    return req


def test_admit_miss_then_hit(make_cache: MakeCache) -> None:
    cache = make_cache()
    a = cache.admit(seq(0, 10))
    assert a.cached_len == 0 and a.page_table.size == 0
    table = cache.reserve(a, 10)
    assert table.tolist() == [0, 1, 2]
    cache.commit(a, 10)
    assert a.shared_pages == 2  # the partial third page stays private
    cache.release(a)
    cache.check_integrity()
    assert cache.stats().free_pages == 14  # page 2 went back to the pool
    b = cache.admit(seq(0, 12))
    assert b.cached_len == 8 and b.page_table.tolist() == [0, 1]
    assert cache.stats().hit_tokens == 8
    cache.check_integrity()


def test_last_token_always_left_to_compute(make_cache: MakeCache) -> None:
    cache = make_cache()
    cache.release(run_prefill(cache, seq(0, 8)))  # type: ignore[arg-type]
    req = cache.admit(seq(0, 8))
    assert req.cached_len == 4  # 8 would leave nothing to compute
    req2 = cache.admit(seq(0, 9))
    assert req2.cached_len == 8
    cache.check_integrity()


def test_chunked_prefill_and_decode(make_cache: MakeCache) -> None:
    cache = make_cache()
    prompt = seq(0, 10)
    req = cache.admit(prompt)
    cache.reserve(req, 6)  # first chunk
    assert req.page_table.tolist() == [0, 1]
    cache.commit(req, 6)
    assert req.shared_pages == 1
    cache.reserve(req, 4)  # second chunk
    cache.commit(req, 4)
    assert req.num_computed == 10 and req.page_table.tolist() == [0, 1, 2]
    for step in range(6):  # decode: one token a step
        cache.extend(req, [100 + step])
        cache.reserve(req, 1)
        cache.commit(req, 1)
        cache.check_integrity()
    assert req.num_computed == 16 and req.shared_pages == 4
    assert req.page_table.tolist() == [0, 1, 2, 3]
    cache.release(req)
    full = np.concatenate([prompt, np.arange(100, 106, dtype=np.int32)])
    again = cache.admit(np.concatenate([full, [7]]))
    assert again.cached_len == 16 and again.page_table.tolist() == [0, 1, 2, 3]
    cache.check_integrity()


def test_concurrent_duplicate_commit_frees_the_copy(make_cache: MakeCache) -> None:
    cache = make_cache()
    prompt = seq(0, 9)
    a = cache.admit(prompt)
    b = cache.admit(prompt)  # both miss: same batch
    cache.reserve(a, 9)
    cache.reserve(b, 9)
    assert a.page_table.tolist() == [0, 1, 2] and b.page_table.tolist() == [3, 4, 5]
    cache.commit(a, 9)
    cache.commit(b, 9)  # pages 3, 4 duplicate a's: b now uses 0, 1
    assert b.page_table.tolist() == [0, 1, 5]
    s = cache.stats()
    assert s.duplicate_pages == 2 and s.free_pages == 16 - 4
    cache.check_integrity()
    cache.release(a)
    cache.release(b)
    assert cache.stats().free_pages == 14
    cache.check_integrity()


def test_running_short_evicts_then_raises(make_cache: MakeCache) -> None:
    cache = make_cache(pages=4)
    cache.release(run_prefill(cache, seq(0, 9)))  # type: ignore[arg-type]  # caches 2 pages
    assert cache.stats().evictable_pages == 2
    req = cache.admit(seq(100, 16))
    cache.reserve(req, 16)  # needs 4: evicts the 2 cached
    assert cache.stats().evicted_pages == 2
    other = cache.admit(seq(200, 8))
    with pytest.raises(OutOfPagesError) as err:
        cache.reserve(other, 8)
    assert (err.value.requested, err.value.free, err.value.evictable) == (2, 0, 0)
    assert "asked for 2, 0 free, 0 evictable" in str(err.value)
    assert other.page_table.size == 0
    cache.check_integrity()


def test_reset_refuses_with_live_requests(make_cache: MakeCache) -> None:
    cache = make_cache()
    req = run_prefill(cache, seq(0, 8))
    with pytest.raises(RequestStateError, match="1 live requests"):
        cache.reset()
    assert cache.stats().cached_pages == 2  # nothing lost
    cache.check_integrity()
    cache.reset(force=True)
    assert cache.stats().cached_pages == 0 and cache.stats().free_pages == 16
    with pytest.raises(RequestStateError, match="already released"):
        cache.release(req)  # type: ignore[arg-type]
    cache.check_integrity()


def test_forget_namespace_waits_for_locks(make_cache: MakeCache) -> None:
    cache = make_cache()
    tenant = Namespace(salt="t1")
    held = run_prefill(cache, seq(0, 8), tenant)
    cache.release(run_prefill(cache, seq(50, 8), tenant))  # type: ignore[arg-type]
    cache.release(run_prefill(cache, seq(0, 8)))  # type: ignore[arg-type]
    assert cache.forget_namespace(tenant) == 2  # held's 2 pages must wait
    assert cache.admit(seq(50, 9), tenant).cached_len == 0
    cache.release(held)  # type: ignore[arg-type]  # ... and go with the release
    for r in cache.live_requests:
        cache.release(r)
    assert cache.admit(seq(0, 9), tenant).cached_len == 0
    assert cache.admit(seq(0, 9)).cached_len == 8  # the default namespace kept its pages
    cache.check_integrity()


def test_device_buffer_and_slots() -> None:
    spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32, page_size=P)
    cache = RadixCache(CacheConfig(spec=spec, device_pages=8))
    assert cache.kv is not None
    k, v = cache.kv.layer(1)
    assert tuple(k.shape) == (8, P, 2, 4) and k.device.type == "cpu"
    req = cache.admit(seq(0, 6))
    cache.reserve(req, 6)
    slots = cache.kv.slots(req.page_table, 0, 6)
    assert slots.tolist() == [0, 1, 2, 3, 4, 5]
    k_flat, _ = cache.kv.layer_slots(1)
    k_flat[slots] = 1.0
    assert float(k[0].sum()) == P * 2 * 4 and float(k[1, :2].sum()) == 2 * 2 * 4


def test_config_sizes_and_errors() -> None:
    spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float16, page_size=P)
    assert spec.page_bytes == 2 * 2 * P * 2 * 4 * 2
    cfg = CacheConfig(spec=spec, device_bytes=spec.page_bytes * 5 + 7)
    assert cfg.num_device_pages == 5
    with pytest.raises(ValueError, match="exactly one"):
        CacheConfig(spec=spec)
    with pytest.raises(ValueError, match="holds no page"):
        CacheConfig(spec=spec, device_bytes=10)
    with pytest.raises(ValueError, match="unknown eviction policy"):
        CacheConfig(spec=spec, device_pages=4, eviction_policy="random")
    with pytest.raises(MemoryError, match="does not fit"):
        RadixCache(CacheConfig(spec=spec, device_pages=2**40))
    with pytest.raises(ValueError, match="power of two"):
        KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, page_size=12)


def test_stats_snapshot(make_cache: MakeCache) -> None:
    cache = make_cache()
    req = run_prefill(cache, seq(0, 10))
    s = cache.stats()
    assert (s.requests, s.live_requests, s.prompt_tokens) == (1, 1, 10)
    assert (s.cached_pages, s.protected_pages, s.evictable_pages, s.private_pages) == (2, 2, 0, 1)
    assert s.free_pages == 13 and s.nodes == 1
    cache.release(req)  # type: ignore[arg-type]
    s = cache.stats()
    assert (s.protected_pages, s.evictable_pages, s.private_pages, s.free_pages) == (0, 2, 0, 14)

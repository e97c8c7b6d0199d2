"""RadixcacheHiCacheStorage against SGLang's own HiCache storage code (CPU).

SGLang's host KV pool needs its whole runtime to build, so a small double
stands in for it: it owns a real page-first MHA buffer and answers
``get_page_buffer_meta`` the way SGLang's MHA host pool does (per page, the
address of its K span and of its V span). Everything else is SGLang's: the
``HiCacheStorageConfig``, the ``dynamic`` backend factory and its failure
injector.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageFailureInjector,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from tests.radixcache.integrations.conftest import corrupt_record  # noqa: E402
from radixcache.integrations.sglang import RadixcacheHiCacheStorage  # noqa: E402

PAGE = 4  # tokens per page
LAYERS, HEADS, DIM = 2, 2, 8


class HostPoolDouble:
    """Page-first MHA host pool: kv_buffer[2 (K, V), tokens, layers, heads, dim]."""

    def __init__(self, num_tokens: int = 64, dtype: torch.dtype = torch.bfloat16) -> None:
        self.page_size = PAGE
        self.layout = "page_first"
        self.dtype = dtype
        self.size = num_tokens
        self.kv_buffer = torch.zeros(2, num_tokens, LAYERS, HEADS, DIM, dtype=dtype)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        token_bytes = LAYERS * HEADS * DIM * self.kv_buffer.element_size()
        v_offset = self.size * token_bytes
        base = self.kv_buffer.data_ptr()
        ptrs: list[int] = []
        for i in range(0, len(idx), self.page_size):
            k = base + idx[i] * token_bytes
            ptrs += [k, k + v_offset]
        return ptrs, [self.page_size * token_bytes] * len(ptrs)

    def page(self, first_token: int) -> torch.Tensor:
        return self.kv_buffer[:, first_token : first_token + PAGE].clone()

    def fill(self, first_token: int) -> None:
        span = self.kv_buffer[:, first_token : first_token + PAGE]
        span.copy_(torch.randn(span.shape, dtype=torch.float32).to(self.dtype))


def config(path: Path, tp_rank: int = 0, tp_size: int = 1, **extra: Any) -> HiCacheStorageConfig:
    extra_config = {
        "backend_name": "radixcache",
        "module_path": "radixcache.integrations.sglang",
        "class_name": "RadixcacheHiCacheStorage",
        "interface_v1": 1,
        "path": str(path),
        "kv_dtype": "bfloat16",
        "capacity_bytes": 1 << 22,
        **extra,
    }
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="org/tiny-model", extra_config=extra_config,
    )


def backend(path: Path, pool: HostPoolDouble, **kw: Any) -> RadixcacheHiCacheStorage:
    store = RadixcacheHiCacheStorage(config(path, **kw), {})
    store.register_mem_pool_host(pool)
    return store


def indices(*pages: int) -> torch.Tensor:
    """Host token indices of whole pages."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


KEYS = [f"{i:064x}" for i in range(1, 9)]


def test_set_then_leading_exists_then_get_bit_exact(tmp_path: Path) -> None:
    pool = HostPoolDouble()
    for p in range(4):
        pool.fill(p * PAGE)
    store = backend(tmp_path, pool)
    try:
        assert store.batch_set_v1(KEYS[:4], indices(0, 1, 2, 3)) == [True] * 4
        assert store.batch_exists(KEYS[:4]) == 4
        assert store.batch_exists([KEYS[0], KEYS[1], KEYS[7], KEYS[2]]) == 2
        assert store.batch_exists([KEYS[7], KEYS[0]]) == 0
        got = store.batch_get_v1([KEYS[2], KEYS[0], KEYS[7]], indices(10, 11, 12))
        assert got == [True, True, False]
        assert torch.equal(pool.page(10 * PAGE), pool.page(2 * PAGE))
        assert torch.equal(pool.page(11 * PAGE), pool.page(0))
        assert store.exists(KEYS[3]) and not store.exists(KEYS[7])
    finally:
        store.close()


def test_two_tensor_parallel_ranks_are_kept_apart(tmp_path: Path) -> None:
    pools = [HostPoolDouble(), HostPoolDouble()]
    ranks = [backend(tmp_path, pools[r], tp_rank=r, tp_size=2) for r in range(2)]
    try:
        for r in range(2):
            pools[r].fill(0)
            assert ranks[r].batch_set_v1(KEYS[:1], indices(0)) == [True]
        for r in range(2):
            assert ranks[r].batch_get_v1(KEYS[:1], indices(5)) == [True]
            assert torch.equal(pools[r].page(5 * PAGE), pools[r].page(0))
        assert not torch.equal(pools[0].page(0), pools[1].page(0))
    finally:
        for store in ranks:
            store.close()
    # one shared directory (as in a shared pool): the rank in the key keeps them apart
    pool = HostPoolDouble()
    pool.fill(0)
    first = backend(tmp_path / "shared", pool, tp_rank=0, tp_size=2, rank_subdir=False)
    assert first.batch_set_v1(KEYS[:1], indices(0)) == [True]
    first.close()
    second = backend(tmp_path / "shared", pool, tp_rank=1, tp_size=2, rank_subdir=False)
    try:
        assert second.batch_exists(KEYS[:1]) == 0
    finally:
        second.close()


def test_kv_dtype_comes_from_the_extra_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_dtype"):
        RadixcacheHiCacheStorage(config(tmp_path, kv_dtype=None), {})
    pool = HostPoolDouble()
    pool.fill(0)
    store = backend(tmp_path, pool)
    assert store.batch_set_v1(KEYS[:1], indices(0)) == [True]
    store.close()
    fp8 = backend(tmp_path, pool, kv_dtype="float8_e4m3fn")  # same bytes, another format
    try:
        assert fp8.batch_exists(KEYS[:1]) == 0
        assert fp8.batch_get_v1(KEYS[:1], indices(3)) == [False]
    finally:
        fp8.close()


def test_restart_recovers_every_page(tmp_path: Path) -> None:
    pool = HostPoolDouble()
    for p in range(3):
        pool.fill(p * PAGE)
    store = backend(tmp_path, pool)
    assert store.batch_set_v1(KEYS[:3], indices(0, 1, 2)) == [True] * 3
    store.close()
    restarted = backend(tmp_path, HostPoolDouble())
    try:
        assert restarted.batch_exists(KEYS[:3]) == 3
        assert restarted.batch_get_v1(KEYS[:3], indices(4, 5, 6)) == [True] * 3
        after = restarted.mem_pool_host
        for i in range(3):
            assert torch.equal(after.page((4 + i) * PAGE), pool.page(i * PAGE))
    finally:
        restarted.close()


def test_corrupt_page_is_a_miss_and_never_reaches_the_host_pool(tmp_path: Path) -> None:
    pool = HostPoolDouble()
    for p in range(2):
        pool.fill(p * PAGE)
    store = backend(tmp_path, pool)
    assert store.batch_set_v1(KEYS[:2], indices(0, 1)) == [True, True]
    store.close()
    corrupt_record(tmp_path / "tp0", KEYS[1].encode())
    store = backend(tmp_path, pool)
    try:
        pool.kv_buffer[:, 8 * PAGE : 10 * PAGE] = 7.0
        sentinel = pool.page(9 * PAGE)
        assert store.batch_get_v1(KEYS[:2], indices(8, 9)) == [True, False]
        assert torch.equal(pool.page(8 * PAGE), pool.page(0))
        assert torch.equal(pool.page(9 * PAGE), sentinel)
        assert store._open().stats().corrupt == 1
    finally:
        store.close()


def test_concurrent_callers_from_many_threads(tmp_path: Path) -> None:
    pool = HostPoolDouble(num_tokens=4 * PAGE * 8)
    for p in range(16):
        pool.fill(p * PAGE)
    store = backend(tmp_path, pool)
    errors: list[str] = []

    def worker(t: int) -> None:
        keys = [f"{t:032x}{i:032x}" for i in range(4)]
        src = [t * 4 + i for i in range(4)]
        dst = [16 + t * 4 + i for i in range(4)]
        if store.batch_set_v1(keys, indices(*src)) != [True] * 4:
            errors.append(f"set {t}")
        if store.batch_get_v1(keys, indices(*dst)) != [True] * 4:
            errors.append(f"get {t}")
        for s, d in zip(src, dst):
            if not torch.equal(pool.page(s * PAGE), pool.page(d * PAGE)):
                errors.append(f"bytes {t}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    store.close()
    assert errors == []


def test_sglang_dynamic_factory_and_its_failure_injector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.3")
    cfg = config(tmp_path)
    store = StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert isinstance(store, HiCacheStorageFailureInjector)
    assert isinstance(store._backend, RadixcacheHiCacheStorage)
    pool = HostPoolDouble(num_tokens=4 * PAGE * 2)
    store.register_mem_pool_host(pool)
    outcomes = {"set": set(), "get": set()}
    for i in range(40):
        key = f"{i:064x}"
        pool.fill(0)
        written = store.batch_set_v1([key], indices(0))
        outcomes["set"].add(written[0])
        pool.kv_buffer[:, PAGE : 2 * PAGE] = 0
        read = store.batch_get_v1([key], indices(1))
        outcomes["get"].add(read[0])
        if read[0]:  # whatever was injected, a page served is the page stored
            assert written[0] or store._backend.exists(key)
            assert torch.equal(pool.page(PAGE), pool.page(0))
    assert outcomes == {"set": {True, False}, "get": {True, False}}
    store.close()

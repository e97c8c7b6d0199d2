"""RadixcacheHiCacheStorage against SGLang's own host pools and cache controller (CPU).

The host pools are SGLang's (``MHATokenToKVPoolHost`` in ``page_first`` and
``layer_first``, ``MLATokenToKVPoolHost``), built on SGLang's CPU device
pools; the storage config, the ``dynamic`` backend factory, its failure
injector and ``HiCacheController``'s prefetch and backup threads are
SGLang's too. One import is stubbed while SGLang's modules load:
``torchvision`` (``tests/radixcache/integrations/sglang_kit.py`` says why).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("sglang")

from tests.radixcache.integrations.sglang_kit import (  # noqa: E402
    PAGE,
    controller,
    equal_pages,
    extra_config,
    fill,
    indices,
    keys,
    mha_pools,
    mla_pools,
    page_bytes,
    stop,
    storage_config,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageExtraInfo,
    HiCacheStorageFailureInjector,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str, get_storage_hash_str  # noqa: E402

from tests.radixcache.integrations.conftest import corrupt_record  # noqa: E402
from radixcache.integrations.sglang import RadixcacheHiCacheStorage  # noqa: E402

KEYS = keys(8)
POOLS = {
    "mha-page_first": lambda: mha_pools("page_first"),
    "mha-layer_first": lambda: mha_pools("layer_first"),
    "mla-page_first": lambda: mla_pools("page_first"),
    "mla-layer_first": lambda: mla_pools("layer_first"),
}


def backend(path: Path, host: Any, **kw: Any) -> RadixcacheHiCacheStorage:
    store = RadixcacheHiCacheStorage(storage_config(path, host, **kw), {})
    store.register_mem_pool_host(host)
    return store


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_set_then_leading_exists_then_get_bit_exact(tmp_path: Path, pool: str) -> None:
    _device, host = POOLS[pool]()
    fill(host, 1)
    store = backend(tmp_path, host)
    try:
        assert store.pieces == len(host.get_page_buffer_meta(indices(0))[0])
        assert store.batch_set_v1(KEYS[:4], indices(0, 1, 2, 3)) == [True] * 4
        assert store.batch_exists(KEYS[:4]) == 4
        assert store.batch_exists([KEYS[0], KEYS[1], KEYS[7], KEYS[2]]) == 2
        assert store.batch_exists([KEYS[7], KEYS[0]]) == 0
        got = store.batch_get_v1([KEYS[2], KEYS[0], KEYS[7]], indices(10, 11, 12))
        assert got == [True, True, False]
        assert equal_pages(host, [10, 11], [2, 0])
        assert store.exists(KEYS[3]) and not store.exists(KEYS[7])
    finally:
        store.close()


def test_pools_of_other_layouts_or_models_never_share_pages(tmp_path: Path) -> None:
    _d, first = mha_pools("page_first")
    fill(first, 2)
    store = backend(tmp_path, first)
    assert store.batch_set_v1(KEYS[:1], indices(0)) == [True]
    store.close()
    for other in (mha_pools("layer_first")[1], mla_pools("page_first")[1]):
        reader = backend(tmp_path, other)
        try:
            assert reader.batch_exists(KEYS[:1]) == 0  # same bytes per page or not: another format
        finally:
            reader.close()


def test_two_tensor_parallel_ranks_are_kept_apart(tmp_path: Path) -> None:
    hosts = [mha_pools("page_first")[1], mha_pools("page_first")[1]]
    ranks = [backend(tmp_path, hosts[r], tp_rank=r, tp_size=2) for r in range(2)]
    try:
        for r in range(2):
            fill(hosts[r], 10 + r)
            assert ranks[r].batch_set_v1(KEYS[:1], indices(0)) == [True]
        for r in range(2):
            assert ranks[r].batch_get_v1(KEYS[:1], indices(5)) == [True]
            assert equal_pages(hosts[r], [5], [0])
        assert page_bytes(hosts[0], 0) != page_bytes(hosts[1], 0)
    finally:
        for store in ranks:
            store.close()
    # one shared directory (as in a shared pool): the rank in the key keeps them apart
    host = mha_pools("page_first")[1]
    fill(host, 3)
    first = backend(tmp_path / "shared", host, tp_rank=0, tp_size=2, rank_subdir=False)
    assert first.batch_set_v1(KEYS[:1], indices(0)) == [True]
    first.close()
    second = backend(tmp_path / "shared", host, tp_rank=1, tp_size=2, rank_subdir=False)
    try:
        assert second.batch_exists(KEYS[:1]) == 0
    finally:
        second.close()


def test_kv_dtype_comes_from_the_extra_config(tmp_path: Path) -> None:
    host = mha_pools("page_first")[1]
    with pytest.raises(ValueError, match="kv_dtype"):
        RadixcacheHiCacheStorage(storage_config(tmp_path, host, kv_dtype=None), {})
    fill(host, 4)
    store = backend(tmp_path, host)
    assert store.batch_set_v1(KEYS[:1], indices(0)) == [True]
    store.close()
    fp8 = backend(tmp_path, host, kv_dtype="float8_e4m3fn")  # same bytes, another format
    try:
        assert fp8.batch_exists(KEYS[:1]) == 0
        assert fp8.batch_get_v1(KEYS[:1], indices(3)) == [False]
    finally:
        fp8.close()


def test_restart_recovers_every_page(tmp_path: Path) -> None:
    host = mha_pools("layer_first")[1]
    fill(host, 5)
    store = backend(tmp_path, host)
    assert store.batch_set_v1(KEYS[:3], indices(0, 1, 2)) == [True] * 3
    written = [page_bytes(host, p * PAGE) for p in range(3)]
    store.close()
    after = mha_pools("layer_first")[1]
    restarted = backend(tmp_path, after)
    try:
        assert restarted.batch_exists(KEYS[:3]) == 3
        assert restarted.batch_get_v1(KEYS[:3], indices(4, 5, 6)) == [True] * 3
        assert [page_bytes(after, (4 + i) * PAGE) for i in range(3)] == written
    finally:
        restarted.close()


def test_corrupt_page_is_a_miss_and_never_reaches_the_host_pool(tmp_path: Path) -> None:
    host = mha_pools("page_first")[1]
    fill(host, 6)
    store = backend(tmp_path, host)
    assert store.batch_set_v1(KEYS[:2], indices(0, 1)) == [True, True]
    store.close()
    corrupt_record(tmp_path / "tp0", KEYS[1].encode())
    store = backend(tmp_path, host)
    try:
        before = page_bytes(host, 9 * PAGE)
        assert store.batch_get_v1(KEYS[:2], indices(8, 9)) == [True, False]
        assert equal_pages(host, [8], [0])
        assert page_bytes(host, 9 * PAGE) == before
        assert store._open().stats().corrupt == 1
    finally:
        store.close()


def test_concurrent_callers_from_many_threads(tmp_path: Path) -> None:
    host = mha_pools("page_first", tokens=4 * PAGE * 8)[1]
    fill(host, 7)
    store = backend(tmp_path, host)
    errors: list[str] = []

    def worker(t: int) -> None:
        names = [f"{t:032x}{i:032x}" for i in range(4)]
        src = [t * 4 + i for i in range(4)]
        dst = [16 + t * 4 + i for i in range(4)]
        if store.batch_set_v1(names, indices(*src)) != [True] * 4:
            errors.append(f"set {t}")
        if store.batch_get_v1(names, indices(*dst)) != [True] * 4:
            errors.append(f"get {t}")
        if not equal_pages(host, src, dst):
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
    host = mha_pools("page_first", tokens=4 * PAGE * 2)[1]
    store = StorageBackendFactory.create_backend("dynamic", storage_config(tmp_path, host), None)
    assert isinstance(store, HiCacheStorageFailureInjector)
    assert isinstance(store._backend, RadixcacheHiCacheStorage)
    store.register_mem_pool_host(host)
    outcomes: dict[str, set[bool]] = {"set": set(), "get": set()}
    for i in range(40):
        key = f"{i:064x}"
        fill(host, 100 + i)
        written = store.batch_set_v1([key], indices(0))
        outcomes["set"].add(written[0])
        read = store.batch_get_v1([key], indices(1))
        outcomes["get"].add(read[0])
        if read[0]:  # whatever was injected, a page served is the page stored
            assert written[0] or store._backend.exists(key)
            assert equal_pages(host, [1], [0])
    assert outcomes == {"set": {True, False}, "get": {True, False}}
    store.close()


def tenant(salt: str | None) -> HiCacheStorageExtraInfo:
    return HiCacheStorageExtraInfo(extra_info={"cache_salt": salt} if salt else None)


def test_a_tenants_pages_are_never_another_tenants_hit(tmp_path: Path) -> None:
    """extra_info["cache_salt"] -> the tenant's namespace: the same keys, two tenants."""
    host = mha_pools("page_first")[1]
    fill(host, 8)
    store = backend(tmp_path, host)
    try:
        assert store.batch_set_v1(KEYS[:2], indices(0, 1), tenant("acme")) == [True, True]
        assert store.batch_exists(KEYS[:2], tenant("acme")) == 2
        assert store.batch_exists(KEYS[:2], tenant("globex")) == 0
        assert store.batch_exists(KEYS[:2], tenant(None)) == 0
        assert store.batch_get_v1(KEYS[:2], indices(6, 7), tenant("globex")) == [False, False]
        before = page_bytes(host, 6 * PAGE)
        assert page_bytes(host, 6 * PAGE) == before  # nothing of acme's reached the pool
        fill(host, 9)  # globex writes other KV under the same keys
        assert store.batch_set_v1(KEYS[:2], indices(2, 3), tenant("globex")) == [True, True]
        assert store.batch_get_v1(KEYS[:2], indices(6, 7), tenant("globex")) == [True, True]
        assert equal_pages(host, [6, 7], [2, 3])
        with pytest.raises(TypeError, match="cache_salt must be a str"):
            store.batch_exists(KEYS[:1], HiCacheStorageExtraInfo(extra_info={"cache_salt": 1}))
    finally:
        store.close()


@pytest.mark.parametrize("pool", ["mha-page_first", "mha-layer_first", "mla-page_first"])
def test_sglangs_cache_controller_backs_up_and_prefetches_through_the_backend(
    tmp_path: Path, pool: str
) -> None:
    """HiCacheController's own threads: ``write_storage`` (backup of host
    pages under SGLang's page hashes), then ``prefetch`` (its hit query asks
    ``batch_exists`` with the page hashes it computes from the tokens, its IO
    thread reads the hits into freshly allocated host pages)."""
    device, host = POOLS[pool]()
    cc = controller(device, host, extra_config(tmp_path), model="org/tiny-model")
    try:
        assert isinstance(cc.storage_backend, RadixcacheHiCacheStorage)
        tokens = list(range(1000, 1000 + 5 * PAGE + 2))  # 5 whole pages and a partial one
        src = host.alloc(5 * PAGE)
        fill(host, 11)
        hashes = get_hash_str(tokens[: 5 * PAGE], None, page_size=PAGE)
        assert hashes == get_storage_hash_str(tokens[: 5 * PAGE], None, page_size=PAGE)
        cc.write_storage(src, tokens[: 5 * PAGE], hash_value=hashes)
        assert cc.ack_backup_queue.get(timeout=30).completed_tokens == 5 * PAGE
        assert cc.storage_backend.batch_exists(hashes) == 5

        operation = cc.prefetch("req-1", tokens)
        hit = cc.prefetch_hit_queue.get(timeout=30)  # the prefetch thread's hit query
        assert hit is operation and hit.storage_hit_count == 5 * PAGE
        dst = host.alloc(5 * PAGE)  # what the radix cache does with a hit
        operation.host_indices = dst
        cc.prefetch_buffer.put(operation)
        acks = [cc.ack_prefetch_queue.get(timeout=30)]
        while not acks[-1].completed_req:
            acks.append(cc.ack_prefetch_queue.get(timeout=30))
        assert acks[0].completed_tokens == 5 * PAGE
        src_pages = [int(i) // PAGE for i in src[::PAGE]]
        dst_pages = [int(i) // PAGE for i in dst[::PAGE]]
        assert equal_pages(host, dst_pages, src_pages)

        miss = cc.prefetch("req-2", list(range(7, 7 + 2 * PAGE)))
        assert cc.prefetch_hit_queue.get(timeout=30) is miss and miss.storage_hit_count == 0
    finally:
        stop(cc)


def test_host_pool_meta_is_what_the_backend_gathers(tmp_path: Path) -> None:
    """The page the backend stores is SGLang's page: its pieces, in order."""
    host = mha_pools("layer_first")[1]
    fill(host, 12)
    store = backend(tmp_path, host)
    try:
        assert store.batch_set_v1(KEYS[:1], indices(3)) == [True]
        staging = torch.zeros(store.page_size * 0 + store._open().page_bytes, dtype=torch.uint8)
        assert store.get(KEYS[0], staging) is staging
        assert bytes(staging.numpy()) == page_bytes(host, 3 * PAGE)
    finally:
        store.close()


def test_the_extra_config_is_decoded_by_type_and_unknown_keys_are_named(tmp_path: Path) -> None:
    host = mha_pools("page_first")[1]
    with pytest.raises(ValueError, match=r"--hicache-storage-backend-extra-config: Object "
                                         r"contains unknown field `capacity_gib`"):
        RadixcacheHiCacheStorage(storage_config(tmp_path, host, capacity_gib=1), {})
    with pytest.raises(ValueError, match=r"Expected `int`, got `str` - at `\$.capacity_bytes`"):
        RadixcacheHiCacheStorage(storage_config(tmp_path, host, capacity_bytes="100GB"), {})
    with pytest.raises(ValueError, match="capacity_bytes must be positive, got 0"):
        RadixcacheHiCacheStorage(storage_config(tmp_path, host, capacity_bytes=0), {})


def test_the_extra_config_names_a_radixcache_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``config_file``: the store from the file's [storage] (and [spec] dtype);
    the extra config's own keys win; the environment overrides the file."""
    host = mha_pools("page_first")[1]
    conf = tmp_path / "radixcache.toml"
    conf.write_text(f'[spec]\nnum_layers = 1\nnum_kv_heads = 1\nhead_dim = 8\ndtype = "float16"\n'
                    f'[storage]\nurl = "{tmp_path / "from-file"}"\ncapacity_bytes = 4194304\n'
                    f'durability = "fast"\n')
    config = storage_config(tmp_path, host)
    config.extra_config = {k: v for k, v in config.extra_config.items()
                           if k not in ("path", "kv_dtype", "capacity_bytes")}
    config.extra_config["config_file"] = str(conf)
    store = RadixcacheHiCacheStorage(config, {})
    assert (store.path, store.kv_dtype, store.capacity_bytes, store.durability) == (
        str(tmp_path / "from-file" / "tp0"), "float16", 4194304, "fast")
    config.extra_config["capacity_bytes"] = 1 << 23  # the extra config's key wins
    monkeypatch.setenv("RADIXCACHE__STORAGE__URL", str(tmp_path / "from-env"))
    store = RadixcacheHiCacheStorage(config, {})
    assert (store.path, store.capacity_bytes) == (str(tmp_path / "from-env" / "tp0"), 1 << 23)
    store.register_mem_pool_host(host)  # opens the store the file names
    try:
        fill(host, 3)
        assert store.batch_set_v1(KEYS[:2], indices(0, 1)) == [True, True]
        assert store.batch_exists(KEYS[:2]) == 2
    finally:
        store.close()
    conf.write_text('[storage]\nurl = "/x"\nttl_s = 5\n')
    with pytest.raises(ValueError, match=r"radixcache.toml: `ttl_s` is not a setting of an LMDB"):
        RadixcacheHiCacheStorage(config, {})
    conf.write_text('[storage]\nurl = "/x"\ndisk_reserve_ratio = 0.1\n')
    with pytest.raises(ValueError, match=r"`disk_reserve_ratio` is not used by this engine's "
                                         r"page store \(it takes capacity_bytes, durability, "
                                         r"path, url\) - at `\$.storage`"):
        RadixcacheHiCacheStorage(config, {})
    config.extra_config["config_file"] = 5
    with pytest.raises(ValueError, match=r"Expected `str`, got `int` - at `\$.config_file`"):
        RadixcacheHiCacheStorage(config, {})

"""The raw page store of the vLLM/SGLang adapters over a real shared Valkey
pool (a ``valkey-server`` started by the test, loopback only): two engine
processes' worth of stores share pages bit-exactly, and a value corrupted in
the pool is a miss, never wrong bytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("redis")

from radixcache.integrations.pagestore import PageStore, PageStoreConfig, RawPages  # noqa: E402
from tests.offload.valkey.valkey_servers import ValkeyServer  # noqa: E402

PAGE = 4096


@pytest.fixture(scope="module")
def server() -> Iterator[ValkeyServer]:
    s = ValkeyServer(maxmemory=64 << 20)
    yield s
    s.stop()


def store(url: str, **overrides: object) -> PageStore:
    fields: dict[str, object] = dict(path=url, page_bytes=PAGE, engine="vllm",
                                     model="tiny", layout="kv_dtype=float16;chunk=1")
    fields.update(overrides)
    return PageStore(PageStoreConfig(**fields))  # type: ignore[arg-type]


def test_pool_url_selects_the_pool_and_pages_cross_stores_bit_exact(server: ValkeyServer) -> None:
    writer, reader = store(server.url), store(server.url)
    try:
        assert writer.config.backend == "valkey"
        src = np.random.default_rng(0).integers(0, 256, (4, PAGE), dtype=np.uint8)
        keys = [b"block-%02d" % i + b"\x01" * 28 for i in range(4)]  # 36-byte keys
        ticket = writer.put(keys, RawPages(src, PAGE), [0, 1, 2, 3])
        assert ticket.wait(10) and ticket.results() == [True] * 4
        assert reader.leading(keys) == 4
        dst = np.zeros((6, PAGE), dtype=np.uint8)
        got = reader.get(keys[::-1], RawPages(dst, PAGE), [5, 4, 3, 2])
        assert got.wait(10) and got.results() == [True] * 4
        # keys[3] -> chunk 5, keys[2] -> 4, keys[1] -> 3, keys[0] -> 2
        assert np.array_equal(dst[[5, 4, 3, 2]], src[[3, 2, 1, 0]])
        assert not dst[:2].any()
        other_model = store(server.url, model="another")
        try:
            assert other_model.leading(keys) == 0
        finally:
            other_model.close()
    finally:
        writer.close()
        reader.close()


def test_a_value_corrupted_in_the_pool_is_a_miss(server: ValkeyServer) -> None:
    s = store(server.url, layout="kv_dtype=float16;chunk=2")
    try:
        src = np.full((2, PAGE), 7, dtype=np.uint8)
        keys = [b"corrupt-me-%d" % i for i in range(2)]
        assert s.put(keys, RawPages(src, PAGE), [0, 1]).wait(10)
        client = server.client()
        victims = [k for k in client.scan_iter() if k.endswith(keys[1])]
        assert len(victims) == 1, victims
        value = bytearray(client.get(victims[0]))
        value[-1] ^= 0xFF
        client.set(victims[0], bytes(value), keepttl=True)
        dst = np.zeros((2, PAGE), dtype=np.uint8)
        got = s.get(keys, RawPages(dst, PAGE), [0, 1])
        assert got.wait(10) and got.results() == [True, False]
        assert np.array_equal(dst[0], src[0]) and not np.array_equal(dst[1], src[1])
        assert s.stats().corrupt >= 1
    finally:
        s.close()


def test_backend_name_must_match_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match the path"):
        PageStoreConfig(path="valkey://127.0.0.1:1/0", page_bytes=PAGE, engine="vllm",
                        model="m", layout="l", backend="lmdb")
    assert PageStoreConfig(path=tmp_path, page_bytes=PAGE, engine="vllm", model="m",
                           layout="l").backend == "lmdb"


def test_pool_byte_quotas_per_cache_salt_through_the_page_store(server: ValkeyServer) -> None:
    """``pool_bytes`` of one tenant (a ``cache_salt``): its puts beyond the
    limit evict its own oldest values; another tenant's values stay; a
    run-time change takes effect at the tenant's next put."""
    from radixcache.integrations.tenants import tenant_namespace
    from radixcache.tenants import TenantQuota, parse_quotas

    noisy, quiet = tenant_namespace("noisy"), tenant_namespace("quiet")
    src = np.random.default_rng(1).integers(0, 256, (1, PAGE), dtype=np.uint8)

    def put(s: PageStore, key: bytes, ns: object) -> None:
        assert s.put([key], RawPages(src, PAGE), [0], ns).wait(10)  # type: ignore[arg-type]

    s = PageStore(PageStoreConfig(path=server.url, page_bytes=PAGE, engine="vllm", model="quota",
                                  layout="kv_dtype=float16;chunk=1"),
                  quotas=parse_quotas({"noisy": {"pool_bytes": 3 * (PAGE + 512)}}))
    try:
        quiet_keys = [b"quiet-%02d" % i + b"\x02" * 28 for i in range(4)]
        noisy_keys = [b"noisy-%02d" % i + b"\x03" * 28 for i in range(6)]
        for k in quiet_keys:
            put(s, k, quiet)
        for k in noisy_keys:
            put(s, k, noisy)
        held = [s.leading([k], noisy) for k in noisy_keys]
        assert held == [0, 0, 0, 1, 1, 1]  # its 3 newest fit its limit
        assert [s.leading([k], quiet) for k in quiet_keys] == [1, 1, 1, 1]
        s.set_quota("noisy", TenantQuota(pool_bytes=PAGE + 512))
        put(s, b"noisy-zz" + b"\x03" * 28, noisy)
        assert sum(s.leading([k], noisy) for k in noisy_keys) == 0
        assert [s.leading([k], quiet) for k in quiet_keys] == [1, 1, 1, 1]
    finally:
        s.close()

"""The raw page store under vLLM and SGLang, sealed at rest: key_file /
key_env on LMDB and on a real pool; another key reads nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from radixcache.integrations.pagestore import PageStore, PageStoreConfig, RawPages
from tests.offload.valkey.valkey_servers import ValkeyServer

PAGE_BYTES = 512
K1, K2 = bytes(range(32)).hex(), bytes(range(1, 33)).hex()


def key_file(tmp: Path, key: str, name: str) -> str:
    path = tmp / name
    path.write_text(key + "\n")
    path.chmod(0o600)
    return str(path)


def config(path: object, **keys: str) -> PageStoreConfig:
    return PageStoreConfig(path=str(path), page_bytes=PAGE_BYTES, engine="test", model="m",
                           layout="opaque", capacity_bytes=1 << 20, **keys)  # type: ignore[arg-type]


def round_trip(first: PageStoreConfig, then: PageStoreConfig) -> list[bool]:
    """Put two pages through a store of ``first``, close it; what a store of
    ``then`` reads back (checked bit-exact)."""
    src = np.random.default_rng(1).integers(0, 256, (2, PAGE_BYTES), dtype=np.uint8)
    writer = PageStore(first)
    put = writer.put([b"k0", b"k1"], RawPages(src, PAGE_BYTES), [0, 1])
    assert put.wait(10) and put.results() == [True, True]
    writer.close()
    second = PageStore(then)
    dst = np.zeros_like(src)
    got = second.get([b"k0", b"k1"], RawPages(dst, PAGE_BYTES), [0, 1])
    assert got.wait(10)
    results: list[bool] = got.results()
    for i, ok in enumerate(results):
        assert not ok or np.array_equal(dst[i], src[i])
    second.close()
    return results


def test_lmdb_pages_sealed_and_read_only_with_the_key(tmp_path: Path) -> None:
    k1, k2 = key_file(tmp_path, K1, "k1"), key_file(tmp_path, K2, "k2")
    store = tmp_path / "store"
    assert round_trip((config(store, key_file=k1)),
                      (config(store, key_file=k1))) == [True, True]
    assert round_trip((config(tmp_path / "other", key_file=k1)),
                      (config(tmp_path / "other", key_file=k2))) == [False, False]


@pytest.fixture(scope="module")
def valkey_server() -> Iterator[ValkeyServer]:
    server = ValkeyServer(maxmemory=64 << 20)
    yield server
    server.stop()


def test_pool_pages_sealed_with_keys_from_a_variable(
    valkey_server: ValkeyServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    valkey_server.flush()
    monkeypatch.setenv("RX_PAGESTORE_KEYS", K1)
    url = valkey_server.url
    assert round_trip((config(url, key_env="RX_PAGESTORE_KEYS")),
                      (config(f"{url}?key_file={key_file(tmp_path, K1, 'k1')}"))
                      ) == [True, True]
    with valkey_server.client() as raw:
        assert all(b"RXKV" in raw.get(k) for k in raw.keys(b"rxkv:*") if b"ns:" not in k)
    valkey_server.flush()
    assert round_trip((config(url, key_env="RX_PAGESTORE_KEYS")),
                      (config(url))) == [False, False]

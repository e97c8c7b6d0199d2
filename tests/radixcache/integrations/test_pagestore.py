"""PageStore and RawPages: raw pages under engine keys, without any engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from radixcache.integrations.pagestore import PageStore, PageStoreConfig, RawPages

PAGE_BYTES = 512


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PageStore]:
    store = PageStore(PageStoreConfig(path=tmp_path, page_bytes=PAGE_BYTES, engine="test",
                                      model="m", layout="opaque", capacity_bytes=1 << 20))
    yield store
    store.close()


def random_pages(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, (n, PAGE_BYTES), dtype=np.uint8)


def test_keys_of_any_length_round_trip_through_other_slots(store: PageStore) -> None:
    src = random_pages(4)
    keys = [b"k", b"x" * 36, b"y" * 64, b"z" * 243]
    put = store.put(keys, RawPages(memoryview(src), PAGE_BYTES), [0, 1, 2, 3])
    assert put.wait(10) and put.results() == [True] * 4
    dst = np.zeros_like(src)
    get = store.get(keys[::-1], RawPages(dst, PAGE_BYTES), [0, 1, 2, 3])
    assert get.wait(10) and get.results() == [True] * 4
    assert np.array_equal(dst, src[::-1])
    assert sorted(store.stored_keys()) == sorted(keys)


def test_results_are_per_key_and_stop_at_the_first_miss(store: PageStore) -> None:
    src = random_pages(2)
    store.put([b"a", b"b"], RawPages(src, PAGE_BYTES), [0, 1]).wait()
    assert store.leading([b"a", b"b", b"c"]) == 2 and store.contains(b"b")
    dst = np.zeros((3, PAGE_BYTES), dtype=np.uint8)
    ticket = store.get([b"a", b"c", b"b"], RawPages(dst, PAGE_BYTES), [0, 1, 2])
    ticket.wait()
    assert ticket.results() == [True, False, False] and ticket.count() == 1
    assert np.array_equal(dst[0], src[0])


def test_pointer_and_size_and_tensor_buffers(store: PageStore) -> None:
    src = torch.randint(0, 255, (2, PAGE_BYTES), dtype=torch.uint8)
    store.put([b"p0", b"p1"], RawPages(src, PAGE_BYTES), [0, 1]).wait()
    dst = np.zeros((2, PAGE_BYTES), dtype=np.uint8)
    pages = RawPages.from_pointer(dst.ctypes.data, dst.nbytes, PAGE_BYTES)
    store.get([b"p1", b"p0"], pages, [0, 1]).wait()
    assert np.array_equal(dst, src.numpy()[::-1])


def test_clear_and_delete_report_removed_keys(store: PageStore) -> None:
    store.put([b"a", b"b", b"c"], RawPages(random_pages(3), PAGE_BYTES), [0, 1, 2]).wait()
    assert store.delete([b"b", b"zz"]).wait(10)
    assert store.take_removed() == [b"b"]
    ticket = store.clear()
    assert ticket.wait(10) and ticket.result() == 2
    assert sorted(store.take_removed()) == [b"a", b"c"]
    assert store.leading([b"a"]) == 0


def test_bad_input_is_refused_with_the_numbers(store: PageStore) -> None:
    buf = RawPages(random_pages(2), PAGE_BYTES)
    with pytest.raises(ValueError, match="244 bytes; keys are 1 to 243 bytes"):
        store.put([b"x" * 244], buf, [0])
    with pytest.raises(ValueError, match="0 bytes"):
        store.leading([b""])
    with pytest.raises(TypeError, match="must be bytes"):
        store.put(["text"], buf, [0])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 2\)"):
        store.put([b"a"], buf, [2])
    with pytest.raises(ValueError, match="2 slots for 1 keys"):
        store.put([b"a"], buf, [0, 1])
    with pytest.raises(ValueError, match="256 B; this store's pages are 512 B"):
        store.put([b"a"], RawPages(np.zeros(512, np.uint8), 256), [0])
    with pytest.raises(ValueError, match="read-only"):
        store.get([b"a"], RawPages(memoryview(bytes(PAGE_BYTES)), PAGE_BYTES), [0])
    with pytest.raises(ValueError, match="1000 B: not a positive multiple of page_bytes=512"):
        RawPages(np.zeros(1000, np.uint8), PAGE_BYTES)
    with pytest.raises(ValueError, match="C-contiguous"):
        RawPages(np.zeros((4, 2 * PAGE_BYTES), np.uint8)[:, :PAGE_BYTES], PAGE_BYTES)
    with pytest.raises(ValueError, match="positive even int"):
        PageStoreConfig(path="x", page_bytes=511, engine="e", model="m", layout="l")
    assert store.stats().puts == 0  # nothing was stored by any of it


def test_tenants_keep_apart_under_the_same_engine_keys(store: PageStore) -> None:
    """``tenant_namespace(cache_salt)``: the mapping both adapters use."""
    from radixcache.integrations.tenants import engine_key, stored_key, tenant_namespace

    acme, globex = tenant_namespace("acme"), tenant_namespace("globex")
    assert tenant_namespace(None) == tenant_namespace("") == tenant_namespace(None)
    src = random_pages(2)
    assert store.put([b"k"], RawPages(src, PAGE_BYTES), [0], acme).wait(10)
    assert store.put([b"k"], RawPages(src, PAGE_BYTES), [1], globex).wait(10)
    assert store.leading([b"k"], acme) == 1 and store.leading([b"k"]) == 0
    dst = np.zeros_like(src)
    got = store.get([b"k"], RawPages(dst, PAGE_BYTES), [0], globex)
    assert got.wait(10) and got.results() == [True] and np.array_equal(dst[0], src[1])
    assert sorted(store.stored_keys()) == [b"k", b"k"]  # engine keys, of every tenant
    forget = store.forget(acme)
    assert forget.wait(10) and forget.result() == 1
    assert store.take_removed() == [b"k"]
    assert store.leading([b"k"], acme) == 0 and store.leading([b"k"], globex) == 1
    for ns in (acme, tenant_namespace(None)):
        assert engine_key(stored_key(ns, b"\x00\x01x")) == b"\x00\x01x"
    with pytest.raises(ValueError, match="no tenant form byte"):
        engine_key(b"\x07abc")

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixcache.offload import HostPool, HostPoolConfig
from radixcache.transfer.layout import KVSpec

SPEC = KVSpec(num_layers=3, num_kv_heads=2, head_dim=8, dtype=torch.float16, page_size=4)
PAGE = SPEC.page_bytes  # 2 * 3 * 4 * 2 * 8 * 2 = 768 B


def test_page_bytes_of_the_test_spec() -> None:
    assert PAGE == 768


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of pages, nbytes, ratio; got none"),
        ({"pages": 4, "nbytes": 4096}, "got pages, nbytes"),
        ({"pages": 2, "ratio": 0.5}, "got pages, ratio"),
        ({"pages": 0}, "pages must be a positive int, got 0"),
        ({"pages": -3}, "pages must be a positive int"),
        ({"pages": True}, "pages must be a positive int"),
        ({"pages": 2.0}, "pages must be a positive int"),
        ({"nbytes": 0}, "nbytes must be a positive int"),
        ({"ratio": 0.0}, "ratio must be a positive finite number"),
        ({"ratio": float("nan")}, "ratio must be a positive finite number"),
        ({"ratio": float("inf")}, "ratio must be a positive finite number"),
    ],
)
def test_config_rejects_bad_sizes(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HostPoolConfig(**kwargs)  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    config = HostPoolConfig(pages=3)
    with pytest.raises(AttributeError):
        config.pages = 4  # type: ignore[misc]


def test_pool_by_pages_has_exactly_that_many_bytes() -> None:
    pool = HostPool(SPEC, HostPoolConfig(pages=5))
    assert pool.capacity == 5
    assert pool.free_count == 5
    assert pool.nbytes == 5 * PAGE
    data = pool.buffer.data
    assert data.untyped_storage().nbytes() == 5 * PAGE
    assert tuple(data.shape) == (5, *SPEC.host_page_shape)
    assert pool.buffer.as_bytes().shape == (5, PAGE)
    pool.check_integrity()


def test_pool_by_bytes_floors_to_whole_pages_never_above_the_budget() -> None:
    pool = HostPool(SPEC, HostPoolConfig(nbytes=10 * PAGE + PAGE - 1))
    assert pool.capacity == 10
    assert pool.buffer.data.untyped_storage().nbytes() == 10 * PAGE
    pool.check_integrity()


def test_pool_by_exact_bytes_is_not_rounded_up() -> None:
    # 7 pages is not a power of two; the buffer must not be padded to 8.
    pool = HostPool(SPEC, HostPoolConfig(nbytes=7 * PAGE))
    assert pool.capacity == 7
    assert pool.buffer.data.untyped_storage().nbytes() == 7 * PAGE


def test_pool_by_bytes_smaller_than_a_page_is_an_error() -> None:
    with pytest.raises(ValueError, match=f"{PAGE - 1} B holds no page: one page is {PAGE} B"):
        HostPool(SPEC, HostPoolConfig(nbytes=PAGE - 1))


@pytest.mark.parametrize("ratio, device_pages, expected", [(0.5, 10, 5), (2.5, 3, 7), (1.0, 4, 4)])
def test_pool_by_ratio_of_device_pages(ratio: float, device_pages: int, expected: int) -> None:
    pool = HostPool(SPEC, HostPoolConfig(ratio=ratio), device_pages=device_pages)
    assert pool.capacity == expected
    assert pool.nbytes == expected * PAGE


def test_pool_by_ratio_needs_the_device_page_count() -> None:
    with pytest.raises(ValueError, match="needs the device pool's page count"):
        HostPool(SPEC, HostPoolConfig(ratio=2.0))
    with pytest.raises(ValueError, match="less than one page"):
        HostPool(SPEC, HostPoolConfig(ratio=0.1), device_pages=5)


def test_allocate_and_free_hand_out_exact_ids() -> None:
    pool = HostPool(SPEC, HostPoolConfig(pages=4))
    a = pool.allocate(3)
    assert a is not None and a.tolist() == [0, 1, 2]
    assert pool.free_count == 1 and pool.used_count == 3
    pool.check_integrity()
    assert pool.allocate(2) is None  # all or nothing
    assert pool.free_count == 1
    pool.free(a[1:2])
    pool.check_integrity()
    b = pool.allocate(2)
    assert b is not None and b.tolist() == [1, 3]  # last freed first, then fresh ids
    assert pool.is_allocated(np.array([0, 1, 2, 3])) and pool.free_count == 0
    pool.check_integrity()


def test_free_of_a_free_page_is_an_error_and_frees_nothing() -> None:
    pool = HostPool(SPEC, HostPoolConfig(pages=3))
    ids = pool.allocate(2)
    assert ids is not None
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(np.array([0, 2]))
    assert pool.free_count == 1
    with pytest.raises(ValueError, match="out of range"):
        pool.free(np.array([3]))
    pool.check_integrity()


def test_page_first_layout_one_contiguous_block_per_page() -> None:
    pool = HostPool(SPEC, HostPoolConfig(pages=3))
    raw = pool.buffer.as_bytes()
    raw[1] = np.arange(PAGE, dtype=np.uint8)
    page = pool.buffer.data[1].contiguous().view(torch.uint8).flatten().numpy()
    assert np.array_equal(page, np.arange(PAGE, dtype=np.uint8))
    assert not raw[0].any() and not raw[2].any()


def test_not_pinned_without_cuda() -> None:
    pool = HostPool(SPEC, HostPoolConfig(pages=2, pin=True))
    assert pool.pinned == torch.cuda.is_available()
    unpinned = HostPool(SPEC, HostPoolConfig(pages=2, pin=False))
    assert unpinned.pinned is False


@pytest.mark.gpu
def test_pinned_with_cuda() -> None:
    pool = HostPool(SPEC, HostPoolConfig(pages=2))
    assert pool.pinned
    assert pool.buffer.data.is_pinned()

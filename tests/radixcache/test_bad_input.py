"""Every caller mistake gets a clear error, and nothing cached is lost."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from radixcache import RadixCache, RequestStateError
from tests.radixcache.conftest import seq

MakeCache = Callable[..., RadixCache]


@pytest.fixture
def warm(make_cache: MakeCache) -> RadixCache:
    cache = make_cache()
    req = cache.admit(seq(0, 9))
    cache.reserve(req, 9)
    cache.commit(req, 9)
    cache.release(req)
    return cache


def assert_intact(cache: RadixCache) -> None:
    cache.check_integrity()
    probe = cache.admit(seq(0, 9))
    assert probe.cached_len == 8
    cache.release(probe)
    cache.check_integrity()


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        (np.array([1.0, 2.0]), TypeError, "integers"),
        (np.zeros((2, 4), dtype=np.int32), ValueError, "1-D"),
        (np.array([1, -3, 4]), ValueError, "out of range.*min -3"),
        (np.array([1, 2**40]), ValueError, "out of range"),
        ([1, 2.5], TypeError, "ints"),
        ([1, True], TypeError, "ints"),
        ("hello", TypeError, "expected a numpy array"),
        (torch.tensor([1.0, 2.0]), TypeError, "integers"),
        (torch.tensor([[1, 2]]), ValueError, "1-D"),
    ],
)
def test_bad_tokens(warm: RadixCache, tokens: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        warm.admit(tokens)
    assert_intact(warm)


def test_tokens_as_tensor_and_list_are_accepted(warm: RadixCache) -> None:
    assert warm.admit(torch.arange(9)).cached_len == 8
    assert warm.admit(list(range(9))).cached_len == 8
    assert warm.admit(np.arange(9, dtype=np.uint16)).cached_len == 8


def test_commit_more_than_reserved(warm: RadixCache) -> None:
    req = warm.admit(seq(20, 12))
    warm.reserve(req, 4)
    with pytest.raises(ValueError, match="only 4 were reserved"):
        warm.commit(req, 8)
    warm.commit(req, 4)
    assert_intact(warm)


def test_commit_beyond_known_tokens(warm: RadixCache) -> None:
    req = warm.admit(seq(20, 4))
    warm.reserve(req, 8)
    with pytest.raises(ValueError, match="extend\\(\\) it first"):
        warm.commit(req, 8)
    assert_intact(warm)


def test_release_twice(warm: RadixCache) -> None:
    req = warm.admit(seq(0, 9))
    warm.release(req)
    with pytest.raises(RequestStateError, match="already released"):
        warm.release(req)
    with pytest.raises(RequestStateError, match="already released"):
        warm.reserve(req, 1)
    assert_intact(warm)


def test_foreign_handle(warm: RadixCache, make_cache: MakeCache) -> None:
    other = make_cache()
    req = other.admit(seq(0, 9))
    with pytest.raises(RequestStateError, match="does not belong"):
        warm.release(req)
    with pytest.raises(TypeError, match="expected a Request"):
        warm.release("req-1")  # type: ignore[arg-type]
    assert_intact(warm)


def test_negative_sizes(warm: RadixCache) -> None:
    req = warm.admit(seq(0, 9))
    with pytest.raises(ValueError, match="non-negative"):
        warm.reserve(req, -1)
    with pytest.raises(ValueError, match="non-negative"):
        warm.commit(req, -2)
    warm.release(req)
    assert_intact(warm)


def test_pool_double_free_and_foreign_ids(warm: RadixCache) -> None:
    pool = warm.pool
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([15])
    with pytest.raises(ValueError, match="out of range"):
        pool.free([16])
    with pytest.raises(ValueError, match="out of range"):
        pool.free([-1])
    ids = pool.allocate(2)
    assert ids is not None
    with pytest.raises(ValueError, match="twice"):
        pool.free([int(ids[0]), int(ids[0])])
    pool.free(ids)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(ids)
    assert_intact(warm)


def test_unlock_unlocked_node(warm: RadixCache) -> None:
    node = next(iter(warm.tree.nodes()))
    with pytest.raises(ValueError, match="not locked"):
        warm.tree.unlock(node)
    assert_intact(warm)


def test_bad_namespace_and_priority(warm: RadixCache) -> None:
    with pytest.raises(TypeError, match="Namespace"):
        warm.admit(seq(0, 9), "tenant")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="priority"):
        warm.admit(seq(0, 9), priority=1.5)  # type: ignore[arg-type]
    assert_intact(warm)

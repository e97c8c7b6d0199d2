from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from radixcache import CacheConfig, KVSpec, RadixCache, RadixTree, make_eviction_policy

P = 4  # page size used throughout these tests


def toks(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def seq(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


@pytest.fixture
def make_cache() -> Callable[..., RadixCache]:
    def make(pages: int = 16, policy: str = "lru", allocate_kv: bool = False) -> RadixCache:
        spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
        return RadixCache(
            CacheConfig(spec=spec, device_pages=pages, eviction_policy=policy, allocate_kv=allocate_kv)
        )

    return make


@pytest.fixture
def tree() -> RadixTree:
    return RadixTree(P, make_eviction_policy("lru"))

"""peek: the device hit ``admit`` would get, with nothing changed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import DEFAULT_NAMESPACE as NS
from radixcache import Namespace, RadixCache, RadixTree, make_eviction_policy
from tests.radixcache.conftest import P, seq


def test_peek_equals_admit_and_changes_nothing(make_cache: Callable[..., RadixCache]) -> None:
    cache = make_cache(pages=32)
    req = cache.admit(seq(0, 5 * P))
    cache.reserve(req, 5 * P)
    cache.commit(req, 5 * P)
    cache.release(req)
    nodes = cache.tree.node_count
    ticks = [(n.last_access, n.hit_count) for n in cache.tree.nodes()]
    prompt = np.concatenate([seq(0, 3 * P + 2), seq(900, 7)])  # diverges inside page 4
    assert cache.peek(prompt) == 3 * P
    assert cache.peek(seq(0, 5 * P)) == 4 * P  # the last token is always left to compute
    assert cache.peek(seq(0, 5 * P), Namespace(salt="other")) == 0
    assert cache.peek(seq(500, 40)) == 0
    assert cache.tree.node_count == nodes  # no split
    assert [(n.last_access, n.hit_count) for n in cache.tree.nodes()] == ticks
    assert cache.tree.protected_pages == 0
    r = cache.admit(prompt)
    assert r.cached_len == 3 * P
    cache.release(r)
    cache.check_integrity()


def test_peek_validates_like_admit(make_cache: Callable[..., RadixCache]) -> None:
    cache = make_cache()
    with pytest.raises(ValueError, match="out of range"):
        cache.peek(np.array([1, -2], dtype=np.int32))
    with pytest.raises(TypeError, match="namespace"):
        cache.peek(seq(0, 8), "ns")  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(
    inserts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=6),
    probe=st.lists(st.integers(0, 2), max_size=14),
)
def test_tree_peek_is_match_without_side_effects(inserts: list[list[int]], probe: list[int]) -> None:
    tree = RadixTree(P, make_eviction_policy("lru"))
    page = 0
    for toks in inserts:
        arr = np.repeat(np.asarray(toks, dtype=np.int32), 2)[: len(toks) * 2 // P * P]
        if arr.size:
            tree.insert(NS, arr, np.arange(page, page + arr.size // P, dtype=np.int32))
            page += arr.size // P
    tree.evict(1)  # a device-less (removed) part, and a tail cut
    arr = np.repeat(np.asarray(probe, dtype=np.int32), 2)
    before = tree.node_count
    got = tree.peek(NS, arr)
    assert tree.node_count == before
    assert got == tree.match(NS, arr).device_len
    tree.check_integrity()

"""The tree on its own: exact page ids, splits, alignment, locks, eviction order."""

from __future__ import annotations

import numpy as np
import pytest

from radixcache import DEFAULT_NAMESPACE as NS
from radixcache import Namespace, RadixTree, make_eviction_policy
from tests.radixcache.conftest import P, seq, toks


def pages(*ids: int) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


def test_insert_then_match_returns_exact_pages(tree: RadixTree) -> None:
    res = tree.insert(NS, seq(0, 12), pages(7, 3, 9))
    assert res.existing_pages == 0
    assert res.device_pages.tolist() == [7, 3, 9]
    m = tree.match(NS, seq(0, 12))
    assert m.device_len == 12 and m.device_pages.tolist() == [7, 3, 9]
    assert m.last_device_node is res.last_node
    tree.check_integrity()


def test_match_is_page_aligned(tree: RadixTree) -> None:
    tree.insert(NS, seq(0, 8), pages(1, 2))
    m = tree.match(NS, seq(0, 7))  # 7 tokens: only one whole page can match
    assert m.device_len == 4 and m.device_pages.tolist() == [1]
    m = tree.match(NS, np.concatenate([seq(0, 6), toks(99, 99)]))  # diverges inside page 2
    assert m.device_len == 4 and m.device_pages.tolist() == [1]
    tree.check_integrity()


def test_partial_match_splits_node(tree: RadixTree) -> None:
    tree.insert(NS, seq(0, 12), pages(1, 2, 3))
    assert tree.node_count == 1
    m = tree.match(NS, seq(0, 8))
    assert m.device_pages.tolist() == [1, 2]
    assert tree.node_count == 2  # split at the page boundary
    node = m.last_device_node
    assert node is not None and node.key.tolist() == list(range(8))
    (child,) = node.children.values()
    assert child.key.tolist() == list(range(8, 12)) and child.device.tolist() == [3]
    tree.check_integrity()


def test_divergent_insert_splits_and_reports_existing(tree: RadixTree) -> None:
    tree.insert(NS, seq(0, 12), pages(1, 2, 3))
    other = np.concatenate([seq(0, 4), seq(100, 8)])
    res = tree.insert(NS, other, pages(4, 5, 6))
    assert res.existing_pages == 1  # page 0 was there: caller frees its page 4
    assert res.device_pages.tolist() == [1, 5, 6]
    assert tree.device_pages == 5 and tree.node_count == 3
    assert tree.match(NS, seq(0, 12)).device_pages.tolist() == [1, 2, 3]
    assert tree.match(NS, other).device_pages.tolist() == [1, 5, 6]
    tree.check_integrity()


def test_full_duplicate_insert(tree: RadixTree) -> None:
    tree.insert(NS, seq(0, 8), pages(1, 2))
    res = tree.insert(NS, seq(0, 8), pages(3, 4))
    assert res.existing_pages == 2 and res.device_pages.tolist() == [1, 2]
    assert res.new_nodes == []
    assert tree.device_pages == 2
    tree.check_integrity()


def test_namespaces_never_share(tree: RadixTree) -> None:
    a, b = Namespace(salt="tenant-a"), Namespace(salt="tenant-b")
    tree.insert(a, seq(0, 8), pages(1, 2))
    assert tree.match(b, seq(0, 8)).device_len == 0
    assert tree.match(NS, seq(0, 8)).device_len == 0
    res = tree.insert(b, seq(0, 8), pages(3, 4))
    assert res.existing_pages == 0
    assert tree.match(a, seq(0, 8)).device_pages.tolist() == [1, 2]
    assert tree.match(b, seq(0, 8)).device_pages.tolist() == [3, 4]
    lora = Namespace(lora_id=3)
    assert tree.match(lora, seq(0, 8)).device_len == 0
    tree.check_integrity()


def test_lock_counts_and_protected_pages(tree: RadixTree) -> None:
    r1 = tree.insert(NS, seq(0, 8), pages(1, 2))
    tree.lock(r1.last_node)  # a locked leaf is not extended: r2 gets a child
    r2 = tree.insert(NS, np.concatenate([seq(0, 8), seq(50, 4)]), pages(0, 0, 3))
    tree.unlock(r1.last_node)
    assert r2.existing_pages == 2 and r2.last_node.parent is r1.last_node
    assert tree.evictable_pages == 3 and tree.protected_pages == 0
    tree.lock(r2.last_node)
    assert tree.protected_pages == 3 and tree.evictable_pages == 0
    tree.lock(r1.last_node)
    assert r1.last_node.lock_ref == 2  # its own lock and its child's
    tree.unlock(r2.last_node)
    assert tree.protected_pages == 2 and tree.evictable_pages == 1
    tree.check_integrity({r1.last_node: 1})
    tree.unlock(r1.last_node)
    assert tree.protected_pages == 0
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock(r1.last_node)
    tree.check_integrity({})


def test_lru_eviction_order_leaf_first(tree: RadixTree) -> None:
    base = seq(0, 4)
    tree.insert(NS, np.concatenate([base, seq(10, 4)]), pages(1, 2))  # A: [1][2]
    tree.insert(NS, np.concatenate([base, seq(20, 4)]), pages(1, 3))  # B: shares [1]
    tree.insert(NS, seq(30, 8), pages(4, 5))  # C
    tree.match(NS, np.concatenate([base, seq(10, 4)]))  # touch A: most recent
    assert tree.evict(1).device_pages.tolist() == [3]  # B's leaf is least recent
    assert tree.evict(1).device_pages.tolist() == [5]  # then C's tail page only
    assert tree.evict(1).device_pages.tolist() == [4]  # C's head kept C's place in LRU order
    assert tree.evict(1).device_pages.tolist() == [2]  # then A's leaf
    assert tree.evict(1).device_pages.tolist() == [1]  # the shared page only once it is a leaf
    assert tree.device_pages == 0 and tree.node_count == 0
    tree.check_integrity()


def test_locked_nodes_are_never_evicted(tree: RadixTree) -> None:
    r = tree.insert(NS, seq(0, 8), pages(1, 2))
    tree.insert(NS, seq(40, 4), pages(3))
    tree.lock(r.last_node)
    assert tree.evict(100).device_pages.tolist() == [3]
    assert tree.evict(100).device_pages.size == 0
    assert tree.match(NS, seq(0, 8)).device_pages.tolist() == [1, 2]
    tree.unlock(r.last_node)
    assert sorted(tree.evict(100).device_pages.tolist()) == [1, 2]
    tree.check_integrity()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("lru", [[2], [1], [3]]),  # least recently touched first
        ("lfu", [[3], [1], [2]]),  # fewest hits first
        ("fifo", [[1], [2], [3]]),  # oldest insert first
        ("priority", [[3], [1], [2]]),  # lowest priority first
    ],
)
def test_eviction_policies(policy: str, expected: list[list[int]]) -> None:
    tree = RadixTree(P, make_eviction_policy(policy))
    tree.insert(NS, seq(0, 4), pages(1), priority=5)
    tree.insert(NS, seq(10, 4), pages(2), priority=9)
    tree.insert(NS, seq(20, 4), pages(3), priority=0)
    for _ in range(3):
        tree.match(NS, seq(10, 4))
    tree.match(NS, seq(0, 4))
    tree.match(NS, seq(0, 4))
    tree.match(NS, seq(20, 4))
    order = [tree.evict(1).device_pages.tolist() for _ in range(3)]
    assert order == expected
    tree.check_integrity()


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy 'mru'.*lru"):
        make_eviction_policy("mru")


@pytest.mark.parametrize("size", [0, 3, 6, -4, 12])
def test_page_size_must_be_power_of_two(size: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        RadixTree(size, make_eviction_policy("lru"))


def test_insert_rejects_ragged_pages(tree: RadixTree) -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        tree.insert(NS, seq(0, 6), pages(1, 2))
    with pytest.raises(ValueError, match="need 2 pages, got 1"):
        tree.insert(NS, seq(0, 8), pages(1))
    assert tree.node_count == 0
    tree.check_integrity()


def test_forget_namespace_keeps_locked(tree: RadixTree) -> None:
    a = Namespace(salt="a")
    r = tree.insert(a, seq(0, 8), pages(1, 2))
    tree.insert(a, np.concatenate([seq(0, 4), seq(70, 4)]), pages(9, 3))
    tree.insert(a, seq(80, 4), pages(4))
    tree.insert(NS, seq(0, 8), pages(5, 6))
    tree.lock(r.last_node)
    res = tree.removal.forget(a)
    assert sorted(res.device_page_ids.tolist()) == [3, 4]
    assert res.pending_pages == 2  # [1, 2] stay until unlocked
    tree.check_integrity({r.last_node: 1})
    assert tree.match(a, seq(0, 8)).device_len == 0  # detached: never matched again
    assert tree.removal.sweep_detached().size == 0  # still locked
    tree.unlock(r.last_node)
    assert sorted(tree.removal.sweep_detached().tolist()) == [1, 2]
    assert tree.removal.detached_count == 0
    assert tree.removal.namespaces() == [NS]
    assert tree.match(NS, seq(0, 8)).device_pages.tolist() == [5, 6]
    tree.check_integrity()


def test_page_keys_are_stable_chained_and_split_safe() -> None:
    t1 = RadixTree(P, make_eviction_policy("lru"))
    t2 = RadixTree(P, make_eviction_policy("lru"))
    r1 = t1.insert(NS, seq(0, 12), pages(1, 2, 3))
    first = t2.insert(NS, seq(0, 4), pages(1))
    t2.lock(first.last_node)
    r2 = t2.insert(NS, seq(0, 12), pages(1, 2, 3))
    t2.unlock(first.last_node)
    assert t2.node_count == 2
    keys1 = t1.page_keys(r1.last_node)
    assert len(keys1) == 3 * 16
    # t2 holds the same pages split across two nodes: same keys for the last pages
    assert t2.page_keys(r2.last_node) == keys1[16:]
    t1.match(NS, seq(0, 8))  # split t1's node after caching keys
    m = t1.match(NS, seq(0, 12))
    assert m.last_device_node is not None
    assert t1.page_keys(m.last_device_node) == keys1[32:]
    t1.check_integrity()
    other = RadixTree(P, make_eviction_policy("lru"))
    r3 = other.insert(Namespace(salt="x"), seq(0, 12), pages(1, 2, 3))
    assert other.page_keys(r3.last_node) != keys1


def test_unlocked_leaf_is_extended_in_place(tree: RadixTree) -> None:
    first = tree.insert(NS, seq(0, 8), pages(1, 2))
    keys_before = tree.page_keys(first.last_node)
    grown = tree.insert(NS, seq(0, 16), pages(9, 9, 3, 4))
    assert grown.existing_pages == 2 and grown.last_node is first.last_node
    assert tree.node_count == 1 and first.last_node.device.tolist() == [1, 2, 3, 4]
    assert grown.new_nodes == [first.last_node] and grown.new_node_offsets == [2]
    fresh = RadixTree(P, make_eviction_policy("lru"))
    ref = fresh.insert(NS, seq(0, 16), pages(1, 2, 3, 4))
    keys = tree.page_keys(first.last_node)  # cached prefix + the new pages
    assert keys[:32] == keys_before and keys == fresh.page_keys(ref.last_node)
    assert tree.evictable_pages == 4
    tree.check_integrity()

"""The per-victim calls eviction makes in C (radixcache/native/victims.pxi)
against the methods they stand for, and the behaviour they must keep on
either path (subclasses and other recorders keep their own methods); the
random workloads of test_native.py hold whole evictions (victims and
events) to the pure-Python path."""

from __future__ import annotations

import numpy as np
import pytest

from radixcache.namespace import Namespace
from radixcache.recorder import EventRecorder
from radixcache.tree import policies
from radixcache.tree.eviction import DeviceEviction
from radixcache.tree.lower import NoLowerTiers
from radixcache.tree.radix_tree import RadixTree

from tests.radixcache.native.test_native import _core

P = 4


def _node(tree: RadixTree, tokens: list[int]) -> object:
    arr = np.asarray(tokens, dtype=np.int32)
    tree.insert(Namespace(), arr, np.arange(arr.size // P, dtype=np.int32))
    return tree.match(Namespace(), arr).last_device_node


def test_the_built_in_keys_are_the_policies_own() -> None:
    core = _core()  # (the extension itself: on the pure path too, where nothing bound it yet)
    core.bind_policies(policies.LRUPolicy, policies.LFUPolicy, policies.FIFOPolicy, policies.PriorityPolicy)
    parent = core.Node(np.zeros(0, np.int32), None, Namespace(), 1)
    node = core.Node(np.arange(8, dtype=np.int32), parent, Namespace(), 2)
    node.hit_count, node.priority, node.last_access = 7, 3, 11
    for name in policies.eviction_policy_names():
        policy = policies.make_eviction_policy(name)
        assert core.policy_key(policy, node) == policy.key(node), name
    assert core.policy_key(policies.make_eviction_policy("fifo"), node) == (2,)


def test_a_subclass_or_another_policy_keeps_its_own_key() -> None:
    class Newest(policies.LRUPolicy):  # a subclass: not the built-in type, so its own key
        def key(self, node: object) -> tuple[int]:
            return (-node.last_access,)  # type: ignore[attr-defined]

    tree = RadixTree(P, Newest())
    a = _node(tree, [1, 2, 3, 4])
    tree.tick += 5
    b = _node(tree, [9, 9, 9, 9])
    freed = tree.eviction.evict(1)  # the newest goes first under this policy
    assert freed.device_pages.size == 1
    assert b.device is None and a.device is not None  # type: ignore[attr-defined]


def test_removals_are_recorded_as_the_recorder_records_them() -> None:
    """Evicting through the C path leaves the same records as the recorder's
    own ``removed``; a recorder of another class is called as it is."""
    tree = RadixTree(P, policies.make_eviction_policy("lru"))
    recorder = EventRecorder(tree)
    tree.recorder = recorder
    assert isinstance(tree.lower, NoLowerTiers)
    nodes = [_node(tree, [k, k, k, k, k + 1, k + 1, k + 1, k + 1]) for k in (10, 20, 30)]
    recorder.take()
    expected = EventRecorder(tree)
    for node in nodes:  # LRU: the oldest first, one removal record for the three
        expected.removed(node, "GPU")  # type: ignore[arg-type]
    want = expected.take()
    tree.eviction.evict(6)
    got = recorder.take()
    assert [type(e).__name__ for e in got] == ["BlockRemoved"]
    assert list(got[0].block_hashes) == list(want[0].block_hashes)
    assert got[0].medium == want[0].medium == "GPU"

    calls: list[str] = []

    class Counting(EventRecorder):
        def removed(self, node: object, medium: str) -> None:
            calls.append(medium)
            super().removed(node, medium)  # type: ignore[arg-type]

    tree2 = RadixTree(P, policies.make_eviction_policy("lru"))
    tree2.recorder = Counting(tree2)
    _node(tree2, [5, 5, 5, 5])
    tree2.eviction.evict(1)
    assert calls == ["GPU"]
    assert isinstance(tree2.eviction, DeviceEviction)


def _fresh(tree: RadixTree, tokens: list[int]) -> object:
    """Insert ``tokens`` with page ids no other page of ``tree`` has (the
    pages already cached keep theirs); the node they end in."""
    arr = np.asarray(tokens, dtype=np.int32)
    start = tree.node_count * 1000
    tree.insert(Namespace(), arr, np.arange(start, start + arr.size // P, dtype=np.int32))
    return tree.match(Namespace(), arr).last_device_node


def test_a_subclass_of_the_eviction_keeps_its_own_push_and_drop() -> None:
    """``DeviceEviction`` itself gets its ``push`` and ``drop_device`` as C
    calls inside eviction; a subclass's own methods are still the ones called."""
    calls: list[str] = []

    class Watched(DeviceEviction):
        def push(self, node: object) -> None:
            calls.append("push")
            super().push(node)  # type: ignore[arg-type]

        def drop_device(self, node: object) -> object:
            calls.append("drop")
            return super().drop_device(node)  # type: ignore[arg-type]

    tree = RadixTree(P, policies.make_eviction_policy("lru"))
    tree.eviction = Watched(tree, tree.eviction.policy)
    _fresh(tree, [1, 1, 1, 1, 2, 2, 2, 2])
    _fresh(tree, [1, 1, 1, 1, 5, 5, 5, 5])  # a split: [1] with two one-page children
    assert "push" in calls and "drop" not in calls
    calls.clear()
    freed = tree.eviction.evict(3)  # both children, then their parent (a candidate once they went)
    assert freed.device_pages.size == 3
    assert calls.count("drop") == 3
    assert "push" in calls[calls.index("drop") + 1:]  # the parent's entry, through the subclass
    assert tree.device_pages == 0
    tree.check_integrity()


def test_the_plain_eviction_takes_the_same_victims_through_its_c_calls() -> None:
    """Without a subclass, the same tree evicts the same pages, in the same
    order, as through the subclass above (whose calls are the methods)."""

    class Plain(DeviceEviction):  # the methods, called as methods
        pass

    freed = []
    for kind in (None, Plain):
        tree = RadixTree(P, policies.make_eviction_policy("lru"))
        if kind is not None:
            tree.eviction = kind(tree, tree.eviction.policy)
        for k in range(6):
            _fresh(tree, [k] * 4 + [k + 1] * 4 + [k + 2] * 4)
            tree.tick += 1
        freed.append([tree.eviction.evict(n).device_pages.tolist() for n in (1, 4, 3, 5)])
        tree.check_integrity()
    assert freed[0] == freed[1]


@pytest.mark.parametrize("store_between", [False, True])
def test_a_removal_after_another_record_starts_a_record_of_its_own(store_between: bool) -> None:
    """The C path's records, record for record, equal the recorder's own
    methods' where the removal cannot join the last record (a removal on
    another medium, or a store) and where it can (the next victim's)."""
    sides = []
    for through_c in (True, False):
        tree = RadixTree(P, policies.make_eviction_policy("lru"))
        recorder = EventRecorder(tree)
        tree.recorder = recorder
        a = _fresh(tree, [7, 7, 7, 7, 8, 8, 8, 8])
        b = None if store_between else _fresh(tree, [9, 9, 9, 9])
        recorder.take()
        recorder.removed(a, "CPU_PINNED")  # another medium's removal last
        if store_between:
            b = _fresh(tree, [9, 9, 9, 9])  # then a store
        if through_c:
            tree.eviction.evict(3)  # a's 2 pages and b's 1, in LRU order: one record
        else:
            for node in (a, b):
                recorder.removed(node, "GPU")  # type: ignore[arg-type]
        events = recorder.take()
        sides.append([(type(e).__name__, e.medium, list(e.block_hashes)) for e in events])
    kinds = ["BlockRemoved", "BlockStored", "BlockRemoved"] if store_between else ["BlockRemoved"] * 2
    assert [kind for kind, _, _ in sides[0]] == kinds
    assert sides[0][-1][1] == "GPU" and len(sides[0][-1][2]) == 3
    assert sides[0] == sides[1]

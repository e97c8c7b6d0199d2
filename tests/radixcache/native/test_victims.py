"""The per-victim calls eviction makes in C (radixcache/native/victims.pxi)
against the methods they stand for, and the behaviour they must keep on
either path (subclasses and other recorders keep their own methods); the
random workloads of test_native.py hold whole evictions (victims and
events) to the pure-Python path."""

from __future__ import annotations

import numpy as np

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

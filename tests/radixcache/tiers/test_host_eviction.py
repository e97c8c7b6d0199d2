"""Host eviction: policy order from a lazy heap, never a walk of the tree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixcache.cache import CacheConfig, RadixCache
from radixcache.namespace import Namespace
from radixcache.offload import HostPoolConfig, StorageConfig
from radixcache.tiers import HostTiers, TierConfig
from radixcache.tiers.host_eviction import HostEviction, is_victim
from radixcache.tree.node import Node
from radixcache.tree.policies import make_eviction_policy
from radixcache.transfer.engine import CpuCopyEngine
from tests.radixcache.tiers.tierkit import SPEC, compute, gate_storage, make_tiered, prefill, seq

NS = Namespace()


def node(parent: Node | None, uid: int, host: bool = True, device: bool = False) -> Node:
    """A one-page node with the given residency, hung under ``parent``."""
    n = Node(np.full(4, uid, dtype=np.int32), parent, NS, uid)
    if host:
        n.host = np.array([uid], dtype=np.int32)
    if device:
        n.device = np.array([uid], dtype=np.int32)
    if parent is not None:
        parent.children[n.key.tobytes()] = n
    return n


def take(ev: HostEviction, k: int) -> list[int]:
    """The uids of the next ``k`` victims, each untracked as the caller would."""
    out = []
    for victim in ev.victims():
        out.append(victim.uid)
        ev.untrack(victim)
        victim.host = None
        if len(out) == k:
            break
    return out


def test_victims_come_in_policy_order_and_a_touch_moves_a_node_back() -> None:
    ev = HostEviction(make_eviction_policy("lru"))
    root = Node(np.empty(0, dtype=np.int32), None, NS, -1)
    nodes = [node(root, uid, device=True) for uid in (1, 2, 3, 4)]
    ev.track_all(nodes)
    nodes[0].last_access = 10  # used since it was pushed: its entry is stale
    assert take(ev, 2) == [2, 3]
    assert take(ev, 2) == [4, 1]
    assert take(ev, 1) == []


def test_locked_and_held_nodes_wait_and_come_back_when_free() -> None:
    ev = HostEviction(make_eviction_policy("fifo"))
    root = Node(np.empty(0, dtype=np.int32), None, NS, -1)
    a, b, c = (node(root, uid, device=True) for uid in (1, 2, 3))
    ev.track_all([a, b, c])
    a.lock_ref, b.holds = 1, 1
    assert take(ev, 1) == [3]
    assert ev.parked == {a, b}  # came out in use: parked, not lost
    ev.check_integrity([a, b, c])
    assert take(ev, 1) == []
    a.lock_ref = 0
    assert take(ev, 1) == [1]
    b.holds = 0
    assert take(ev, 1) == [2]


def test_an_inner_host_only_node_goes_once_its_last_child_left() -> None:
    ev = HostEviction(make_eviction_policy("fifo"))
    root = Node(np.empty(0, dtype=np.int32), None, NS, -1)
    inner = node(root, 1)  # host only, with a child: dropping it would orphan the child
    leaf = node(inner, 2)
    ev.track_all([inner, leaf])
    assert [v.uid for v in ev.victims()][:1] == [2]  # the inner node was passed over
    assert inner not in ev.seq and not is_victim(inner)
    del inner.children[leaf.key.tobytes()]  # the leaf left the tree
    ev.untrack(leaf)
    leaf.host = None
    with pytest.raises(AssertionError, match="a victim not tracked"):
        ev.check_integrity([inner])  # what the tiers must not forget: track the parent
    ev.track(inner)
    ev.check_integrity([inner])
    assert take(ev, 1) == [1]


def test_host_eviction_walks_no_tree() -> None:
    """With the tree's walk disabled, host eviction still makes room in LRU
    order (the walk is what ``check_integrity`` and bulk calls use)."""
    cache = make_tiered(device_pages=8, host_pages=4)
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    walk = tiers.tree.nodes

    def no_walk() -> object:
        raise AssertionError("host eviction walked the tree")

    tiers.tree.nodes = no_walk  # type: ignore[method-assign]
    for start in (0, 100, 200):  # 2 pages each; the host holds two nodes
        cache.release(prefill(cache, seq(start, 9)))
        tiers.drain()
        cache.evict(2)
    assert tiers.counters.host_evicted_pages == 2
    tiers.tree.nodes = walk  # type: ignore[method-assign]
    cache.check_integrity()
    assert cache.admit(seq(0, 9)).cached_len == 0  # the least recently used went
    assert cache.admit(seq(200, 9)).cached_len == 8
    cache.close()


def fifo_cache(store: Path, device_pages: int) -> RadixCache:
    """FIFO eviction (an inner node comes out of the heap before its
    children), host room for two 2-page nodes, LMDB storage."""
    tiers = TierConfig(
        host=HostPoolConfig(pages=4),
        storage=StorageConfig(path=store, capacity_bytes=1 << 20),
        model_id="test-model",
    )
    config = CacheConfig(
        spec=SPEC, device_pages=device_pages, eviction_policy="fifo", tiers=tiers
    )
    return RadixCache(config)


def passed_over_inner_node(cache: RadixCache) -> tuple[HostTiers, Node]:
    """Pages 0-1 (X) and 2-3 (Y, below X) host-only; Y's store held in flight
    while a host eviction passes X over (inner) and parks Y (held): X is
    untracked. Returns the tiers and X, the store finished."""
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    cache.release(prefill(cache, seq(0, 9)))
    tiers.drain()  # X backed up and stored
    gated = gate_storage(cache, gate_puts=True)
    cache.release(prefill(cache, seq(0, 17)))
    tiers.settle_copies()  # Y backed up; its store waits at the gate
    cache.evict(cache.stats().evictable_pages)  # X and Y host-only
    cache.release(prefill(cache, seq(500, 9)))  # wants host room: none can go
    x = cache.tree.match(Namespace(), seq(0, 9)).host_nodes[0]
    assert x not in tiers.index.eviction.seq and x.children  # passed over
    gated.gate.set()
    tiers.drain()
    cache.check_integrity()
    return tiers, x


def test_a_passed_over_inner_node_loaded_back_is_a_victim_again(tmp_path: Path) -> None:
    cache = fifo_cache(tmp_path / "s", device_pages=8)
    tiers, x = passed_over_inner_node(cache)
    req = cache.admit(seq(0, 17))  # X and Y load back from the host
    cache.reserve(req, 1)
    assert req.cached_len == 16 and x.device is not None
    cache.release(req)
    cache.check_integrity()  # X, on the device again, may lose its host copy
    assert x in tiers.index.eviction.seq
    cache.close()


def test_a_passed_over_inner_node_adopted_by_an_insert_is_a_victim_again(
    tmp_path: Path,
) -> None:
    cache = fifo_cache(tmp_path / "s", device_pages=8)
    tiers, x = passed_over_inner_node(cache)
    tiers.controller.copy.close()

    def fail(request: object) -> None:
        raise RuntimeError("injected copy failure")

    assert cache.kv is not None  # the load back fails: the request computes X and Y
    tiers.controller.copy = CpuCopyEngine(cache.kv, tiers.host.buffer, before_copy=fail)
    req = cache.admit(seq(0, 17))
    compute(cache, req, 17)  # its insert gives X and Y device pages again
    assert x.device is not None and x.host is not None
    cache.release(req)
    cache.check_integrity()  # X may lose its host copy again
    assert x in tiers.index.eviction.seq
    cache.close()

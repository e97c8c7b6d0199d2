"""Page-granular eviction: a request for n pages frees about n pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import torch

from radixcache import DEFAULT_NAMESPACE as NS
from radixcache import RadixTree, make_eviction_policy
from radixcache.tiers.host_index import HostIndex
from radixcache.offload import HostPool, HostPoolConfig
from radixcache.tree.recording import NullRecorder
from radixcache.transfer import KVSpec
from radixcache.cli.replay.run import ReplayConfig, replay
from radixcache.cli.replay.trace import load_trace
from radixcache.events.types import BlockRemoved, BlockStored
from radixcache.recorder import EventRecorder
from tests.radixcache.conftest import P, seq

TRACE = Path(__file__).resolve().parents[3] / "examples" / "data" / "mooncake_synthetic_trace.jsonl"


def pages(*ids: int) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


def test_evict_takes_the_tail_pages_wanted(tree: RadixTree) -> None:
    tree.insert(NS, seq(0, 6 * P), pages(10, 11, 12, 13, 14, 15))
    assert tree.evict(2).device_pages.tolist() == [14, 15]
    assert tree.device_pages == 4 and tree.evictable_pages == 4
    m = tree.match(NS, seq(0, 6 * P))
    assert m.device_len == 4 * P and m.device_pages.tolist() == [10, 11, 12, 13]
    tree.check_integrity()
    assert tree.evict(3).device_pages.tolist() == [11, 12, 13]
    assert tree.evict(5).device_pages.tolist() == [10]  # all there is
    assert tree.device_pages == 0 and tree.node_count == 0
    tree.check_integrity()


def test_whole_victims_first_then_a_tail(tree: RadixTree) -> None:
    tree.insert(NS, seq(0, 2 * P), pages(1, 2))  # A, older
    tree.insert(NS, seq(100, 4 * P), pages(3, 4, 5, 6))  # B, newer
    assert sorted(tree.evict(3).device_pages.tolist()) == [1, 2, 6]  # A whole, B's last page
    assert tree.match(NS, seq(100, 4 * P)).device_pages.tolist() == [3, 4, 5]
    tree.check_integrity()


def test_locked_head_is_kept_and_shared_pages_wait(tree: RadixTree) -> None:
    base = seq(0, 2 * P)
    r = tree.insert(NS, base, pages(1, 2))
    tree.lock(r.last_node)  # a locked leaf is not extended: the rest is a child
    tree.insert(NS, np.concatenate([base, seq(50, 3 * P)]), pages(1, 2, 7, 8, 9))
    assert tree.evict(1).device_pages.tolist() == [9]
    assert tree.evict(10).device_pages.tolist() == [7, 8]  # the locked prefix stays
    assert tree.match(NS, base).device_pages.tolist() == [1, 2]
    tree.check_integrity({r.last_node: 1})


def test_a_leaf_with_a_host_copy_goes_whole() -> None:
    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
    pool = HostPool(spec, HostPoolConfig(pages=8, pin=False))
    policy = make_eviction_policy("lru")
    index = HostIndex(pool, NullRecorder(), P, policy)
    tree = RadixTree(P, policy, lower=index)
    res = tree.insert(NS, seq(0, 4 * P), pages(1, 2, 3, 4))
    host = pool.allocate(4)
    assert host is not None
    index.attach(res.last_node, host)
    assert tree.evict(1).device_pages.tolist() == [1, 2, 3, 4]  # device drop, node stays on host
    m = tree.match(NS, seq(0, 4 * P))
    assert m.device_len == 0 and m.host_len == 4 * P
    tree.check_integrity()


def test_events_name_only_the_evicted_pages(tree: RadixTree) -> None:
    recorder = tree.recorder = EventRecorder(tree)
    tree.insert(NS, seq(0, 5 * P), pages(1, 2, 3, 4, 5))
    (stored,) = recorder.take()
    assert isinstance(stored, BlockStored)
    tree.evict(2)
    (removed,) = recorder.take()
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == stored.block_hashes[3:]
    tree.evict(3)
    (removed,) = recorder.take()
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == stored.block_hashes[:3]


def test_bundled_trace_hit_ratio() -> None:
    """The synthetic Mooncake trace, device only, 4,000 pages of 512 tokens,
    warm-up 0.5: whole-leaf eviction reached 0.3628, page-granular 0.3720."""
    f = replay(load_trace(TRACE), ReplayConfig(device_pages=4000, warmup=0.5)).figures
    assert f.ratio(f.hit_tokens) >= 0.3719

"""Engine events end to end: a random tiered workload publishes every step over
real ZMQ on loopback; a router-side index that applies the stream must hold
exactly the engine's residency, medium by medium and page by page."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from radixcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventSubscriber,
    IndexConfig,
    KvIndex,
    PublisherConfig,
    SubscriberConfig,
    WorkerEndpoint,
    ZmqEventPublisher,
)
from radixcache.offload.host import HostPoolConfig
from radixcache.offload.lmdb_storage import LmdbStorage, StorageConfig
from radixcache import CacheConfig, KVSpec, Namespace, OutOfPagesError, RadixCache
from radixcache.hashing import block_hashes
from radixcache.tiers import HostTiers, TierConfig
from tests.events.events_testkit import sync
from tests.radixcache.tierkit import compute

P = 4
SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
NAMESPACES = [Namespace(), Namespace(salt="tenant-b", lora_id=7, lora_name="adapter-7")]


@pytest.fixture
def publisher() -> Iterator[ZmqEventPublisher]:
    pub = ZmqEventPublisher(
        PublisherConfig(
            endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", close_linger_ms=200
        )
    )
    yield pub
    pub.close()


@pytest.fixture
def router(publisher: ZmqEventPublisher) -> Iterator[tuple[EventSubscriber, KvIndex]]:
    index = KvIndex(IndexConfig(block_size=P))
    worker = WorkerEndpoint("engine", publisher.endpoint, publisher.replay_endpoint)
    sub = EventSubscriber(index, [worker], SubscriberConfig(replay_timeout_ms=1_000))
    sync(publisher, sub, "engine")
    yield sub, index
    sub.close()


def make_cache(store: Path, write_policy: str) -> RadixCache:
    record = 48 + 4 * P + SPEC.page_bytes  # header + tokens + KV of one page
    tiers = TierConfig(
        host=HostPoolConfig(pages=10),
        write_policy=write_policy,
        write_threshold=2,
        prefetch_policy="wait_complete",
        storage=StorageConfig(path=store, capacity_bytes=12 * record),
    )
    return RadixCache(
        CacheConfig(spec=SPEC, device_pages=12, tiers=tiers, record_events=True)
    )


def engine_residency(cache: RadixCache) -> dict[str, set[int]]:
    tree = cache.tree
    out: dict[str, set[int]] = {"GPU": set(), "CPU_PINNED": set(), "DISK": set()}
    for node in tree.nodes():
        hashes = block_hashes(tree.page_keys(node))
        if node.device is not None:
            out["GPU"].update(hashes)
        if node.host is not None:
            out["CPU_PINNED"].update(hashes)
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    storage = tiers.controller.storage
    assert isinstance(storage, LmdbStorage)
    out["DISK"] = set(block_hashes(b"".join(storage.stored_keys())))
    return out


def router_residency(index: KvIndex) -> dict[str, set[int]]:
    return {m: set(index.resident("engine", m)) for m in ("GPU", "CPU_PINNED", "DISK")}


def run_workload(
    cache: RadixCache, pub: ZmqEventPublisher, seed: int, steps: int
) -> tuple[set[str], set[str]]:
    """Returns the media that saw a BlockStored, and a BlockRemoved, during the run."""
    rng = random.Random(seed)
    media: set[str] = set()
    removed: set[str] = set()

    def publish() -> None:
        events = cache.take_events()
        media.update(e.medium for e in events if isinstance(e, BlockStored) and e.medium)
        removed.update(e.medium for e in events if isinstance(e, BlockRemoved) and e.medium)
        pub.publish(events)

    prompts: list[tuple[int, list[int]]] = []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.6:
            ns = rng.randrange(len(NAMESPACES))
            body = [rng.randrange(3) for _ in range(rng.randrange(2, 14))]
            if prompts and rng.random() < 0.6:
                ns, base = rng.choice(prompts)
                body = base + body[:5]
            prompts.append((ns, body))
            req = cache.admit(np.asarray(body, dtype=np.int32), NAMESPACES[ns])
            try:
                compute(cache, req, req.num_tokens - req.num_computed)
            except OutOfPagesError:  # under pressure: preempt
                pass
            cache.release(req)
        elif roll < 0.8:
            cache.evict(rng.randrange(1, 6))
        elif roll < 0.97:
            cache.poll()
        else:
            cache.forget_namespace(NAMESPACES[1])
        publish()
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    cache.drain()
    cache.poll()
    publish()
    return media, removed


@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
def test_router_index_equals_engine_residency(
    tmp_path: Path,
    publisher: ZmqEventPublisher,
    router: tuple[EventSubscriber, KvIndex],
    policy: str,
) -> None:
    sub, index = router
    cache = make_cache(tmp_path / "store", policy)
    seed = {"write_through": 1, "write_back": 2, "write_through_selective": 3}[policy]
    media, removed = run_workload(cache, publisher, seed=seed, steps=250)
    assert media == {"GPU", "CPU_PINNED", "DISK"}  # every medium was exercised
    assert "GPU" in removed
    cache.check_integrity()
    sync(publisher, sub, "engine")
    engine = engine_residency(cache)
    assert engine["GPU"] or engine["CPU_PINNED"]
    assert router_residency(index) == engine
    if policy != "write_through_selective":  # few pages earn a copy under selective
        assert {"CPU_PINNED", "DISK"} <= removed  # host and storage removals announced too
    assert publisher.stats().dropped == 0
    cache.close()


def test_events_of_one_insert_and_its_eviction(tmp_path: Path) -> None:
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=8, record_events=True))
    ns = NAMESPACES[1]
    req = cache.admit(np.arange(9, dtype=np.int32), ns)
    compute(cache, req, 9)
    cache.release(req)
    (stored,) = cache.take_events()
    assert isinstance(stored, BlockStored)
    keys = cache.tree.page_keys(next(iter(cache.tree.nodes())))
    assert stored.block_hashes == block_hashes(keys)
    assert stored.parent_block_hash is None and stored.block_size == P
    assert stored.token_ids == list(range(8))
    assert (stored.lora_id, stored.lora_name, stored.medium) == (7, "adapter-7", "GPU")
    assert all(0 <= h < 2**63 for h in stored.block_hashes)
    assert cache.take_events() == []  # drained
    cache.evict(2)
    (removed,) = cache.take_events()
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == stored.block_hashes and removed.medium == "GPU"
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]


def test_same_tokens_in_two_namespaces_get_distinct_hashes() -> None:
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=8, record_events=True))
    for ns in NAMESPACES:
        req = cache.admit(np.arange(5, dtype=np.int32), ns)
        compute(cache, req, 5)
        cache.release(req)
    a, b = cache.take_events()
    assert isinstance(a, BlockStored) and isinstance(b, BlockStored)
    assert a.token_ids == b.token_ids and a.block_hashes != b.block_hashes


def test_extending_a_leaf_announces_only_new_pages_with_parent() -> None:
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=8, record_events=True))
    req = cache.admit(np.arange(5, dtype=np.int32))
    compute(cache, req, 5)
    for t in range(4):
        cache.extend(req, [100 + t])
        compute(cache, req, 1)
    first, second = cache.take_events()
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.token_ids == [0, 1, 2, 3] and second.token_ids == [4, 100, 101, 102]
    assert second.parent_block_hash == first.block_hashes[-1]
    cache.release(req)

"""Engine events end to end: a random tiered workload publishes every step over
real ZMQ on loopback; a router-side index that applies the stream must hold
exactly the engine's residency, medium by medium and page by page."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import msgspec
import numpy as np
import pytest
import torch
import zmq

from radixcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventSubscriber,
    IndexConfig,
    KvEvent,
    KvIndex,
    PublisherConfig,
    SubscriberConfig,
    WorkerEndpoint,
    ZmqEventPublisher,
)
from radixcache.offload import HostPoolConfig, LmdbStorage, StorageConfig
from radixcache.offload.storage import record_size
from radixcache import CacheConfig, KVSpec, Namespace, OutOfPagesError, RadixCache
from radixcache.tiers import HostTiers, TierConfig
from tests.events import peer_structs
from tests.events.events_testkit import replay, sync
from tests.radixcache.keys.idkit import assert_stored_ids_match, record_ids, reference_ids
from tests.radixcache.tiers.tierkit import compute

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
    # one page's record: header, full key, namespace info, tokens, KV
    record = record_size(48, len(NAMESPACES[1].to_info()), P, SPEC.page_bytes)
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
        if node.forgotten:  # held after a forget: invisible, announced gone at the forget
            continue
        hashes = reference_ids(tree, node)
        if node.device is not None:
            out["GPU"].update(hashes)
        if node.host is not None:
            out["CPU_PINNED"].update(hashes)
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    storage = tiers.controller.storage
    assert isinstance(storage, LmdbStorage)
    by_key = record_ids(storage, tree.page_size)
    assert_stored_ids_match(tree, by_key)  # a page's DISK id is its GPU/CPU id
    out["DISK"] = set(by_key.values())
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
    for _ in range(2):  # behind any forget; the second: the first's removals are published
        assert tiers.controller.storage.delete([b"\xff" * 16]).wait(10)
    cache.poll()
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
        # Host or storage removals are announced too (which ones happen in a
        # run depends on when the asynchronous copies land).
        assert {"CPU_PINNED", "DISK"} & removed
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
    assert stored.block_hashes == reference_ids(cache.tree, next(iter(cache.tree.nodes())))
    assert next(iter(cache.tree.nodes())).keys is None  # no storage key computed for an event
    assert stored.parent_block_hash is None and stored.block_size == P
    assert stored.token_ids.tolist() == list(range(8))
    with pytest.raises(ValueError, match="read-only"):  # a view of the tree's key: never writable
        stored.token_ids[0] = 99
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
    assert a.token_ids.tolist() == b.token_ids.tolist() and a.block_hashes != b.block_hashes


def test_extending_a_leaf_announces_only_new_pages_with_parent() -> None:
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=8, record_events=True))
    req = cache.admit(np.arange(5, dtype=np.int32))
    compute(cache, req, 5)
    for t in range(4):
        cache.extend(req, [100 + t])
        compute(cache, req, 1)
    first, second = cache.take_events()
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.token_ids.tolist() == [0, 1, 2, 3] and second.token_ids.tolist() == [4, 100, 101, 102]
    assert second.parent_block_hash == first.block_hashes[-1]
    cache.release(req)


def test_forget_while_held_never_removes_the_recomputed_pages(tmp_path: Path) -> None:
    """A live request holds pages of ``ns`` across forget_namespace(ns); the
    same prompt is recomputed and announced (same block ids); the old
    holder's release must not announce their removal, and a router applying
    the stream in order must hold exactly the engine's residency."""
    cache = make_cache(tmp_path / "store", "write_through")
    index = KvIndex(IndexConfig(block_size=P))
    ns = NAMESPACES[1]
    prompt = np.arange(13, dtype=np.int32)  # three whole pages
    log: list[KvEvent] = []

    def publish() -> list[KvEvent]:
        events = cache.take_events()
        for event in events:
            index.apply_event("engine", event)
        log.extend(events)
        return events

    old = cache.admit(prompt, ns)
    compute(cache, old, 13)
    cache.drain()  # host copies and storage records land
    publish()
    ids = {h for n in cache.tree.nodes() for h in reference_ids(cache.tree, n)}
    assert len(ids) == 3
    assert ids <= index.resident("engine", "GPU") and ids <= index.resident("engine", "CPU_PINNED")

    assert cache.forget_namespace(ns) == 3  # held by the live request
    gone = publish()
    for medium in ("GPU", "CPU_PINNED"):
        assert any(
            isinstance(e, BlockRemoved) and e.medium == medium and ids <= set(e.block_hashes)
            for e in gone
        ), medium

    new = cache.admit(prompt, ns)
    assert new.num_computed == 0  # nothing of the forgotten namespace is served
    compute(cache, new, 13)
    cache.drain()
    announced = publish()
    assert any(isinstance(e, BlockStored) and e.medium == "GPU" and ids <= set(e.block_hashes)
               for e in announced)
    mark = len(log)

    cache.release(old)  # the forgotten pages go now, silently
    cache.drain()
    cache.poll()
    publish()
    late = [e for e in log[mark:] if isinstance(e, BlockRemoved) and ids & set(e.block_hashes)]
    assert late == []
    assert cache.tree.removal.detached_count == 0
    assert cache.tree.device_pages == 3  # only the new request's pages
    cache.check_integrity()
    engine = engine_residency(cache)
    assert ids <= engine["GPU"]
    assert router_residency(index) == engine
    index.check_integrity()
    cache.release(new)
    cache.close()


# ---------------------------------------------------------------- conformance and restarts

TENANTS = [
    Namespace(),
    Namespace(salt="tenant-a"),
    Namespace(salt=b"\x00tenant-b", extra_keys=("img-7",)),
    Namespace(lora_id=3, lora_name="fr-adapter"),
    Namespace(salt="tenant-c", lora_id=9, lora_name="de-adapter"),
]


def tenant_workload(cache: RadixCache, publish: Callable[[list[KvEvent]], None], seed: int, steps: int) -> None:
    """Tenants share a system prompt, each adds its own turns; evictions,
    completions and a forget now and then."""
    rng = random.Random(seed)
    system = [rng.randrange(50) for _ in range(3 * P)]
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.6:
            ns = rng.choice(TENANTS)
            body = system + [rng.randrange(4) for _ in range(rng.randrange(1, 10))]
            req = cache.admit(np.asarray(body, dtype=np.int32), ns)
            try:
                compute(cache, req, req.num_tokens - req.num_computed)
            except OutOfPagesError:
                pass
            cache.release(req)
        elif roll < 0.8:
            cache.evict(rng.randrange(1, 6))
        elif roll < 0.98:
            cache.poll()
        else:
            cache.forget_namespace(rng.choice(TENANTS))
        publish(cache.take_events())
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    cache.drain()  # every job in flight, chained ones included
    # drain() does not wait for a forget_namespace's storage job: a write
    # queued behind it does (the writer runs jobs in order).
    # (The writer finishes a commit's tickets before it publishes the commit's
    # removals: a second write behind the first makes sure they are out.)
    for _ in range(2):
        assert tiers.controller.storage.delete([b"\xff" * 16]).wait(10)
    cache.poll()
    cache.poll()  # removals storage made while the last stores committed are reported one poll later
    publish(cache.take_events())


def all_payloads(pub: ZmqEventPublisher) -> list[bytes]:
    """Every batch the publisher holds, fetched over its replay socket (loopback ZMQ)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        answer = replay(ctx, pub.replay_endpoint or "", pub.first_seq)
    finally:
        ctx.destroy(linger=0)
    assert answer[-1][2] == (-1).to_bytes(8, "big", signed=True)
    seqs = [int.from_bytes(m[2], "big", signed=True) for m in answer[:-1]]
    assert seqs == list(range(pub.first_seq, pub.next_seq)), "every batch, in order"
    return [m[3] for m in answer[:-1]]


def test_every_batch_decodes_with_vllm_and_sglang_structs(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "store", "write_through")
    pubs = {
        media: ZmqEventPublisher(PublisherConfig(
            endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", media=media, close_linger_ms=0,
        ))
        for media in ("sglang", "vllm")
    }
    try:
        def publish(events: list[KvEvent]) -> None:
            for pub in pubs.values():
                pub.publish(events)

        tenant_workload(cache, publish, seed=5, steps=300)
        payloads = {media: all_payloads(pub) for media, pub in pubs.items()}
    finally:
        for pub in pubs.values():
            pub.close()
        cache.close()
    assert len(payloads["sglang"]) > 50
    salts: set[str | None] = set()
    loras: set[str | None] = set()
    media: dict[str, set[str | None]] = {"sglang": set(), "vllm": set()}
    for name, batches in payloads.items():
        for data in batches:
            v = peer_structs.VLLM.decode(data)  # raises on any missing key or wrong type
            s = peer_structs.SGLANG.decode(data)
            assert len(v.events) == len(s.events) > 0
            for ve, se in zip(v.events, s.events):
                if isinstance(ve, peer_structs.VllmBlockStored):
                    assert isinstance(se, peer_structs.SglangBlockStored)
                    assert len(ve.token_ids) == len(ve.block_hashes) * P
                    salts.add(se.cache_salt)
                    loras.add(ve.lora_name)
                    if se.cache_salt is not None:
                        assert ve.extra_keys is not None and len(ve.extra_keys) == len(ve.block_hashes)
                        assert all(k is not None and k[0] == se.cache_salt for k in ve.extra_keys)
                if not isinstance(ve, peer_structs.VllmAllBlocksCleared):
                    media[name].add(ve.medium)
    assert salts == {None, "tenant-a", "hex:" + b"\x00tenant-b".hex(), "tenant-c"}
    assert loras == {None, "fr-adapter", "de-adapter"}
    assert media == {"sglang": {"GPU", "CPU_PINNED", "DISK"}, "vllm": {"GPU", "CPU", "STORAGE"}}
    # The same decoders refuse a map that leaves nil keys out (the old wire):
    old = msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [0] * P,
                                "block_size": P, "medium": "GPU"}], None])
    with pytest.raises(msgspec.ValidationError, match="parent_block_hash"):
        peer_structs.VLLM.decode(old)
    with pytest.raises(msgspec.ValidationError, match="parent_block_hash"):
        peer_structs.SGLANG.decode(old)


def tenant_residency(cache: RadixCache) -> dict[str, set[int]]:
    return engine_residency(cache)


def test_engine_restart_on_the_same_storage(tmp_path: Path) -> None:
    """Restart with traffic before and none after: the router drops the old
    incarnation at once, learns the survivors on disk, numbers keep growing."""
    store = tmp_path / "store"
    index = KvIndex(IndexConfig(block_size=P))
    first_cache = make_cache(store, "write_through")
    first = ZmqEventPublisher(PublisherConfig(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", close_linger_ms=200))
    spec = WorkerEndpoint("engine", first.endpoint, first.replay_endpoint)
    sub = EventSubscriber(index, [spec], SubscriberConfig(replay_timeout_ms=1_000))
    try:
        sync(first, sub, "engine")
        tenant_workload(first_cache, first.publish, seed=11, steps=200)
        sync(first, sub, "engine")
        assert router_residency(index) == engine_residency(first_cache)
        old_disk = engine_residency(first_cache)["DISK"]
        assert old_disk
        last_old = first.next_seq - 1
        first_cache.close()
        first.close()

        cache = make_cache(store, "write_through")  # announces the survivors
        pub = ZmqEventPublisher(PublisherConfig(
            endpoint=spec.endpoint, replay_endpoint=spec.replay_endpoint, close_linger_ms=200))
        try:
            assert pub.first_seq > last_old, "sequence numbers never go back"
            started = time.monotonic()
            survivors = cache.take_events()
            assert survivors and all(isinstance(e, BlockStored) and e.medium == "DISK" for e in survivors)
            pub.publish(survivors)
            # No traffic from here on: the reconnect alone must bring the router up to date.
            expected = engine_residency(cache)
            assert expected == {"GPU": set(), "CPU_PINNED": set(), "DISK": old_disk}
            ok = sub.run_until(lambda: router_residency(index) == expected, 5.0)
            got = router_residency(index)["DISK"]
            assert ok, (len(got), len(expected["DISK"]), len(got - expected["DISK"]),
                        len(expected["DISK"] - got), sub.stats(), index.stats())
            assert time.monotonic() - started < 2.0
            announced = {h for e in survivors if isinstance(e, BlockStored) for h in e.block_hashes}
            assert announced == old_disk
            # The survivors carry parents and tokens: prefix queries reach them on disk.
            for e in survivors:
                if isinstance(e, BlockStored) and e.parent_block_hash is None:
                    assert any(o.disk for o in index.overlap(e.token_ids[:P], block_size=P,
                               lora_id=e.lora_id, lora_name=e.lora_name, cache_salt=e.cache_salt,
                               extra_keys=None if e.extra_keys is None or e.extra_keys[0] is None
                               else tuple(e.extra_keys[0])[1 if e.cache_salt else 0:]).values())
            # A page of the first life served again by the new incarnation
            # (read back or recomputed) carries the id it was announced with
            # on disk: its device event names the same page.
            first_page = next(e for e in survivors if isinstance(e, BlockStored) and e.parent_block_hash is None)
            ns = next(
                t for t in TENANTS
                if (t.lora_id, t.lora_name, t.wire_salt(), t.event_extra())
                == (first_page.lora_id, first_page.lora_name, first_page.cache_salt,
                    None if first_page.extra_keys is None else first_page.extra_keys[0])
            )
            req = cache.admit(np.asarray(list(first_page.token_ids[:P]) + [0], dtype=np.int32), ns)
            compute(cache, req, req.num_tokens - req.num_computed)
            cache.release(req)
            cache.drain()
            again = cache.take_events()
            pub.publish(again)
            gpu = [h for e in again if isinstance(e, BlockStored) and e.medium == "GPU" for h in e.block_hashes]
            assert gpu == [first_page.block_hashes[0]]
            # Traffic after the restart keeps the two equal (the first life's
            # prompts too: pages read back from its records).
            tenant_workload(cache, pub.publish, seed=12, steps=80)
            tenant_workload(cache, pub.publish, seed=11, steps=40)
            sync(pub, sub, "engine")
            assert router_residency(index) == engine_residency(cache)
        finally:
            cache.close()
            pub.close()
    finally:
        sub.close()


def test_an_idle_engine_restart_reaches_a_gap_driven_router_within_a_second(tmp_path: Path) -> None:
    """A router that asks for replay only on a gap (tests/events/gap_consumer.py,
    modelled on Dynamo 1.6.1's indexer) follows an engine that restarts on
    the same storage and then stays idle: within a second it holds exactly
    the new incarnation's residency (its DISK survivors, nothing on GPU or
    host), though the engine published nothing after its start."""
    from tests.events.gap_consumer import GapConsumer

    store = tmp_path / "store"
    index = KvIndex(IndexConfig(block_size=P))
    first_cache = make_cache(store, "write_through")
    first = ZmqEventPublisher(PublisherConfig(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", close_linger_ms=200))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = GapConsumer(ctx, index, "engine", first.endpoint, first.replay_endpoint)
    try:
        deadline = time.monotonic() + 5.0
        while router.live == 0:  # connected once it receives a live batch
            assert time.monotonic() < deadline, "the router never connected"
            first.publish([BlockRemoved([(1 << 63) - 1], "GPU")])
            router.poll(20)
        tenant_workload(first_cache, first.publish, seed=11, steps=200)
        assert router.run_until(lambda: router.last == first.next_seq - 1, 10.0)
        assert router_residency(index) == engine_residency(first_cache)
        old_disk = engine_residency(first_cache)["DISK"]
        assert old_disk and router_residency(index)["GPU"]
        first_cache.close()
        first.close()
        router.poll(50)  # the connection drops

        cache = make_cache(store, "write_through")  # announces the survivors
        pub = ZmqEventPublisher(PublisherConfig(
            endpoint=first.endpoint, replay_endpoint=first.replay_endpoint, close_linger_ms=200))
        try:
            pub.publish(cache.take_events())  # before the router is back; then no traffic
            published = pub.next_seq
            expected = engine_residency(cache)
            assert expected == {"GPU": set(), "CPU_PINNED": set(), "DISK": old_disk}
            started = time.monotonic()
            ok = router.run_until(lambda: router_residency(index) == expected, 3.0)
            elapsed = time.monotonic() - started
            assert ok, (router.gaps, router.recovered, pub.stats())
            assert elapsed < 1.0, elapsed
            assert pub.next_seq == published and router.gaps == 1
        finally:
            cache.close()
            pub.close()
    finally:
        router.close()
        ctx.destroy(linger=0)


def test_survivors_come_parents_first_and_orphans_are_held_by_id(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cache = make_cache(store, "write_through")
    ns = TENANTS[2]  # salted, with extra keys
    prompt = np.arange(3 * P + 1, dtype=np.int32)
    req = cache.admit(prompt, ns)
    compute(cache, req, req.num_tokens)
    cache.release(req)
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    cache.drain()
    cache.poll()
    storage = tiers.controller.storage
    assert isinstance(storage, LmdbStorage)
    node = next(n for n in cache.tree.nodes() if n.key.size == 3 * P)
    keys = cache.tree.page_keys(node)
    ids = reference_ids(cache.tree, node)
    assert record_ids(storage, P) == {keys[i * 16 : (i + 1) * 16]: ids[i] for i in range(3)}
    assert storage.delete([keys[16:32]]).wait(10)  # the middle page leaves storage first
    cache.close()

    cache = make_cache(store, "write_through")
    events = cache.take_events()
    assert [(e.block_hashes, e.parent_block_hash, e.medium) for e in events if isinstance(e, BlockStored)] == [
        ([ids[0]], None, "DISK"),  # a first page, then the orphan under its missing parent
        ([ids[2]], ids[1], "DISK"),
    ]
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert list(stored[0].token_ids) == prompt[:P].tolist()
    assert list(stored[1].token_ids) == prompt[2 * P : 3 * P].tolist()
    assert all(e.cache_salt == ns.wire_salt() and e.extra_keys == [ns.event_extra()] for e in stored)
    index = KvIndex(IndexConfig(block_size=P))
    index.apply_batch("engine", EventBatch(0.0, events))
    assert index.resident("engine", "DISK") == {ids[0], ids[2]}  # what storage holds
    salt, extra = ns.wire_salt(), ns.extra_keys
    assert index.overlap(prompt.tolist(), cache_salt=salt, extra_keys=extra)["engine"].disk == 1
    # The engine recomputes the middle page: the router places the orphan under it.
    req = cache.admit(prompt, ns)
    compute(cache, req, req.num_tokens - req.num_computed)
    cache.release(req)
    index.apply_batch("engine", EventBatch(0.0, cache.take_events()))
    assert index.overlap(prompt.tolist(), cache_salt=salt, extra_keys=extra)["engine"].disk == 3
    index.check_integrity()
    cache.close()

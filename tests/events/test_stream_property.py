"""The stream under faults: a random tiered multi-tenant workload on a real
RadixCache (host pool + LMDB), published over loopback ZMQ, with forced drops
(gaps the subscriber repairs from replay), consumer restarts (a fresh
subscriber rebuilt from replay) and engine restarts on the same storage
(survivors announced, no traffic needed). After every phase the router's
per-medium sets equal the engine's exactly."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixcache import CacheConfig, Namespace, OutOfPagesError, RadixCache
from radixcache.events import (
    AllBlocksCleared,
    BlockStored,
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
from radixcache.tiers import HostTiers, TierConfig
from tests.events.events_testkit import sync
from tests.radixcache.keys.idkit import assert_stored_ids_match, record_ids, reference_ids
from tests.radixcache.tiers.tierkit import SPEC, compute

P = SPEC.page_size
TENANTS = [Namespace(), Namespace(salt="a"), Namespace(salt="b", lora_id=2, lora_name="x")]
MEDIA = ("GPU", "CPU_PINNED", "DISK")


class Rig:
    """One engine incarnation at a time on one storage folder, one router."""

    def __init__(self, store: Path, policy: str) -> None:
        self.store = store
        self.policy = policy
        self.storage_log: list[tuple[str, list[int], Any]] = []
        self.key_ids: dict[bytes, int] = {}  # storage key -> the id its put recorded
        self.forgets = False  # whether the workload calls forget_namespace now and then
        self.cache = self._cache()
        self.pub = ZmqEventPublisher(PublisherConfig(
            endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", close_linger_ms=100))
        self.spec = WorkerEndpoint("engine", self.pub.endpoint, self.pub.replay_endpoint)
        self.publish(self.cache.take_events())
        self.index = KvIndex(IndexConfig(block_size=P))
        self.sub = EventSubscriber(self.index, [self.spec], SubscriberConfig(replay_timeout_ms=2_000))
        self.seqs: list[int] = []  # every incarnation's first number
        self.log: list[list[KvEvent]] = []  # every published batch, for diagnosing a mismatch

    def publish(self, events: list[KvEvent]) -> None:
        if events:
            self.log.append(events)
        self.pub.publish(events)

    def history(self, block_id: int) -> list[str]:
        """What the stream said about one block id, batch by batch."""
        out = []
        for i, batch in enumerate(self.log):
            for e in batch:
                if isinstance(e, AllBlocksCleared):
                    continue
                if block_id in e.block_hashes:
                    parent = e.parent_block_hash if isinstance(e, BlockStored) else ""
                    out.append(f"{i}:{type(e).__name__}({e.medium}, parent={parent})")
        return out

    def _watch(self, cache: RadixCache) -> RadixCache:
        """Log the storage's puts and removals by block id (for diagnosing a mismatch)."""
        tiers = cache.tiers
        assert isinstance(tiers, HostTiers)
        storage = tiers.controller.storage
        put, take, forget = storage.put, storage.take_removed, storage.forget_namespace

        def logged_put(keys: Any, *args: Any, **kwargs: Any) -> Any:
            ticket = put(keys, *args, **kwargs)
            meta = kwargs.get("meta", args[4] if len(args) > 4 else None)
            ids = [] if meta is None else list(meta.block_ids)
            self.key_ids.update(zip(keys, ids))
            self.storage_log.append(("put", ids, ticket))
            return ticket

        def logged_take() -> list[bytes]:
            keys = take()
            self.storage_log.append(("removed", [self.key_ids.get(k, -1) for k in keys], None))
            return keys

        def logged_forget(ns: bytes) -> Any:
            ticket = forget(ns)
            self.storage_log.append(("forget", [], ticket))
            return ticket

        storage.put = logged_put  # type: ignore[method-assign]
        storage.take_removed = logged_take  # type: ignore[method-assign]
        storage.forget_namespace = logged_forget  # type: ignore[method-assign]
        return cache

    def storage_history(self, block_id: int) -> list[str]:
        out = []
        for i, (kind, ids, ticket) in enumerate(self.storage_log):
            if kind == "forget" or block_id in ids:
                result = ticket.result() if ticket is not None and ticket.done() else None
                where = f"@{ids.index(block_id)}/{len(ids)}" if block_id in ids else ""
                out.append(f"{i}:{kind}{where}={result}")
        return out

    def _cache(self) -> RadixCache:
        per_page = record_size(48, 64, P, SPEC.page_bytes)
        tiers = TierConfig(
            host=HostPoolConfig(pages=12), write_policy=self.policy, write_threshold=2,
            prefetch_policy="wait_complete",
            storage=StorageConfig(path=self.store, capacity_bytes=14 * per_page), model_id="prop",
        )
        return self._watch(RadixCache(CacheConfig(spec=SPEC, device_pages=10, tiers=tiers, record_events=True)))

    def traffic(self, rng: random.Random, steps: int) -> None:
        system = [7, 7, 7, 7, 1, 2, 3, 4]
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.6:
                body = system[: rng.choice([0, 4, 8])] + [rng.randrange(3) for _ in range(rng.randrange(2, 12))]
                req = self.cache.admit(np.asarray(body, dtype=np.int32), rng.choice(TENANTS))
                try:
                    compute(self.cache, req, req.num_tokens - req.num_computed)
                except OutOfPagesError:
                    pass
                self.cache.release(req)
            elif roll < 0.8:
                self.cache.evict(rng.randrange(1, 6))
            elif roll < 0.98:
                self.cache.poll()
            else:
                self.forget(rng.choice(TENANTS))
            self.publish(self.cache.take_events())
        self.settle()

    def forget(self, ns: Namespace) -> None:
        if self.forgets:
            self.cache.forget_namespace(ns)

    def settle(self) -> None:
        tiers = self.cache.tiers
        assert isinstance(tiers, HostTiers)
        self.cache.drain()  # every job in flight, chained ones included
        # drain() does not wait for a forget_namespace's storage job, and the
        # writer finishes a commit's tickets before it publishes the commit's
        # removals: two writes queued behind everything make both visible.
        for _ in range(2):
            assert tiers.controller.storage.delete([b"\xff" * 16]).wait(10)
        self.cache.poll()
        self.cache.poll()  # removals made while the last stores committed
        self.publish(self.cache.take_events())

    def restart_engine(self) -> None:
        self.settle()
        last = self.pub.next_seq - 1
        self.cache.close()
        self.pub.close()
        self.cache = self._cache()  # announces what storage kept
        self.pub = ZmqEventPublisher(PublisherConfig(
            endpoint=self.spec.endpoint, replay_endpoint=self.spec.replay_endpoint, close_linger_ms=100))
        assert self.pub.first_seq > last, "sequence numbers went backwards across a restart"
        self.seqs.append(self.pub.first_seq)
        self.publish(self.cache.take_events())

    def restart_consumer(self) -> None:
        self.sub.close()
        self.index = KvIndex(IndexConfig(block_size=P))
        self.sub = EventSubscriber(self.index, [self.spec], SubscriberConfig(replay_timeout_ms=2_000))

    def engine(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {m: set() for m in MEDIA}
        tree = self.cache.tree
        for node in tree.nodes():
            if node.forgotten:  # held after a forget: invisible, announced gone at the forget
                continue
            ids = reference_ids(tree, node)
            if node.device is not None:
                out["GPU"].update(ids)
            if node.host is not None:
                out["CPU_PINNED"].update(ids)
        tiers = self.cache.tiers
        assert isinstance(tiers, HostTiers)
        storage = tiers.controller.storage
        assert isinstance(storage, LmdbStorage)
        by_key = record_ids(storage, P)
        assert_stored_ids_match(tree, by_key)  # a page's DISK id is its GPU/CPU id
        out["DISK"] = set(by_key.values())
        return out

    def router(self) -> dict[str, set[int]]:
        return {m: self.index.resident("engine", m) for m in MEDIA}

    def check(self, what: str) -> None:
        sync(self.pub, self.sub, "engine", timeout_s=10)
        engine, router = self.engine(), self.router()
        for m in MEDIA:
            assert router[m] == engine[m], (
                f"after {what}: {m} router {len(router[m])} engine {len(engine[m])}, "
                f"router only {[(self.history(h), self.storage_history(h)) for h in router[m] - engine[m]]}, "
                f"engine only {[(self.history(h), self.storage_history(h)) for h in engine[m] - router[m]]}, "
                f"{self.sub.stats()}, {self.index.stats()}"
            )
        self.index.check_integrity()

    def close(self) -> None:
        self.sub.close()
        self.pub.close()
        self.cache.close()


@pytest.fixture
def rigs(tmp_path: Path) -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.close()


PHASES = st.lists(st.sampled_from(["traffic", "gap", "consumer", "engine"]), min_size=4, max_size=7)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), phases=PHASES,
       policy=st.sampled_from(["write_through", "write_back", "write_through_selective"]))
def test_router_equals_engine_after_every_phase(
    tmp_path_factory: pytest.TempPathFactory, seed: int, phases: list[str], policy: str
) -> None:
    rng = random.Random(seed)
    rig = Rig(tmp_path_factory.mktemp("store"), policy)
    try:
        rig.check("start")
        for i, phase in enumerate(phases):
            if phase == "gap":  # live batches lost: the subscriber repairs from replay
                rig.pub.simulate_full_queue(rng.randrange(1, 6))
                rig.traffic(rng, 25)
            elif phase == "consumer":
                rig.restart_consumer()
            elif phase == "engine":
                rig.restart_engine()
            else:
                rig.traffic(rng, 40)
            rig.check(f"phase {i} ({phase}) of {phases}")
    finally:
        rig.close()


def test_gap_under_write_through_and_engine_restart(tmp_path: Path) -> None:
    """A fixed schedule through every fault, write_through (where the 763/778
    disk mismatch was once seen): forced gaps, a consumer and an engine restart."""
    rig = Rig(tmp_path / "store", "write_through")
    rng = random.Random(3)
    try:
        rig.traffic(rng, 60)
        rig.check("traffic")
        for _ in range(3):
            rig.pub.simulate_full_queue(4)
            rig.traffic(rng, 30)
            rig.check("forced gap")
        rig.restart_consumer()
        rig.check("consumer restart")
        rig.restart_engine()
        rig.check("engine restart, idle")
        rig.traffic(rng, 40)
        rig.check("traffic after restart")
        assert rig.sub.stats().repaired >= 1 or rig.sub.stats().restarts >= 1
    finally:
        rig.close()


def test_router_equals_engine_with_forgets(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "store", "write_through")
    rig.forgets = True
    rng = random.Random(8438)
    try:
        rig.check("start")
        for i in range(4):
            rig.traffic(rng, 40)
            rig.check(f"traffic {i} with forgets")
    finally:
        rig.close()

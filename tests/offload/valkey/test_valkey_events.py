"""Page events of engines on a shared pool: a page stored in the pool is
announced ``BlockStored(medium="EXTERNAL")`` once, by the engine that wrote
it; an engine that reads it from the pool, or whose put found it there
already, announces nothing for it on EXTERNAL. Real valkey-server processes
(single server and 3-node cluster); the engines are RadixCache instances
configured as users do (``TierConfig(storage=url)``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from radixcache import CacheConfig, RadixCache
from radixcache.events.types import BlockRemoved, BlockStored, KvEvent
from radixcache.metrics import snapshot
from radixcache.offload import HostPoolConfig
from radixcache.tiers.config import TierConfig
from tests.radixcache.tiers.tierkit import P, SPEC, assert_kv_correct, compute, prefill


@pytest.fixture(params=["single", "cluster"])
def pool_servers(request: pytest.FixtureRequest) -> Any:
    """The session's single server, then its 3-node cluster (conftest.py)."""
    return request.getfixturevalue(
        "valkey_server" if request.param == "single" else "valkey_cluster"
    )


@pytest.fixture
def pool_url(pool_servers: Any) -> Iterator[str]:
    """The URL of ``pool_servers``, emptied."""
    pool_servers.flush()
    yield pool_servers.url


def engine(url: str) -> RadixCache:
    tiers = TierConfig(host=HostPoolConfig(pages=16), write_policy="write_through",
                       prefetch_policy="wait_complete", storage=url, model_id="events-model")
    return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers, record_events=True))


def hashes(events: list[KvEvent], medium: str | None, kind: type = BlockStored) -> list[int]:
    return [h for e in events if isinstance(e, kind) and e.medium == medium
            for h in e.block_hashes]


def test_the_writer_announces_pool_pages_once_and_a_reader_never(pool_url: str) -> None:
    prompt = np.arange(500, 500 + 4 * P + 1, dtype=np.int32)  # 4 full pages
    a = engine(pool_url)
    try:
        a.release(prefill(a, prompt))
        a.drain()
        events_a = a.take_events()
        device = hashes(events_a, None) + hashes(events_a, "GPU")
        external = hashes(events_a, "EXTERNAL")
        assert len(external) == 4 and external == device[:4]  # each full page once, in order
        assert hashes(events_a, "DISK") == []  # a pool is not this engine's disk
        # the same prompt again on A: already stored, nothing announced again
        a.release(prefill(a, prompt))
        a.drain()
        assert hashes(a.take_events(), "EXTERNAL") == []
    finally:
        a.close()

    b = engine(pool_url)
    try:
        req = b.admit(prompt)
        assert req.cached_len == 4 * P  # served from the pool
        b.reserve(req, 1)
        assert_kv_correct(b, req)
        b.release(req)
        b.drain()
        events_b = b.take_events()
        assert hashes(events_b, "EXTERNAL") == []  # A announced them; B only read them
        assert hashes(events_b, "CPU_PINNED")  # B's own tiers are announced as usual
        stats = b.tier_stats()
        assert stats is not None and stats.storage is not None and stats.storage.puts == 0
    finally:
        b.close()


def test_a_put_that_finds_the_pages_there_announces_nothing(pool_url: str) -> None:
    """Two engines compute the same prompt at once: only the first to write it announces it."""
    prompt = np.arange(9000, 9000 + 3 * P + 1, dtype=np.int32)
    d, e = engine(pool_url), engine(pool_url)
    try:
        late = e.admit(prompt)  # looked up before D wrote anything: a miss
        assert late.cached_len == 0
        d.release(prefill(d, prompt))
        d.drain()
        assert len(hashes(d.take_events(), "EXTERNAL")) == 3
        compute(e, late, prompt.size)  # E computes it too; its puts find D's records
        e.release(late)
        e.drain()
        events_e = e.take_events()
        assert hashes(events_e, "EXTERNAL") == []
        assert len(hashes(events_e, "CPU_PINNED")) == 3  # E's host copies, announced as usual
    finally:
        d.close()
        e.close()


def test_removed_pool_pages_are_announced_as_external(pool_url: str, pool_servers: Any) -> None:
    """A page the writer stored and the pool then lost (here deleted by an
    operator, seen through keyspace notifications) is BlockRemoved(EXTERNAL)."""
    prompt = np.arange(7000, 7000 + 2 * P + 1, dtype=np.int32)
    a = engine(pool_url)
    try:
        a.release(prefill(a, prompt))
        a.drain()
        stored = hashes(a.take_events(), "EXTERNAL")
        assert len(stored) == 2
        for node in getattr(pool_servers, "nodes", [pool_servers]):  # DEL each record
            with node.client() as client:
                for key in list(client.scan_iter(match=b"rxkv:*")):
                    client.delete(key)
        removed: list[int] = []
        for _ in range(200):  # notifications arrive asynchronously
            a.drain()
            removed += hashes(a.take_events(), "EXTERNAL", BlockRemoved)
            if len(removed) >= 2:
                break
            time.sleep(0.02)
        assert sorted(removed) == sorted(stored)
    finally:
        a.close()


def test_a_pool_page_is_announced_gone_only_by_the_engine_that_announced_it(
    pool_url: str, pool_servers: Any
) -> None:
    """B computes the same prompt while A writes it: B's put finds A's records
    there, so B announces no EXTERNAL store, and when the records go B
    announces no removal either (it counts them as unknown), while A does."""
    prompt = np.arange(9000, 9000 + 2 * P + 1, dtype=np.int32)
    a, b = engine(pool_url), engine(pool_url)
    try:
        req_b = b.admit(prompt)  # nothing in the pool yet: B computes it all
        assert req_b.num_computed == 0
        a.release(prefill(a, prompt))
        a.drain()
        compute(b, req_b, prompt.size)
        b.release(req_b)
        b.drain()
        stored = hashes(a.take_events(), "EXTERNAL")
        assert len(stored) == 2
        assert hashes(b.take_events(), "EXTERNAL") == []
        for node in getattr(pool_servers, "nodes", [pool_servers]):  # DEL each record
            with node.client() as client:
                for key in list(client.scan_iter(match=b"rxkv:*")):
                    client.delete(key)
        removed_a: list[int] = []
        removed_b: list[int] = []
        recorder_b = b.tree.recorder
        for _ in range(250):  # notifications arrive asynchronously
            a.drain()
            b.drain()
            removed_a += hashes(a.take_events(), "EXTERNAL", BlockRemoved)
            removed_b += hashes(b.take_events(), "EXTERNAL", BlockRemoved)
            if len(removed_a) >= 2 and recorder_b.unknown_removals >= 2:
                break
            time.sleep(0.02)
        assert sorted(removed_a) == sorted(stored)
        assert recorder_b.unknown_removals == 2  # B saw both go
        assert removed_b == []
        assert snapshot(b)["storage_unknown_removals"] == 2.0
        assert snapshot(a)["storage_unknown_removals"] == 0.0
    finally:
        a.close()
        b.close()

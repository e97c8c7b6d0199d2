"""A tier below the device that fails degrades to recomputing; its error
never escapes a call of the runner's.

Issue 21 (3): with a write_back host tier whose copy engine fails, the
first eviction raised out of the tree's eviction loop (the heap left
inconsistent: later requests got ``OutOfPagesError: asked for 6, 3 free,
5 evictable``); with a closed or failing storage, ``admit`` raised after
registering the request (a ghost live request). Here the copy engine and
the storage fail in every way they can (closed, raising on every call,
failing one call) under every write policy, and every request still gets
right KV, the pools stay consistent and the failures are counted."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixcache import Namespace, RadixCache
from radixcache.transfer import FutureTicket
from tests.radixcache.tiers.tierkit import assert_kv_correct, make_tiered, prefill, seq

POLICIES = ["write_through", "write_through_selective", "write_back"]


class RaisingStorage:
    """A real store in front of which chosen calls raise (a connection down)."""

    def __init__(self, inner: Any, failing: set[str]) -> None:
        self.inner = inner
        self.failing = failing

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in self.failing and callable(value):
            def fail(*args: object, **kwargs: object) -> Any:
                raise ConnectionError(f"injected: storage {name} failed")

            return fail
        return value


def _serve_many(cache: RadixCache, starts: list[int], ns: Namespace = Namespace()) -> None:
    """Serve prompts that overflow the device (8 pages), checking every KV."""
    for start in starts:
        req = prefill(cache, seq(start, 17), ns)
        assert_kv_correct(cache, req)
        cache.release(req)
        cache.poll()
        cache.check_integrity()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_closed_copy_engine_degrades_every_eviction(policy: str) -> None:
    cache = make_tiered(device_pages=8, host_pages=16, write_policy=policy)
    _serve_many(cache, [0])
    cache.tiers.controller.copy.close()  # type: ignore[attr-defined]  # every submission raises
    _serve_many(cache, [1000, 1000, 1000, 2000, 3000, 4000, 0, 1000])  # (hits earn selective backups)
    stats = cache.stats()
    assert stats.live_requests == 0 and stats.evicted_pages > 0
    assert cache.tier_stats().failed_jobs > 0  # type: ignore[union-attr]
    again = cache.admit(seq(4000, 17))  # whatever survived is right
    cache.reserve(again, 17 - again.cached_len)
    cache.release(again)
    cache.check_integrity()
    cache.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_storage_closed_under_the_cache_is_a_miss(tmp_path: Path, policy: str) -> None:
    cache = make_tiered(device_pages=8, host_pages=8, write_policy=policy, storage=tmp_path / "s")
    _serve_many(cache, [0, 1000])
    cache.drain()
    cache.tiers.storage.close()  # type: ignore[attr-defined]  # every call raises now
    _serve_many(cache, [2000, 3000, 0, 4000, 1000])
    cache.drain()
    assert cache.stats().live_requests == 0
    assert cache.tier_stats().failed_jobs > 0  # type: ignore[union-attr]
    cache.forget_namespace(Namespace())  # cannot delete from storage: never fetched again
    _serve_many(cache, [0])
    cache.reset()
    cache.check_integrity()
    cache.close()


CALLS = ["longest_prefix", "get", "put", "take_removed", "take_written", "forget_namespace", "stats"]


@pytest.mark.parametrize("failing", [{c} for c in CALLS] + [set(CALLS)], ids=[*CALLS, "all"])
def test_storage_calls_that_raise_degrade(tmp_path: Path, failing: set[str]) -> None:
    cache = make_tiered(device_pages=8, host_pages=8, storage=tmp_path / "s")
    _serve_many(cache, [0, 1000])
    cache.drain()
    controller = cache.tiers.controller  # type: ignore[attr-defined]
    controller.storage = RaisingStorage(controller.storage, failing)
    _serve_many(cache, [2000, 3000, 0, 4000, 1000])
    cache.drain()
    assert cache.tier_stats() is not None
    cache.forget_namespace(Namespace(salt="other"))
    cache.check_integrity()
    assert cache.stats().live_requests == 0
    controller.storage = controller.storage.inner
    cache.close()


def test_a_namespace_storage_could_not_forget_is_never_fetched_again(tmp_path: Path) -> None:
    ns = Namespace(salt="tenant")
    cache = make_tiered(device_pages=8, host_pages=4, storage=tmp_path / "s")
    _serve_many(cache, [0], ns)
    cache.drain()
    _serve_many(cache, [1000, 2000, 3000])  # the tenant's pages leave device and host
    cache.drain()  # (host room for the fetch)
    probe = cache.admit(seq(0, 17), ns)
    assert probe.hit_storage == 16, "the tenant's pages are in storage"
    cache.release(probe)
    cache.drain()
    cache.evict(8)
    controller = cache.tiers.controller  # type: ignore[attr-defined]
    controller.storage = RaisingStorage(controller.storage, {"forget_namespace"})
    cache.forget_namespace(ns)
    assert cache.tiers.forgets.blocked(ns)  # type: ignore[attr-defined]
    controller.storage = controller.storage.inner  # storage answers again, the old pages still in it
    after = cache.admit(seq(0, 17), ns)
    assert after.cached_len == 0 and after.hit_storage == 0, "a forgotten page came back"
    cache.release(after)
    forgets = cache.tiers.forgets  # type: ignore[attr-defined]
    for _ in range(500):  # each poll goes on with the deletion, without waiting for it
        cache.poll()
        if not forgets.blocked(ns):
            break
        time.sleep(0.01)
    assert not forgets.blocked(ns)
    fresh = cache.admit(seq(0, 17), ns)
    assert fresh.hit_storage == 0, "the old pages are gone from storage"
    cache.release(fresh)
    cache.check_integrity()
    cache.close()


def test_a_failed_forget_ticket_counts_as_not_forgotten(tmp_path: Path) -> None:
    ns = Namespace(salt="t2")
    cache = make_tiered(storage=tmp_path / "s")
    controller = cache.tiers.controller  # type: ignore[attr-defined]
    inner = controller.storage

    class FailingForget(RaisingStorage):
        def forget_namespace(self, namespace: bytes) -> FutureTicket:
            return FutureTicket.failed(OSError("injected: delete failed"))

    controller.storage = FailingForget(inner, set())
    failed = cache.tier_stats().failed_jobs  # type: ignore[union-attr]
    cache.forget_namespace(ns)
    assert cache.tiers.forgets.blocked(ns)  # type: ignore[attr-defined]
    assert cache.tier_stats().failed_jobs == failed + 1  # type: ignore[union-attr]
    controller.storage = inner
    cache.close()  # the last attempt succeeds: nothing owed is left behind
    assert not cache.tiers.forgets.owed  # type: ignore[attr-defined]

"""A request giving up its pending loads returns every page it drops.

After a short fetch, the pages past those that arrived stay in the request's
table as its own, to compute into. When the load chained to the fetch then
fails, or the request stops waiting for it (``best_effort``), or it is
released, those pages must go back to the pool; the pages the load itself
writes stay with the load until it lands. Copies and storage reads are held
by the manual engines of the property test, so every step is deterministic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixcache import RadixCache, Request
from radixcache.offload import make_prefetch_policy
from radixcache.tiers import HostTiers
from tests.radixcache.tiers.test_tiers_property import ManualCopyEngine, ManualStorage
from tests.radixcache.tiers.tierkit import assert_kv_correct, compute, make_tiered, prefill, seq

TOKENS = seq(100, 13)  # three full pages and one token to compute


def _stored_then_reopened(path: Path) -> RadixCache:
    """A cache whose only copy of TOKENS' three pages is in storage."""
    cache = make_tiered(device_pages=8, host_pages=16, storage=path)
    cache.release(prefill(cache, TOKENS))
    cache.drain()
    cache.close()
    return make_tiered(device_pages=8, host_pages=16, storage=path)


def _manual(cache: RadixCache) -> tuple[ManualCopyEngine, ManualStorage]:
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers) and cache.kv is not None
    tiers.controller.copy.close()
    engine = ManualCopyEngine(cache.kv, tiers.host.buffer)
    tiers.controller.copy = engine  # type: ignore[assignment]
    storage = ManualStorage(tiers.controller.storage)
    tiers.controller.storage = storage  # type: ignore[assignment]
    return engine, storage


def _short_fetch(cache: RadixCache, storage: ManualStorage, engine: ManualCopyEngine) -> Request:
    """Admit TOKENS; its fetch of three pages returns one; the chained load is held."""
    req = cache.admit(TOKENS)
    assert [kind for kind, _, _ in storage.pending] == ["get"]
    storage.complete(storage.pending[0][2], "short", short=1)
    cache.poll()
    assert len(engine.pending) == 1 and len(req.pending) == 1  # the load of the one page
    assert req.num_pages == 3 and req.shared_pages == 1  # pages 2-3 are its own to compute
    cache.check_integrity()
    return req


def _free(cache: RadixCache) -> int:
    return cache.pool.free_count


@pytest.mark.parametrize("how", ["load_fails", "abandoned", "released"])
def test_pages_after_a_short_fetch_go_back_when_the_load_is_given_up(
    tmp_path: Path, how: str
) -> None:
    cache = _stored_then_reopened(tmp_path / "s")
    engine, storage = _manual(cache)
    req = _short_fetch(cache, storage, engine)
    if how == "load_fails":
        engine.complete(engine.pending[0][2], fail=True)
        cache.poll()
        assert not req.pending and req.num_pages == 0
    elif how == "abandoned":
        cache.tiers.prefetch = make_prefetch_policy("best_effort")  # type: ignore[attr-defined]
        cache.reserve(req, 0)  # resolves: the load is still in flight, so it is given up
        assert not req.pending and req.num_pages == 0
        assert len(engine.pending) == 1  # the given-up load still writes its page
    else:
        cache.release(req)
    cache.check_integrity()  # before the fix: "pool accounting: 2 allocated, 0 owned"
    engine.close()
    cache.drain()
    cache.check_integrity()
    if how != "released":
        compute(cache, req, TOKENS.size - req.num_computed)
        assert_kv_correct(cache, req)
        cache.release(req)
    cache.drain()
    cache.check_integrity()
    # Nothing leaked: everything not cached in the tree is free again.
    assert _free(cache) + cache.tree.device_pages == cache.pool.capacity
    cache.close()


# ------------------------------------------------- a hit-path backup vs the load
def test_a_backup_on_hit_does_not_evict_the_host_pages_the_request_loads() -> None:
    """The device part of a hit earns a host copy (``write_through_selective``)
    while the host pool is full: making room must not drop the host-only pages
    the same request is about to load back (they were its only copy; the load
    read freed pages, or found none and raised)."""
    from radixcache.offload import make_write_policy

    cache = make_tiered(device_pages=8, host_pages=2, write_policy="write_back")
    whole = seq(0, 17)  # pages 0-3
    other = np.concatenate([seq(0, 8), seq(500, 9)])  # shares pages 0-1, then its own
    cache.release(prefill(cache, whole))
    cache.release(prefill(cache, other))  # splits: pages 0-1, then two leaves
    assert cache.evict(2) == 2  # the older leaf goes to the host (write-back): pool full
    cache.drain()
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    assert tiers.host.free_count == 0
    tiers.write = make_write_policy("write_through_selective", threshold=1)
    req = cache.admit(whole)  # device hit on pages 0-1 (backed up now), host hit on 2-3
    assert req.hit_host == 8
    compute(cache, req, whole.size - req.num_computed)
    assert_kv_correct(cache, req)
    cache.release(req)
    cache.drain()
    cache.check_integrity()
    again = cache.admit(whole)
    assert again.cached_len == 16
    cache.reserve(again, 1)
    assert_kv_correct(cache, again)
    cache.release(again)
    cache.check_integrity()
    cache.close()

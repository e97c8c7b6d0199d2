"""Host and storage tiers through the cache: policies, load-back, failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixcache.tiers import HostTiers
from tests.radixcache.tiers.tierkit import (
    P,
    assert_kv_correct,
    make_tiered,
    prefill,
    residency,
)
from radixcache.transfer.engine import CpuCopyEngine


def seq(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def tiers(cache: object) -> HostTiers:
    t = getattr(cache, "tiers")
    assert isinstance(t, HostTiers)
    return t


def test_write_through_backs_up_on_insert_and_loads_back() -> None:
    cache = make_tiered()
    req = prefill(cache, seq(0, 9))
    cache.release(req)
    assert residency(cache) == [(8, True, False, False)]  # copy in flight
    tiers(cache).drain()
    assert residency(cache) == [(8, True, True, False)]
    cache.check_integrity()
    assert cache.evict(8) == 2  # device copy dropped, host copy stays
    assert residency(cache) == [(8, False, True, False)]
    cache.check_integrity()
    again = cache.admit(seq(0, 9))  # host hit: load-back starts
    assert again.cached_len == 8 and not again.ready
    cache.check_integrity()
    cache.reserve(again, 1)  # resolves (wait_complete): pages are back
    assert again.ready and again.cached_len == 8
    assert residency(cache) == [(8, True, True, False)]
    assert_kv_correct(cache, again)
    assert tiers(cache).counters.loaded_tokens == 8
    cache.check_integrity()
    cache.close()


def test_write_through_selective_waits_for_hits() -> None:
    cache = make_tiered(write_policy="write_through_selective", threshold=2)
    cache.release(prefill(cache, seq(0, 9)))
    tiers(cache).drain()
    assert residency(cache) == [(8, True, False, False)]
    cache.release(cache.admit(seq(0, 9)))  # hit 1
    tiers(cache).drain()
    assert residency(cache) == [(8, True, False, False)]
    cache.release(cache.admit(seq(0, 9)))  # hit 2: earns a host copy
    tiers(cache).drain()
    assert residency(cache) == [(8, True, True, False)]
    cache.check_integrity()
    cache.close()


def test_write_back_copies_only_on_eviction() -> None:
    cache = make_tiered(write_policy="write_back")
    cache.release(prefill(cache, seq(0, 9)))
    tiers(cache).drain()
    assert residency(cache) == [(8, True, False, False)]
    assert cache.evict(2) == 2  # backed up (synchronously), then dropped
    assert residency(cache) == [(8, False, True, False)]
    req = cache.admit(seq(0, 9))
    cache.reserve(req, 1)
    assert req.cached_len == 8
    assert_kv_correct(cache, req)
    cache.check_integrity()
    cache.close()


def test_device_eviction_without_host_copy_removes_node() -> None:
    cache = make_tiered(write_policy="write_through_selective", threshold=5)
    cache.release(prefill(cache, seq(0, 9)))
    assert cache.evict(2) == 2
    assert residency(cache) == []
    cache.check_integrity()
    cache.close()


def test_host_eviction_makes_room_lru() -> None:
    cache = make_tiered(device_pages=8, host_pages=4)
    for start in (0, 100, 200):  # 2 pages each; the host holds two nodes
        cache.release(prefill(cache, seq(start, 9)))
        tiers(cache).drain()
        cache.evict(2)
        cache.check_integrity()
    assert tiers(cache).counters.host_evicted_pages == 2
    assert cache.admit(seq(0, 9)).cached_len == 0  # the oldest went
    assert cache.admit(seq(200, 9)).cached_len == 8
    cache.check_integrity()
    cache.close()


def test_failed_load_back_degrades_to_recompute() -> None:
    cache = make_tiered()
    cache.release(prefill(cache, seq(0, 9)))
    tiers(cache).drain()
    cache.evict(8)
    t = tiers(cache)
    t.controller.copy.close()

    def fail(request: object) -> None:
        raise RuntimeError("injected copy failure")

    assert cache.kv is not None
    t.controller.copy = CpuCopyEngine(cache.kv, t.host.buffer, before_copy=fail)
    req = cache.admit(seq(0, 9))
    assert req.cached_len == 8
    cache.reserve(req, 9)  # the load failed: the request recomputes everything
    assert req.cached_len == 0 and req.num_computed == 0 and req.ready
    assert t.counters.failed_jobs == 1 and t.counters.abandoned_tokens == 8
    cache.check_integrity()
    from tests.radixcache.tiers.tierkit import compute

    compute(cache, req, 9)
    assert_kv_correct(cache, req)
    cache.check_integrity()
    cache.close()


def test_best_effort_gives_up_on_what_has_not_arrived() -> None:
    import threading

    gate = threading.Event()
    cache = make_tiered(prefetch="best_effort")
    cache.release(prefill(cache, seq(0, 9)))
    tiers(cache).drain()
    cache.evict(8)
    t = tiers(cache)
    t.controller.copy.close()
    assert cache.kv is not None
    t.controller.copy = CpuCopyEngine(
        cache.kv, t.host.buffer, before_copy=lambda request: gate.wait(5)
    )
    req = cache.admit(seq(0, 9))
    cache.reserve(req, 9)  # nothing arrived yet: recompute
    assert req.cached_len == 0 and req.ready
    gate.set()
    t.drain()  # the load still lands in the tree for later requests
    assert residency(cache) == [(8, True, True, False)]
    cache.check_integrity()
    from tests.radixcache.tiers.tierkit import compute

    compute(cache, req, 9)
    assert_kv_correct(cache, req)
    cache.release(req)
    later = cache.admit(seq(0, 9))
    assert later.cached_len == 8 and later.ready
    assert_kv_correct(cache, later)
    cache.check_integrity()
    cache.close()


def test_round_trip_device_host_lmdb_host_device(tmp_path: Path) -> None:
    first = make_tiered(storage=tmp_path / "store")
    prompt = seq(0, 4 * P + 1)
    first.release(prefill(first, prompt))
    tiers(first).drain()
    assert residency(first) == [(16, True, True, True)]
    first.close()
    # A new cache (as after a restart) on the same directory: a storage hit.
    second = make_tiered(storage=tmp_path / "store")
    req = second.admit(prompt)
    assert req.cached_len == 16 and not req.ready
    second.reserve(req, 1)
    assert req.ready and req.cached_len == 16
    assert_kv_correct(second, req)
    assert residency(second) == [(16, True, True, True)]
    assert tiers(second).counters.storage_hit_tokens == 16
    second.check_integrity()
    second.close()


def test_storage_under_another_model_never_hits(tmp_path: Path) -> None:
    from radixcache.offload import HostPoolConfig, StorageConfig
    from radixcache import CacheConfig, RadixCache
    from radixcache.tiers import TierConfig
    from tests.radixcache.tiers.tierkit import SPEC

    first = make_tiered(storage=tmp_path / "s")
    first.release(prefill(first, seq(0, 9)))
    first.close()
    other = RadixCache(
        CacheConfig(
            spec=SPEC,
            device_pages=8,
            tiers=TierConfig(
                host=HostPoolConfig(pages=8),
                storage=StorageConfig(path=tmp_path / "s", capacity_bytes=1 << 20),
                model_id="another-model",
            ),
        )
    )
    assert other.admit(seq(0, 9)).cached_len == 0
    other.close()


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_every_policy_writes_complete_host_copies_to_storage(tmp_path: Path, policy: str) -> None:
    cache = make_tiered(write_policy=policy, threshold=1, storage=tmp_path / policy)
    cache.release(prefill(cache, seq(0, 9)))
    cache.release(cache.admit(seq(0, 9)))  # one hit, for the selective policy
    tiers(cache).drain()
    cache.evict(8)  # write_back copies here
    tiers(cache).drain()
    assert residency(cache) == [(8, False, True, True)]
    cache.check_integrity()
    cache.close()


def _flip_every_record(path: Path, offset: int) -> int:
    """Flip one byte of every stored page record, with a raw LMDB write."""
    import lmdb

    env = lmdb.open(str(path), max_dbs=3)
    flipped = 0
    try:
        db = env.open_db(b"pages")
        with env.begin(write=True, db=db) as txn:
            for key, value in list(txn.cursor()):
                out = bytearray(value)
                out[offset] ^= 0x40
                txn.put(key, bytes(out))
                flipped += 1
    finally:
        env.close()
    return flipped


@pytest.mark.parametrize("offset", [-1, 48 + 2], ids=["kv-byte", "token-byte"])
def test_corrupt_record_is_a_miss_and_is_recomputed(tmp_path: Path, offset: int) -> None:
    store = tmp_path / "store"
    first = make_tiered(storage=store)
    prompt = seq(0, 2 * P + 1)
    first.release(prefill(first, prompt))
    tiers(first).drain()
    first.close()
    assert _flip_every_record(store, offset) == 2
    second = make_tiered(storage=store)
    req = second.admit(prompt)
    assert req.cached_len == 8  # the index says stored ...
    second.reserve(req, 9)  # ... but verification rejects it: recompute
    assert req.cached_len == 0 and req.ready
    stats = tiers(second).controller.storage.stats()
    assert stats.corrupt == 1 and stats.hits == 0  # reading stops at the first bad page
    from tests.radixcache.tiers.tierkit import compute

    compute(second, req, 9)
    assert_kv_correct(second, req)
    second.check_integrity()
    second.close()


def test_unwritable_storage_directory_disables_the_tier_or_fails_clearly_in_strict_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from radixcache.offload import StorageOpenError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageOpenError, match="file"):
        make_tiered(storage=blocker / "store", on_open_error="strict")
    caplog.clear()
    cache = make_tiered(storage=blocker / "store")  # the engine comes up without storage
    stats = cache.tier_stats()
    assert stats is not None and stats.storage_state == "disabled" and stats.storage is None
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "storage tier disabled" in warnings[0].getMessage()
    req = prefill(cache, seq(0, 9))
    cache.release(req)
    cache.drain()
    assert residency(cache) == [(8, True, True, False)]
    cache.check_integrity()
    cache.close()


def _two_chats() -> tuple[np.ndarray, np.ndarray]:
    system = seq(0, 4 * P)
    return (np.concatenate([system, seq(100, 2 * P)]), np.concatenate([system, seq(200, 2 * P)]))


def test_burst_admission_shares_a_prefix_being_loaded_back() -> None:
    a, b = _two_chats()
    cache = make_tiered(device_pages=32, host_pages=32)
    cache.release(prefill(cache, a))
    cache.release(prefill(cache, b))
    tiers(cache).drain()
    cache.evict(cache.stats().cached_pages)
    ra = cache.admit(np.append(a, 1))
    rb = cache.admit(np.append(b, 2))  # a's load of the shared system prompt is in flight
    assert (ra.hit_host, rb.hit_device, rb.hit_host) == (6 * P, 4 * P, 2 * P)
    cache.reserve(ra, 1)
    cache.reserve(rb, 1)
    assert_kv_correct(cache, ra)
    assert_kv_correct(cache, rb)
    cache.check_integrity()
    cache.close()


def test_concurrent_fetches_of_one_stored_prefix_both_keep_their_pages(tmp_path: Path) -> None:
    a, b = _two_chats()
    first = make_tiered(device_pages=32, host_pages=32, storage=tmp_path / "s")
    first.release(prefill(first, a))
    first.release(prefill(first, b))
    first.close()
    cache = make_tiered(device_pages=32, host_pages=32, storage=tmp_path / "s")
    ra = cache.admit(np.append(a, 1))
    rb = cache.admit(np.append(b, 2))  # both fetch the shared system prompt
    cache.reserve(ra, 1)
    cache.reserve(rb, 1)
    assert (ra.num_computed, rb.num_computed) == (6 * P, 6 * P)
    assert tiers(cache).counters.abandoned_tokens == 0
    assert_kv_correct(cache, ra)
    assert_kv_correct(cache, rb)
    cache.check_integrity()
    from tests.radixcache.tiers.tierkit import compute

    compute(cache, ra, 1)
    compute(cache, rb, 1)  # b's private copy of the shared pages is deduplicated
    assert cache.stats().duplicate_pages >= 4
    cache.check_integrity()
    cache.close()

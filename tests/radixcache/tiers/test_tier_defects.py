"""Tier-job behaviours under overlapping requests, forgotten namespaces and a
store that changes under a read. Jobs are held in flight deterministically
with a gated copy engine (the CPU engine's ``before_copy`` seam) and a gated
storage backend (a real LMDB store whose reads or writes wait for a gate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixcache import Namespace, OutOfPagesError
from radixcache.transfer.host import HostKVBuffer
from tests.radixcache.tiers.tierkit import (
    P,
    SPEC,
    assert_kv_correct,
    compute,
    gate_copies,
    gate_storage,
    make_tiered,
    page_record_keys,
    prefill,
    residency,
    rewrite_record,
    seq,
)

NS = Namespace()
TENANT = Namespace(salt="tenant")


def _stored_prompt(store: Path, pages: int) -> tuple[np.ndarray, list[bytes], int]:
    """A prompt of ``pages`` whole pages (+1 token) stored by a first cache;
    returns it, its page keys and the bytes of one record."""
    first = make_tiered(device_pages=2 * pages + 4, host_pages=2 * pages + 4, storage=store)
    prompt = seq(0, pages * P + 1)
    first.release(prefill(first, prompt))
    first.tiers.drain()  # type: ignore[attr-defined]
    keys = page_record_keys(first, prompt)
    stats = first.tiers.controller.storage.stats()  # type: ignore[attr-defined]
    assert stats.records == pages
    first.close()
    return prompt, keys, stats.stored_bytes // pages


def _finish_request(cache: object, req: object) -> None:
    compute(cache, req, req.num_tokens - req.num_computed)  # type: ignore[arg-type, attr-defined]
    assert_kv_correct(cache, req)  # type: ignore[arg-type]
    cache.check_integrity()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- 1: short fetch
def test_a_corrupt_record_in_the_middle_of_a_stored_prefix_is_a_short_fetch(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    prompt, keys, _ = _stored_prompt(store, 10)

    def flip_last_byte(value: bytes) -> bytes:
        return value[:-1] + bytes([value[-1] ^ 0x40])

    rewrite_record(store, keys[3], flip_last_byte)  # page 3 of 10
    cache = make_tiered(device_pages=24, host_pages=24, storage=store)
    req = cache.admit(prompt)
    assert req.hit_storage == 10 * P  # the index still lists all ten
    cache.reserve(req, 1)  # the read stops at page 3: three pages served
    assert req.ready and req.cached_len == 3 * P
    assert_kv_correct(cache, req)
    cache.check_integrity()
    _finish_request(cache, req)
    cache.release(req)
    cache.tiers.drain()  # type: ignore[attr-defined]
    cache.check_integrity()
    cache.close()


def test_a_record_evicted_between_lookup_and_read_is_a_short_fetch(tmp_path: Path) -> None:
    store = tmp_path / "s"
    prompt, keys, record = _stored_prompt(store, 10)
    from radixcache.offload import StorageConfig

    cache = make_tiered(device_pages=24, host_pages=24, storage=store)
    storage = cache.tiers.controller.storage  # type: ignore[attr-defined]
    cache.tiers.controller.storage.close()  # type: ignore[attr-defined]
    # Reopen with room for 12 records: five more evict the least recently used.
    from radixcache.offload import LmdbStorage

    inner = LmdbStorage(
        StorageConfig(path=store, capacity_bytes=12 * record), SPEC, storage.fingerprint
    )
    cache.tiers.controller.storage = inner  # type: ignore[attr-defined]
    gated = gate_storage(cache)
    req = cache.admit(prompt)  # lookup: ten pages; the read waits for the gate
    assert req.hit_storage == 10 * P
    # Meanwhile: pages 0-2 are read (most recent now), five new records come in.
    side = HostKVBuffer(SPEC, 16)
    tokens = prompt[: 10 * P].reshape(10, P)
    assert inner.get(keys[:3], tokens[:3], side, np.arange(3, dtype=np.int32)).wait(10)
    filler = [bytes([200 + i]) * 16 for i in range(5)]
    put = inner.put(filler, tokens[:5] + 1000, side, np.arange(5, dtype=np.int32), b"other")
    assert put.wait(10) and put.result() == 5
    assert inner.longest_prefix(keys) == 3  # pages 3, 4 and 5 were evicted
    gated.gate.set()
    cache.reserve(req, 1)
    assert req.ready and req.cached_len == 3 * P
    assert_kv_correct(cache, req)
    cache.check_integrity()
    _finish_request(cache, req)
    cache.release(req)
    cache.tiers.drain()  # type: ignore[attr-defined]
    cache.check_integrity()
    cache.close()


# ---------------------------------------------------------------- 3: best_effort
def test_best_effort_allocation_counts_pages_freed_by_abandoned_fetches(tmp_path: Path) -> None:
    store = tmp_path / "s"
    prompt, _, _ = _stored_prompt(store, 4)
    cache = make_tiered(device_pages=8, host_pages=8, prefetch="best_effort", storage=store)
    gated = gate_storage(cache)
    req = cache.admit(prompt)
    assert req.hit_storage == 4 * P
    cache.reserve(req, 0)  # best effort: nothing arrived, the request recomputes
    assert req.cached_len == 0 and req.num_pages == 0
    gated.gate.set()
    for move in cache.tiers.controller.jobs():  # type: ignore[attr-defined]
        assert move.ticket.wait(10)  # done, not applied yet: still holds 4 device pages
    assert cache.pool.free_count == 4
    cache.reserve(req, prompt.size)  # needs 5 pages: the fetch's 4 come back first
    _finish_request(cache, req)
    cache.release(req)
    cache.close()


# ---------------------------------------------------------------- 4, 5, 6: forget
def test_forgotten_pages_a_request_holds_are_never_served_again() -> None:
    cache = make_tiered()
    holder = prefill(cache, seq(0, 9), TENANT)
    assert cache.forget_namespace(TENANT) == 2  # held: they stay until released
    again = cache.admit(seq(0, 9), TENANT)
    assert again.cached_len == 0
    _finish_request(cache, again)
    cache.release(again)
    cache.release(holder)
    cache.tiers.drain()  # type: ignore[attr-defined]
    cache.poll()
    cache.check_integrity()
    cache.close()


def test_a_pending_forget_leaves_pages_cached_after_it_alone() -> None:
    cache = make_tiered(device_pages=16, host_pages=16, write_policy="write_back")
    holder = prefill(cache, seq(0, 9), TENANT)
    cache.forget_namespace(TENANT)
    cache.release(prefill(cache, seq(100, 9), TENANT))  # cached after the forget
    cache.release(prefill(cache, seq(200, 9), TENANT))  # an unrelated release in the tenant
    later = cache.admit(seq(100, 9), TENANT)
    assert later.cached_len == 8
    assert_kv_correct(cache, later)
    cache.release(later)
    cache.release(holder)
    cache.check_integrity()
    cache.close()


def _host_only(cache: object, ns: Namespace) -> None:
    cache.release(prefill(cache, seq(0, 9), ns))  # type: ignore[arg-type]
    cache.tiers.drain()  # type: ignore[attr-defined]
    cache.evict(8)  # type: ignore[attr-defined]
    assert residency(cache) == [(8, False, True, False)]  # type: ignore[arg-type]


def _nothing_of(cache: object, ns: Namespace) -> None:
    cache.tiers.drain()  # type: ignore[attr-defined]
    cache.poll()  # type: ignore[attr-defined]
    left = [n for n in cache.tree.nodes() if n.namespace == ns]  # type: ignore[attr-defined]
    assert left == [], f"{ns} keeps {left} after its forget"
    assert cache.admit(seq(0, 9), ns).cached_len == 0  # type: ignore[attr-defined]
    cache.check_integrity()  # type: ignore[attr-defined]


@pytest.mark.parametrize("released_first", [False, True], ids=["live", "released"])
def test_a_load_in_flight_for_a_forgotten_namespace_lands_nowhere(released_first: bool) -> None:
    cache = make_tiered()
    _host_only(cache, TENANT)
    gate = gate_copies(cache)
    loader = cache.admit(seq(0, 9), TENANT)
    assert loader.hit_host == 8 and not loader.ready
    if released_first:
        cache.release(loader)
    cache.forget_namespace(TENANT)
    gate.set()  # type: ignore[attr-defined]
    if not released_first:
        cache.reserve(loader, 1)
        assert_kv_correct(cache, loader)  # admitted before the forget: it may use them
        cache.release(loader)
    _nothing_of(cache, TENANT)
    cache.close()


def test_a_fetch_in_flight_for_a_forgotten_namespace_lands_nowhere(tmp_path: Path) -> None:
    store = tmp_path / "s"
    first = make_tiered(storage=store)
    first.release(prefill(first, seq(0, 9), TENANT))
    first.close()
    cache = make_tiered(storage=store)
    gated = gate_storage(cache)
    fetcher = cache.admit(seq(0, 9), TENANT)
    assert fetcher.hit_storage == 8
    cache.forget_namespace(TENANT)
    gated.gate.set()
    cache.reserve(fetcher, 1)
    cache.release(fetcher)
    _nothing_of(cache, TENANT)
    cache.close()


# ---------------------------------------------------------------- 7: store vs load
def test_a_store_in_flight_does_not_block_loading_its_pages_back(tmp_path: Path) -> None:
    cache = make_tiered(write_policy="write_back", storage=tmp_path / "s")
    gated = gate_storage(cache, gate_puts=True)
    cache.release(prefill(cache, seq(0, 9)))
    assert cache.evict(8) == 2  # backed up (synchronously), device pages dropped
    cache.poll()  # its storage write starts, and waits for the gate
    assert cache.tiers.controller.in_flight == 1  # type: ignore[attr-defined]
    req = cache.admit(seq(0, 13))
    assert req.cached_len == 8 and req.hit_host == 8  # served from host meanwhile
    cache.reserve(req, 1)
    assert_kv_correct(cache, req)
    _finish_request(cache, req)  # its recomputed-free commit caches the next page
    cache.release(req)
    assert cache.admit(seq(0, 13)).cached_len == 12
    gated.gate.set()
    cache.tiers.drain()  # type: ignore[attr-defined]
    cache.check_integrity()
    cache.close()


# ---------------------------------------------------------------- 8: failed allocation
def test_a_reserve_that_cannot_succeed_changes_nothing() -> None:
    cache = make_tiered(device_pages=8, host_pages=16, write_policy="write_through_selective")
    cache.release(prefill(cache, seq(0, 9)))
    cache.release(prefill(cache, seq(100, 9)))
    before = residency(cache)
    stats = cache.stats()
    assert stats.cached_pages == 4 and stats.evictable_pages == 4
    req = cache.admit(seq(500, 3))
    with pytest.raises(OutOfPagesError) as err:
        cache.reserve(req, 40)  # ten pages: more than free plus evictable
    assert (err.value.requested, err.value.free, err.value.evictable) == (10, 4, 4)
    assert residency(cache) == before and cache.stats().evicted_pages == 0
    cache.release(req)
    cache.check_integrity()
    cache.close()


# ---------------------------------------------------------------- 9: bad input
def test_forget_namespace_of_a_non_namespace_is_a_type_error() -> None:
    cache = make_tiered()
    with pytest.raises(TypeError, match="namespace must be a Namespace, got str"):
        cache.forget_namespace("not-a-namespace")  # type: ignore[arg-type]
    cache.close()


# ---------------------------------------------------------------- 2: wrong tenant
def test_a_record_moved_under_another_tenants_key_is_refused(tmp_path: Path) -> None:
    import lmdb

    from radixcache.keys.hashing import chain_keys, split_keys

    store = tmp_path / "s"
    tenant_a, tenant_b = Namespace(salt="tenant-a"), Namespace(salt="tenant-b")
    first = make_tiered(storage=store)
    prompt = seq(0, 2 * P + 1)
    first.release(prefill(first, prompt, tenant_a))
    first.close()
    keys_a = split_keys(chain_keys(tenant_a.digest(), prompt[: 2 * P], P))
    keys_b = split_keys(chain_keys(tenant_b.digest(), prompt[: 2 * P], P))
    env = lmdb.open(str(store), max_dbs=4)
    try:  # copy tenant A's records, byte for byte, under tenant B's keys
        db = env.open_db(b"pages")
        with env.begin(write=True, db=db) as txn:
            for key_a, key_b in zip(keys_a, keys_b):
                (rkey,) = [bytes(k) for k, _ in txn.cursor() if bytes(k).endswith(key_a)]
                txn.put(rkey[: -len(key_a)] + key_b, bytes(txn.get(rkey)))
    finally:
        env.close()
    # Restart 1: both keys are listed, the first read is refused (and deleted).
    # Restart 2: tenant B's own page 0 (stored by restart 1) is served; the moved
    # page 1, which that store left alone (a put skips keys already stored), is
    # refused again.
    for restart, served in ((1, 0), (2, 1)):
        cache = make_tiered(storage=store)
        req = cache.admit(prompt, tenant_b)
        assert req.hit_storage == 2 * P  # looked up: the keys exist
        cache.reserve(req, 1)  # read, verified, refused
        assert req.ready and req.cached_len == served * P, restart
        stats = cache.tiers.controller.storage.stats()  # type: ignore[attr-defined]
        assert (stats.hits, stats.corrupt) == (served, 1), restart
        assert_kv_correct(cache, req)
        _finish_request(cache, req)
        cache.release(req)
        cache.tiers.drain()  # type: ignore[attr-defined]
        cache.close()
    check = make_tiered(storage=store)  # tenant A's own records are still served
    own = check.admit(prompt, tenant_a)
    check.reserve(own, 1)
    assert own.cached_len == 8
    assert_kv_correct(check, own)
    check.close()


# ---------------------------------------------------------------- 10: damaged store
def test_a_damaged_store_is_moved_aside_and_a_fresh_one_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    from radixcache.offload import StorageOpenError

    store = tmp_path / "s"
    first = make_tiered(storage=store)
    for i in range(5):
        first.release(prefill(first, seq(100 * i, 9)))
    first.close()
    with open(store / "data.mdb", "r+b") as f:  # B-tree pages overwritten
        f.seek(2 * 4096)
        f.write(np.random.default_rng(0).bytes(4 * 4096))
    with pytest.raises(StorageOpenError, match="cannot open the LMDB store"):
        make_tiered(storage=store, on_open_error="strict")
    caplog.clear()
    cache = make_tiered(storage=store)  # comes up, on a fresh store
    stats = cache.tier_stats()
    assert stats is not None and stats.storage_state == "recovered"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "damaged" in warnings[0] and "fresh" in warnings[0]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("s.damaged-")]
    assert len(aside) == 1 and os.path.getsize(aside[0] / "data.mdb") > 0  # kept, not deleted
    req = prefill(cache, seq(0, 9))  # the fresh store works
    cache.release(req)
    cache.drain()
    assert residency(cache) == [(8, True, True, True)]
    from radixcache.metrics import snapshot

    assert snapshot(cache)["storage_state"] == 1.0
    cache.close()


# ---------------------------------------------------------------- holds in check_integrity
def test_check_integrity_checks_every_nodes_holds_against_the_live_jobs(tmp_path: Path) -> None:
    cache = make_tiered(storage=tmp_path / "s")
    gated = gate_storage(cache, gate_puts=True)
    cache.release(prefill(cache, seq(0, 9)))
    for move in cache.tiers.controller.jobs():  # type: ignore[attr-defined]
        if move.kind.value == "device_to_host":
            move.ticket.wait(10)
    cache.poll()  # the backup landed; its store waits for the gate
    (node,) = list(cache.tree.nodes())
    assert node.holds == 1 and node.loading == 0  # the store's
    cache.check_integrity()
    node.holds += 1  # a hold no job accounts for
    with pytest.raises(AssertionError, match="holds"):
        cache.check_integrity()
    node.holds -= 1
    node.loading += 1  # a load mark without a load
    with pytest.raises(AssertionError, match="holds/loading"):
        cache.check_integrity()
    node.loading -= 1
    gated.gate.set()
    cache.drain()
    assert node.holds == 0
    cache.check_integrity()
    cache.close()


def test_a_store_in_flight_when_its_namespace_is_forgotten_leaves_no_record(
    tmp_path: Path,
) -> None:
    import threading

    cache = make_tiered(storage=tmp_path / "s")
    gated = gate_storage(cache, gate_puts=True)
    cache.release(prefill(cache, seq(0, 9), TENANT))
    for move in cache.tiers.controller.jobs():  # type: ignore[attr-defined]
        move.ticket.wait(10)  # the backup
    cache.poll()  # its store starts and waits for the gate
    assert cache.tiers.controller.in_flight == 1  # type: ignore[attr-defined]
    threading.Timer(0.2, gated.gate.set).start()  # the write goes through later
    cache.forget_namespace(TENANT)
    for move in cache.tiers.controller.jobs():  # type: ignore[attr-defined]
        assert move.ticket.wait(10)  # the write is done (not polled yet)
    again = cache.admit(seq(0, 9), TENANT)  # looks storage up before any poll
    assert again.cached_len == 0 and again.hit_storage == 0
    cache.release(again)
    cache.drain()
    storage = cache.tiers.controller.storage  # type: ignore[attr-defined]
    assert storage.stats().records == 0
    cache.check_integrity()
    cache.close()

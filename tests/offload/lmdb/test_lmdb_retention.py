"""Retention deadlines on the LMDB store: served before, a miss after, swept
in deadline order, reported, counted, released from the quotas, durable."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache.offload import LmdbStorage, StorageConfig
from radixcache.offload.lmdb import writer as lmdb_writer
from radixcache.offload.lmdb.retention import Deadlines
from radixcache.offload.storage import PutMeta
from tests.offload.storekit import RECORD_BYTES as R

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

A, B = b"tenant-a", b"tenant-b"
T0 = 1_000_000.0


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def put(kit: StoreKit, store: LmdbStorage, keys: list[bytes], ns: bytes, *,
        expires_at: float | None = None, tags: tuple[str, ...] = (),
        tenant: bytes | None = None, start: int = 0) -> int:
    """Put pages for ``keys`` under namespace ``ns``; returns the pages stored."""
    n = len(keys)
    meta = PutMeta(list(range(start, start + n)), None, start, expires_at=expires_at, tags=tags)
    ticket = store.put(keys, kit.tokens(n, start), kit.host(n), np.arange(n, dtype=np.int32), ns,
                       meta=meta, tenant=tenant)
    return int(kit.done(ticket))


def get(kit: StoreKit, store: LmdbStorage, keys: list[bytes], start: int = 0) -> int:
    n = len(keys)
    host = kit.host(max(n, 1), seed=1)
    return int(kit.done(store.get(keys, kit.tokens(n, start), host, np.arange(n, dtype=np.int32))))


def test_served_before_the_deadline_a_miss_after_removed_reported_counted(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock, tenant_quotas={A: (10 * R, 0)})
    dated, plain = kit.keys(3, b"dated"), kit.keys(2, b"plain")
    assert put(kit, store, dated, b"d", expires_at=T0 + 10, tenant=A) == 3
    assert put(kit, store, plain, b"p", tenant=B) == 2
    clock.now = T0 + 9.9
    assert store.longest_prefix(dated) == 3 and get(kit, store, dated) == 3
    assert store.tenant_stats()[A].stored_bytes == 3 * R
    clock.now = T0 + 10  # the deadline itself: expired
    assert store.longest_prefix(dated) == 0
    assert get(kit, store, dated) == 0  # a miss, and the read asked for a sweep
    kit.barrier(store)
    assert sorted(store.take_removed()) == sorted(dated)
    stats = store.stats()
    assert (stats.expired, stats.evicted, stats.deleted, stats.records) == (3, 0, 0, 2)
    tenants = store.tenant_stats()
    assert (tenants[A].records, tenants[A].stored_bytes, tenants[A].quota_evicted) == (0, 0, 0)
    assert tenants[B].records == 2 and get(kit, store, plain) == 2
    assert set(store.stored_keys()) == set(plain)
    store.check_integrity()


def test_a_read_stops_at_the_first_expired_page(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock)
    keys = kit.keys(4, b"chain")
    put(kit, store, keys[:2], b"ns")
    put(kit, store, keys[2:], b"ns", expires_at=T0 + 5, start=2)
    put(kit, store, keys[3:], b"ns", start=3)  # already stored: keeps its deadline
    assert store.longest_prefix(keys) == 4
    clock.now = T0 + 5
    assert store.longest_prefix(keys) == 2 and get(kit, store, keys) == 2
    assert store.read_tokens(keys[1:3])[1] is None  # not announced as a survivor either
    assert {m.key for m in store.scan()} == set(keys[:2])


def test_the_sweep_removes_expired_records_nobody_reads_in_deadline_order(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock)
    early, mid, late = kit.keys(2, b"early"), kit.keys(2, b"mid"), kit.keys(2, b"late")
    put(kit, store, late, b"late", expires_at=T0 + 30)
    put(kit, store, early, b"early", expires_at=T0 + 10)
    put(kit, store, mid, b"mid", expires_at=T0 + 20)
    store.take_removed()
    clock.now = T0 + 25
    assert put(kit, store, kit.keys(1, b"other"), b"other") == 1  # any write step sweeps first
    assert store.take_removed() == sorted(early) + sorted(mid)  # earliest deadline first
    assert store.stats().expired == 4
    clock.now = T0 + 31
    assert kit.done(store.sweep_expired()) == 2  # no write needed
    assert sorted(store.take_removed()) == sorted(late)
    assert kit.done(store.sweep_expired()) == 0
    store.check_integrity()


def test_a_sweep_is_bounded_per_step_and_the_rest_follows(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdb_writer, "SWEEP_MAX", 2)
    clock = FakeClock()
    store = kit.open(clock=clock)
    keys = kit.keys(5, b"many")
    put(kit, store, keys, b"many", expires_at=T0 + 1)
    clock.now = T0 + 2
    assert kit.done(store.sweep_expired()) == 2
    kit.barrier(store)  # the writer queued the next sweeps itself
    kit.barrier(store)
    kit.barrier(store)
    assert len(store.take_removed()) == 5 and store.stats().records == 0
    store.check_integrity()


def test_expired_bytes_make_room_before_anything_is_evicted(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock, capacity_bytes=4 * R)
    put(kit, store, kit.keys(2, b"keep"), b"keep")
    put(kit, store, kit.keys(2, b"old"), b"old", expires_at=T0 + 1)
    clock.now = T0 + 1
    assert put(kit, store, kit.keys(2, b"new"), b"new") == 2
    stats = store.stats()
    assert (stats.expired, stats.evicted, stats.records) == (2, 0, 4)
    store.check_integrity()


def test_a_put_already_past_its_deadline_writes_nothing(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock)
    keys = kit.keys(2, b"late")
    assert put(kit, store, keys, b"ns", expires_at=T0 - 1) == 0
    assert store.stats().records == 0 and store.longest_prefix(keys) == 0


def test_an_expired_record_put_again_is_written_with_its_new_deadline(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock)
    keys = kit.keys(2, b"again")
    put(kit, store, keys, b"ns", expires_at=T0 + 1)
    clock.now = T0 + 2
    assert put(kit, store, keys, b"ns", expires_at=T0 + 10) == 2  # swept, then written anew
    assert sorted(store.take_removed()) == sorted(keys) and store.stats().expired == 2
    assert store.longest_prefix(keys) == 2 and get(kit, store, keys) == 2
    clock.now = T0 + 10
    assert store.longest_prefix(keys) == 0
    store.check_integrity()


def test_deadlines_survive_a_restart(kit: StoreKit) -> None:
    clock = FakeClock()
    dated, plain = kit.keys(2, b"dated"), kit.keys(2, b"plain")
    store = kit.open("s", clock=clock)
    put(kit, store, dated, b"d", expires_at=T0 + 10)
    put(kit, store, plain, b"p")
    store.close()
    store = kit.open("s", clock=clock)
    store.check_integrity()
    assert store.longest_prefix(dated) == 2
    clock.now = T0 + 10
    assert store.longest_prefix(dated) == 0 and store.longest_prefix(plain) == 2
    assert {m.key for m in store.scan()} == set(plain)
    assert kit.done(store.sweep_expired()) == 2
    store.close()
    store = kit.open("s", clock=clock)  # and the removal was durable
    assert store.stats().records == 2 and store.longest_prefix(plain) == 2
    store.check_integrity()


def test_evicted_and_deleted_records_take_their_deadlines_with_them(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock, capacity_bytes=2 * R)
    keys = kit.keys(2, b"x")
    put(kit, store, keys, b"x", expires_at=T0 + 5)
    kit.done(store.delete(keys[:1]))
    put(kit, store, kit.keys(2, b"y"), b"y")  # evicts keys[1]
    store.check_integrity()  # no deadline left without its record
    assert kit.done(store.put(keys[:1], kit.tokens(1), kit.host(1), kit.ids(0), b"x")) == 1
    clock.now = T0 + 6
    assert store.longest_prefix(keys[:1]) == 1  # written again without a deadline
    assert store.stats().expired == 0


@pytest.mark.parametrize(
    ("meta", "error"),
    [
        (PutMeta([0], None, 0, expires_at=float("nan")), ValueError),
        (PutMeta([0], None, 0, expires_at="soon"), ValueError),  # type: ignore[arg-type]
        (PutMeta([0], None, 0, tags=("has space",)), ValueError),
        (PutMeta([0], None, 0, tags=("x" * 129,)), ValueError),
        (PutMeta([0], None, 0, tags=["list"]), TypeError),  # type: ignore[arg-type]
        (PutMeta([0], None, 0, tags=(7,)), TypeError),  # type: ignore[arg-type]
    ],
)
def test_bad_deadlines_and_tags_are_refused_at_the_call(
    kit: StoreKit, meta: PutMeta, error: type[Exception]
) -> None:
    store = kit.open()
    with pytest.raises(error, match="meta"):
        store.put(kit.keys(1), kit.tokens(1), kit.host(1), kit.ids(0), b"ns", meta=meta)
    assert store.stats().queued_writes == 0


def test_deadlines_index_sweeps_earliest_first_and_skips_stale_entries() -> None:
    d = Deadlines()
    d.load([(b"a", 5.0), (b"b", 1.0)])
    d.apply({b"c": 3.0}, [])
    d.apply({b"b": 9.0}, [b"b"])  # b removed, then stored again with a later deadline
    assert d.due(4.0, 10) == [b"c"]
    assert d.due(6.0, 1) == [b"c"]  # bounded; still listed until a commit removes it
    d.apply({}, [b"c"])
    assert d.due(6.0, 10) == [b"a"]
    assert d.expired(b"b", 8.9) is False and d.expired(b"b", 9.0) is True
    assert d.at(b"zz") is None and len(d) == 2


def test_the_timer_sweeps_an_idle_store(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock, sweep_interval_s=0.02)
    keys = kit.keys(2, b"idle")
    put(kit, store, keys, b"idle", expires_at=T0 + 1)
    clock.now = T0 + 1  # nothing is read or written from here on
    removed: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(removed) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        removed += store.take_removed()
    assert sorted(removed) == sorted(keys) and store.stats().expired == 2
    store.close()  # stops the timer first


def test_a_bad_sweep_interval_or_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="sweep_interval_s"):
        StorageConfig(sweep_interval_s=0)
    with pytest.raises(TypeError, match="clock"):
        StorageConfig(clock=5.0)  # type: ignore[arg-type]


def test_capacity_eviction_counts_floors_after_the_sweep(kit: StoreKit) -> None:
    clock = FakeClock()
    store = kit.open(clock=clock, capacity_bytes=4 * R, tenant_quotas={A: (None, 2 * R)})
    put(kit, store, kit.keys(1, b"a-dated"), b"a1", expires_at=T0 + 1, tenant=A)
    a_live = kit.keys(2, b"a-live")
    put(kit, store, a_live, b"a2", tenant=A)  # older than B's record
    b_old = kit.keys(1, b"b-old")
    put(kit, store, b_old, b"b1", tenant=B)
    store.take_removed()
    clock.now = T0 + 1
    assert put(kit, store, kit.keys(2, b"b-new"), b"b2", tenant=B) == 2
    assert store.longest_prefix(a_live) == 2  # A keeps its floor: B's own old record went
    assert store.longest_prefix(b_old) == 0
    assert (store.stats().expired, store.stats().evicted) == (1, 1)
    store.check_integrity()

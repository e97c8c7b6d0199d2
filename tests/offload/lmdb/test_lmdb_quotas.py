"""Per-tenant byte quotas of the LMDB store: limits, floors, dropped puts, restarts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from radixcache.offload import LmdbStorage, StorageConfig
from tests.offload.storekit import RECORD_BYTES as R

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

A, B = b"tenant-a", b"tenant-b"


def put(kit: StoreKit, store: LmdbStorage, n: int, salt: bytes, tenant: bytes | None,
        start: int = 0) -> tuple[int, list[bytes]]:
    """Put ``n`` fresh pages of ``tenant`` (keys from ``salt``, namespace = salt)."""
    keys = kit.keys(start + n, salt)[start:]
    host = kit.host(n)
    ticket = store.put(keys, kit.tokens(n, start), host, np.arange(n, dtype=np.int32), salt,
                       tenant=tenant)
    return kit.done(ticket), keys


def held(store: LmdbStorage, keys: list[bytes]) -> list[bytes]:
    return [k for k in keys if store.longest_prefix([k]) == 1]


def test_a_tenant_at_its_limit_evicts_its_own_oldest_records(kit: StoreKit) -> None:
    store = kit.open(tenant_quotas={A: (3 * R, 0)})
    _, b_keys = put(kit, store, 2, b"b", B)
    _, old = put(kit, store, 3, b"a", A)
    n, new = put(kit, store, 2, b"a", A, start=3)
    assert n == 2
    assert held(store, old) == old[2:] and held(store, new) == new
    assert held(store, b_keys) == b_keys  # another tenant's records are not touched
    assert store.take_removed() == old[:2]  # announced like any removal
    stats = store.tenant_stats()
    assert (stats[A].records, stats[A].stored_bytes) == (3, 3 * R)
    assert (stats[A].quota_evicted, stats[A].dropped_pages) == (2, 0)
    assert stats[A].limit_bytes == 3 * R and stats[B].limit_bytes is None
    assert store.stats().evicted == 2
    store.check_integrity()


def test_pages_over_the_limit_are_dropped_and_counted_never_raised(kit: StoreKit) -> None:
    store = kit.open(tenant_quotas={A: (2 * R, 0), None: (0, 0)})
    n, keys = put(kit, store, 4, b"a", A)
    assert n == 2 and held(store, keys) == keys[:2]  # the leading pages, as when full
    n0, _ = put(kit, store, 2, b"none", None)
    assert n0 == 0
    stats = store.tenant_stats()
    assert stats[A].dropped_pages == 2 and stats[None].dropped_pages == 2
    assert stats[None].records == 0
    n, again = put(kit, store, 1, b"b", B)  # others are unaffected
    assert n == 1
    store.check_integrity()


def test_capacity_eviction_never_takes_a_tenant_below_its_floor(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=6 * R, tenant_quotas={A: (None, 3 * R)})
    _, a_keys = put(kit, store, 4, b"a", A)
    n, b_keys = put(kit, store, 4, b"b", B)
    # 2 records must go: A gives one (down to its floor), the 4th page of B is dropped
    assert n == 3 and held(store, a_keys) == a_keys[1:]
    stats = store.tenant_stats()
    assert stats[A].stored_bytes == 3 * R and stats[B].dropped_pages == 1
    assert stats[A].quota_evicted == 0  # a capacity eviction, not a quota one
    # more pressure from B: only B's own records go now
    n, more = put(kit, store, 2, b"b", B, start=4)
    assert n == 2 and held(store, a_keys) == a_keys[1:]
    assert held(store, b_keys) == b_keys[2:3] and held(store, more) == more
    assert store.stats().stored_bytes <= 6 * R
    store.check_integrity()


def test_floors_hold_against_the_tenants_own_capacity_pressure(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=3 * R, tenant_quota_default=(None, 3 * R))
    put(kit, store, 3, b"a", A)
    n, _ = put(kit, store, 1, b"a", A, start=3)
    assert n == 0 and store.tenant_stats()[A].dropped_pages == 1
    store.check_integrity()


def test_per_tenant_totals_equal_a_recount_through_touch_delete_forget(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=10 * R, tenant_quotas={A: (4 * R, R)})
    _, a = put(kit, store, 5, b"a", A)
    _, b = put(kit, store, 4, b"b", B)
    _, c = put(kit, store, 3, b"c", None)
    kit.done(store.get(b[:2], kit.tokens(2), kit.host(2), kit.ids(0, 1)))  # touched
    kit.done(store.delete([c[0]]))
    kit.done(store.forget_namespace(b"b"))
    store.check_integrity()  # recounts every record's size per tenant against the index
    stats = store.tenant_stats()
    assert sum(s.stored_bytes for s in stats.values()) == store.stats().stored_bytes
    # A: 4 of its 5 pages fit its limit; then capacity (11 > 10 records) took its oldest
    assert stats[A].dropped_pages == 1 and stats[A].records == 3
    assert stats[B].records == 0 and stats[None].records == 2


def test_a_restart_rebuilds_the_same_totals_and_keeps_enforcing(kit: StoreKit) -> None:
    quotas: dict[Any, Any] = {A: (3 * R, 0), B: (None, 2 * R)}
    store = kit.open(capacity_bytes=8 * R, tenant_quotas=quotas)
    put(kit, store, 3, b"a", A)
    put(kit, store, 2, b"a2", A, start=3)  # a second namespace of the same tenant
    put(kit, store, 3, b"b", B)
    put(kit, store, 1, b"none", None)
    before = {t: (s.records, s.stored_bytes) for t, s in store.tenant_stats().items()}
    totals = store._index.tenant_totals()
    store.close()
    again = kit.open(capacity_bytes=8 * R, tenant_quotas=quotas)
    assert again._index.tenant_totals() == totals
    after = {t: (s.records, s.stored_bytes) for t, s in again.tenant_stats().items()}
    assert {t: after[t] for t in (A, B)} == {t: before[t] for t in (A, B)}
    assert after[A] == (3, 3 * R)
    n, new = put(kit, again, 1, b"a", A, start=10)
    assert n == 1 and again.tenant_stats()[A].quota_evicted == 1  # its own oldest went
    assert again.tenant_stats()[A].stored_bytes == 3 * R
    again.check_integrity()


def test_the_data_file_holds_no_tenant(kit: StoreKit) -> None:
    store = kit.open(tenant_quotas={b"secret-salt-xyz": (None, 0)})
    put(kit, store, 1, b"n", b"secret-salt-xyz")
    store.close()
    assert b"secret-salt-xyz" not in (kit.root / "store" / "data.mdb").read_bytes()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tenant_quotas": [(A, (1, 0))]}, "tenant_quotas must be a mapping"),
        ({"tenant_quotas": {"a": (1, 0)}}, "a tenant must be bytes or None"),
        ({"tenant_quotas": {A: 5}}, "must be a pair"),
        ({"tenant_quotas": {A: (-1, 0)}}, "limit must be a non-negative int or None"),
        ({"tenant_quotas": {A: (None, -1)}}, "floor must be a non-negative int"),
        ({"tenant_quotas": {A: (10, 11)}}, "floor 11 B is above the limit 10 B"),
        ({"tenant_quotas": {A: (True, 0)}}, "limit must be"),
        ({"tenant_quota_default": (None, 1.5)}, "tenant_quota_default: the floor"),
    ],
)
def test_bad_quota_config_is_refused_by_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        StorageConfig(**kwargs)


def test_a_bad_tenant_is_not_shown_in_the_error() -> None:
    with pytest.raises(ValueError) as info:
        StorageConfig(tenant_quotas={b"hidden-salt": (1, 2)})
    assert "hidden-salt" not in str(info.value) and "11-byte tenant" in str(info.value)

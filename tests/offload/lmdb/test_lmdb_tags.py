"""Tags and ``invalidate_tag`` on the LMDB store, and quotas changed at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from radixcache.offload.storage import PutMeta, Storage
from tests.offload.lmdb.test_lmdb_retention import get, put
from tests.offload.storekit import RECORD_BYTES as R

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

A, B = b"tenant-a", b"tenant-b"


def test_invalidate_removes_every_tagged_namespace_and_nothing_else(kit: StoreKit) -> None:
    store = kit.open()
    assert isinstance(store, Storage)
    v3a, v3b = kit.keys(3, b"v3a"), kit.keys(2, b"v3b")
    other, plain = kit.keys(2, b"other"), kit.keys(2, b"plain")
    put(kit, store, v3a, b"ns-v3a", tags=("model:v3", "team:x"))
    put(kit, store, v3b, b"ns-v3b", tags=("model:v3",))  # a tag shared by two namespaces
    put(kit, store, other, b"ns-other", tags=("model:v4", "team:x"))
    put(kit, store, plain, b"ns-plain")
    assert kit.done(store.invalidate_tag("model:v3")) == 5
    assert sorted(store.take_removed()) == sorted(v3a + v3b)
    assert store.longest_prefix(v3a) == 0 and store.longest_prefix(v3b) == 0
    assert get(kit, store, other) == 2 and get(kit, store, plain) == 2
    assert store.stats().deleted == 5
    assert kit.done(store.invalidate_tag("model:v3")) == 0  # its entries went with it
    assert kit.done(store.invalidate_tag("team:x")) == 2  # v3a's other tag no longer names it
    assert sorted(store.take_removed()) == sorted(other)
    assert kit.done(store.invalidate_tag("never-used")) == 0
    store.check_integrity()


def test_an_invalidation_is_durable_across_a_restart(kit: StoreKit) -> None:
    store = kit.open("s")
    gone, kept = kit.keys(2, b"gone"), kit.keys(2, b"kept")
    put(kit, store, gone, b"ns-gone", tags=("t",))
    put(kit, store, kept, b"ns-kept", tags=("u",))
    assert kit.done(store.invalidate_tag("t")) == 2
    store.close()
    store = kit.open("s")
    assert store.longest_prefix(gone) == 0 and get(kit, store, gone) == 0
    assert store.longest_prefix(kept) == 2
    assert store.stats().records == 2
    store.check_integrity()


def test_tags_of_an_earlier_run_are_invalidated(kit: StoreKit) -> None:
    store = kit.open("s")
    keys = kit.keys(3, b"old")
    put(kit, store, keys, b"ns", tags=("template:v8",))
    store.close()
    store = kit.open("s")
    assert kit.done(store.invalidate_tag("template:v8")) == 3
    assert sorted(store.take_removed()) == sorted(keys)
    store.close()
    store = kit.open("s")
    assert store.stats().records == 0
    store.check_integrity()


def test_forget_namespace_leaves_no_tag_naming_it(kit: StoreKit) -> None:
    store = kit.open()
    first, second = kit.keys(2, b"first"), kit.keys(2, b"second")
    put(kit, store, first, b"ns", tags=("t",))
    assert kit.done(store.forget_namespace(b"ns")) == 2
    put(kit, store, second, b"ns")  # the namespace again, untagged this time
    assert kit.done(store.invalidate_tag("t")) == 0
    assert store.longest_prefix(second) == 2
    store.check_integrity()


def test_puts_queued_around_an_invalidation_keep_queue_order(kit: StoreKit) -> None:
    store = kit.open()
    before, after = kit.keys(2, b"before"), kit.keys(2, b"after")
    tickets = [
        store.put(before, kit.tokens(2), kit.host(2), kit.ids(0, 1), b"ns",
                  meta=_meta(2, ("t",))),
        store.invalidate_tag("t"),
        store.put(after, kit.tokens(2), kit.host(2), kit.ids(0, 1), b"ns",
                  meta=_meta(2, ("t",))),
    ]
    assert [kit.done(t) for t in tickets] == [2, 2, 2]
    assert store.longest_prefix(before) == 0 and store.longest_prefix(after) == 2
    assert kit.done(store.invalidate_tag("t")) == 2  # listed again by the later put
    store.check_integrity()


@pytest.mark.parametrize("tag", ["", "with space", "x" * 129, "caf\u00e9", 5, b"bytes"])
def test_a_bad_tag_is_refused_at_the_call(kit: StoreKit, tag: object) -> None:
    store = kit.open()
    with pytest.raises((ValueError, TypeError), match="tag"):
        store.invalidate_tag(tag)  # type: ignore[arg-type]


# -- quotas changed at run time -------------------------------------------------------------


def test_a_lowered_limit_evicts_the_tenants_own_oldest_records(kit: StoreKit) -> None:
    store = kit.open()
    a_keys, b_keys = kit.keys(4, b"a"), kit.keys(2, b"b")
    put(kit, store, a_keys, b"a", tenant=A)
    put(kit, store, b_keys, b"b", tenant=B)
    assert kit.done(store.set_tenant_quotas({A: (2 * R, 0)})) == 2
    assert store.take_removed() == a_keys[:2]
    assert store.longest_prefix(a_keys[2:]) == 2 and store.longest_prefix(b_keys) == 2
    stats = store.tenant_stats()
    assert (stats[A].records, stats[A].limit_bytes, stats[A].quota_evicted) == (2, 2 * R, 2)
    assert stats[B].limit_bytes is None and stats[B].records == 2
    more = kit.keys(6, b"a")[4:]
    put(kit, store, more, b"a", tenant=A, start=4)  # the new limit holds for later puts
    assert store.take_removed() == a_keys[2:]
    assert store.tenant_stats()[A].stored_bytes == 2 * R
    store.check_integrity()


def test_quota_changes_apply_in_queue_order_and_default_none_keeps_the_default(
    kit: StoreKit,
) -> None:
    store = kit.open(tenant_quota_default=(3 * R, 0))
    keys = kit.keys(3, b"b")
    put_ticket = store.put(keys, kit.tokens(3), kit.host(3), kit.ids(0, 1, 2), b"b", tenant=B)
    lowered = store.set_tenant_quotas({A: (None, 0)}, default=(1 * R, 0))
    assert kit.done(put_ticket) == 3  # written under the quotas of its time
    assert kit.done(lowered) == 2  # then cut down to the new default
    assert store.tenant_stats()[B].limit_bytes == R
    assert kit.done(store.set_tenant_quotas({})) == 0  # default None: the default stays
    assert store.tenant_stats()[B].limit_bytes == R
    assert A not in store.tenant_stats()  # no longer listed, and never put
    raised = store.set_tenant_quotas({}, default=(None, 0))
    assert kit.done(raised) == 0
    put(kit, store, kit.keys(4, b"c"), b"c", tenant=B)
    assert store.tenant_stats()[B].records == 5
    store.check_integrity()


def test_bad_quotas_are_refused_at_the_call(kit: StoreKit) -> None:
    store = kit.open()
    with pytest.raises(ValueError, match="floor"):
        store.set_tenant_quotas({A: (10, 20)})
    with pytest.raises(TypeError, match="tenant"):
        store.set_tenant_quotas({"a": (10, 0)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="tenant_quota_default"):
        store.set_tenant_quotas({}, default=(-1, 0))
    assert store.stats().queued_writes == 0


def _meta(n: int, tags: tuple[str, ...]) -> PutMeta:
    return PutMeta(list(range(n)), None, 0, tags=tags)


def test_the_data_file_holds_no_tag_text(kit: StoreKit) -> None:
    store = kit.open("s")
    put(kit, store, kit.keys(1, b"x"), b"x", tags=("customer:acme-secret",))
    store.close()
    assert b"customer:acme-secret" not in (kit.root / "s" / "data.mdb").read_bytes()
    store = kit.open("s")
    assert kit.done(store.invalidate_tag("customer:acme-secret")) == 1

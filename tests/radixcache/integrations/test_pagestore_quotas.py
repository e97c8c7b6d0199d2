"""PageStore's quotas: the retention deadline of each tenant's puts, byte
quotas handed to the store, run-time changes, and the quotas a page store
refuses (integrations/quotas.py). Without any engine."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixcache.integrations.pagestore import PageStore, PageStoreConfig, RawPages
from radixcache.integrations.quotas import pool_byte_limits, store_quotas
from radixcache.integrations.tenants import tenant_namespace
from radixcache.namespace import Namespace
from radixcache.offload import LmdbStorage, NullStorage, PutMeta
from radixcache.tenants import TenantQuota, parse_quotas
from radixcache.transfer.ticket import FutureTicket, Ticket

PAGE_BYTES = 512
ACME, OTHER = tenant_namespace("acme"), tenant_namespace("other")


class RecordingStorage(NullStorage):
    """A FAKE store, not a backend: it keeps nothing, answers every put as
    stored, and records what PageStore hands it (each put's keys, PutMeta
    and tenant; each invalidate_tag). For checking the PutMeta a put builds;
    the real LMDB store is checked below."""

    def __init__(self) -> None:
        self.puts: list[tuple[list[bytes], PutMeta | None, bytes | None]] = []
        self.invalidated: list[str] = []

    def put(self, keys: Sequence[bytes], tokens: Any, host: Any, host_pages: Any,
            namespace: bytes, meta: PutMeta | None = None, tenant: bytes | None = None) -> Ticket:
        self.puts.append((list(keys), meta, tenant))
        return FutureTicket.completed(len(keys))

    def invalidate_tag(self, tag: str) -> Ticket:
        self.invalidated.append(tag)
        return FutureTicket.completed(7)


class ByteQuotaRecordingStorage(RecordingStorage):
    """The same fake, taking per-tenant byte quotas at run time (a
    ``ByteQuotaStore``): it records every call."""

    def __init__(self) -> None:
        super().__init__()
        self.byte_quotas: list[tuple[dict[Any, Any], Any]] = []

    def set_tenant_quotas(self, quotas: Mapping[Any, Any], default: Any = None) -> None:
        self.byte_quotas.append((dict(quotas), default))


class Clock:
    """Wall-clock seconds the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config(path: Path | str = "/unused") -> PageStoreConfig:
    return PageStoreConfig(path=str(path), page_bytes=PAGE_BYTES, engine="test", model="m",
                           layout="opaque", capacity_bytes=1 << 20)


def pages(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, PAGE_BYTES), dtype=np.uint8)


def test_each_put_carries_its_tenants_deadline_and_tenant() -> None:
    fake, clock = RecordingStorage(), Clock(1000.0)
    book = parse_quotas({"acme": {"ttl_s": 60}, "(none)": {"ttl_s": 5.5}})
    store = PageStore(config(), storage=fake, quotas=book, clock=clock)
    buf = RawPages(pages(2), PAGE_BYTES)
    store.put([b"a0", b"a1"], buf, [0, 1], ACME).wait()
    store.put([b"d0"], buf, [0]).wait()  # no salt: the "(none)" quota
    store.put([b"o0"], buf, [1], OTHER).wait()  # no quota of its own, none for "*"
    (_, acme, acme_tenant), (_, none, none_tenant), (_, other, other_tenant) = fake.puts
    assert acme is not None and acme.expires_at == 1060.0 and acme_tenant == ACME.tenant
    assert none is not None and none.expires_at == 1005.5 and none_tenant is None
    assert other is None and other_tenant == OTHER.tenant and other_tenant != ACME.tenant
    ids = list(acme.block_ids)  # raw pages' record ids: stable, distinct, 63-bit
    assert len(set(ids)) == 2 and all(0 <= i < 2**63 for i in ids)
    assert (acme.parent_block_id, acme.first_depth, acme.tags) == (None, 0, ())
    store.put([b"a0", b"a1"], buf, [0, 1], ACME).wait()
    assert list(fake.puts[-1][1].block_ids) == ids  # type: ignore[union-attr]


def test_set_quota_changes_later_deadlines_and_refuses_what_it_cannot_enforce() -> None:
    fake, clock = RecordingStorage(), Clock(1000.0)
    store = PageStore(config(), storage=fake, quotas=parse_quotas({"*": {"ttl_s": 100}}),
                      clock=clock)
    buf = RawPages(pages(1), PAGE_BYTES)
    store.put([b"k"], buf, [0], ACME).wait()
    store.set_quota("acme", TenantQuota(ttl_s=10))
    clock.now = 2000.0
    store.put([b"k"], buf, [0], ACME).wait()
    store.put([b"k"], buf, [0], OTHER).wait()  # still the "*" quota
    store.set_quota("acme", None)  # back to "*"
    store.put([b"k"], buf, [0], ACME).wait()
    store.set_quota("", TenantQuota(ttl_s=1))  # "" is no salt, as in both engines
    store.put([b"k"], buf, [0]).wait()
    deadlines = [meta.expires_at if meta else None for _k, meta, _t in fake.puts]
    assert deadlines == [1100.0, 2010.0, 2100.0, 2100.0, 2001.0]
    with pytest.raises(ValueError, match=r"`device_pages` is not enforced by a page store on "
                                         r"lmdb \(it enforces storage_bytes, storage_floor, ttl_s\)"):
        store.set_quota("acme", TenantQuota(device_pages=4))
    with pytest.raises(TypeError, match="cache_salt must be a str, got int"):
        store.set_quota(5, TenantQuota(ttl_s=1))  # type: ignore[arg-type]


def test_byte_quotas_reach_a_store_that_takes_them_and_are_refused_by_one_that_does_not() -> None:
    book = parse_quotas({"noisy": {"storage_bytes": 4096}, "*": {"storage_floor": 1024}})
    with pytest.raises(ValueError, match=r"takes no per-tenant byte quotas"):
        PageStore(config(), storage=RecordingStorage(), quotas=book)
    fake = ByteQuotaRecordingStorage()
    store = PageStore(config(), storage=fake, quotas=book)
    noisy = tenant_namespace("noisy").tenant
    assert fake.byte_quotas == [({noisy: (4096, 0)}, (None, 1024))]
    store.set_quota("noisy", TenantQuota(storage_bytes=8192, ttl_s=5))
    store.set_quota("noisy", TenantQuota(storage_bytes=8192, ttl_s=9))  # bytes unchanged: no call
    assert fake.byte_quotas[1:] == [({noisy: (8192, 0)}, (None, 1024))]


def test_invalidate_tag_goes_to_the_store() -> None:
    fake = RecordingStorage()
    store = PageStore(config(), storage=fake)
    ticket = store.invalidate_tag("model:v3")
    assert ticket.wait(1) and ticket.result() == 7 and fake.invalidated == ["model:v3"]
    with pytest.raises(ValueError, match="printable ASCII characters without spaces"):
        store.invalidate_tag("bad tag")
    tagged = Namespace(salt="acme", tags=("model:v3",))
    store.put([b"k"], RawPages(pages(1), PAGE_BYTES), [0], tagged).wait()
    assert fake.puts[-1][1] is not None and fake.puts[-1][1].tags == ("model:v3",)


def test_quotas_a_page_store_does_not_enforce_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"quotas\['noisy'\]: unknown key 'storage_byte'"):
        store_quotas({"noisy": {"storage_byte": 1}}, "lmdb")
    with pytest.raises(ValueError, match=r"quotas\['\*'\]: `host_pages` is not enforced"):
        store_quotas({"*": {"host_pages": 8}}, "lmdb")
    with pytest.raises(ValueError, match=r"quotas\['\(none\)'\]: `pool_bytes` is not enforced by "
                                         r"a page store on lmdb"):
        store_quotas({"(none)": {"pool_bytes": 1 << 20}}, "lmdb")
    with pytest.raises(ValueError, match=r"quotas\['q'\]: `storage_floor` is not enforced by a "
                                         r"page store on valkey"):
        store_quotas({"q": {"storage_floor": 1}}, "valkey")
    assert store_quotas({"q": {"ttl_s": 1}}, "valkey").get(tenant_namespace("q").tenant).ttl_s == 1
    assert store_quotas({"q": {"pool_bytes": 9}}, "valkey").get(tenant_namespace("q").tenant).pool_bytes == 9


def test_pool_byte_limits_are_built_per_tenant_for_a_pool_store() -> None:
    book = parse_quotas({"a": {"pool_bytes": 100}, "b": {"ttl_s": 3}, "*": {"pool_bytes": 7}})
    assert pool_byte_limits(book) == ({tenant_namespace("a").tenant: 100}, 7)
    assert pool_byte_limits(parse_quotas({})) == ({}, None)


def test_the_deadline_reaches_the_lmdb_store_and_the_pages_read_back(tmp_path: Path) -> None:
    """The real LMDB store: its ``put`` (wrapped, to see what it is given)
    gets each tenant's deadline; the records read back bit-exact."""
    clock = Clock(time.time())  # a store that keeps deadlines writes none already past
    store = PageStore(config(tmp_path), quotas=parse_quotas({"acme": {"ttl_s": 30}}), clock=clock)
    lmdb = store._storage
    assert isinstance(lmdb, LmdbStorage)
    seen: list[tuple[PutMeta | None, bytes | None]] = []
    real_put = lmdb.put

    def put(*args: Any, **kw: Any) -> Ticket:
        seen.append((args[5], args[6]))
        return real_put(*args, **kw)

    lmdb.put = put  # type: ignore[method-assign]
    src = pages(2, seed=3)
    try:
        put = store.put([b"a", b"b"], RawPages(src, PAGE_BYTES), [0, 1], ACME)
        assert put.wait(10) and put.results() == [True, True]
        assert store.put([b"c"], RawPages(src, PAGE_BYTES), [0]).wait(10)
        assert [(m.expires_at if m else None, t) for m, t in seen] == [
            (clock.now + 30, ACME.tenant), (None, None)]
        dst = np.zeros_like(src)
        got = store.get([b"a", b"b"], RawPages(dst, PAGE_BYTES), [0, 1], ACME)
        assert got.wait(10) and got.results() == [True, True] and np.array_equal(dst, src)
        assert store.leading([b"a"], OTHER) == 0  # another tenant never finds them
    finally:
        store.close()


# -- what the LMDB store does with them (its retention, tags and run-time quotas) --
def test_lmdb_serves_no_page_past_the_deadline_its_put_carried(tmp_path: Path) -> None:
    """Deadlines from PageStore's clock, compared by the store with the
    wall clock: one already past (never served) and one a day away."""
    clock = Clock(time.time() - 100)
    store = PageStore(config(tmp_path), quotas=parse_quotas({"acme": {"ttl_s": 10}}), clock=clock)
    src = pages(2, seed=4)
    try:
        store.put([b"old"], RawPages(src, PAGE_BYTES), [0], ACME).wait(10)
        clock.now = time.time() + 86400
        store.put([b"new"], RawPages(src, PAGE_BYTES), [1], ACME).wait(10)
        dst = np.zeros_like(src)
        old = store.get([b"old"], RawPages(dst, PAGE_BYTES), [0], ACME)
        new = store.get([b"new"], RawPages(dst, PAGE_BYTES), [1], ACME)
        assert old.wait(10) and new.wait(10)
        assert (old.results(), new.results()) == ([False], [True])
        assert np.array_equal(dst[1], src[1])
    finally:
        store.close()


def test_lmdb_takes_a_lowered_byte_limit_at_run_time(tmp_path: Path) -> None:
    store = PageStore(config(tmp_path))
    src = pages(4, seed=5)
    try:
        for i in range(4):
            assert store.put([b"n%d" % i], RawPages(src, PAGE_BYTES), [i], ACME).wait(10)
        assert store.put([b"o"], RawPages(src, PAGE_BYTES), [0], OTHER).wait(10)
        store.take_removed()
        store.set_quota("acme", TenantQuota(storage_bytes=2 * (PAGE_BYTES + 256)))
        assert store.put([b"o2"], RawPages(src, PAGE_BYTES), [1], OTHER).wait(10)  # after it
        assert store.take_removed() == [b"n0", b"n1"]  # the tenant's oldest, no one else's
        assert [store.contains(b"n%d" % i, ACME) for i in range(4)] == [False, False, True, True]
        assert store.leading([b"o", b"o2"], OTHER) == 2
    finally:
        store.close()


def test_lmdb_invalidates_the_pages_of_a_tag(tmp_path: Path) -> None:
    store = PageStore(config(tmp_path))
    tagged = Namespace(salt="acme", tags=("model:v3",))
    src = pages(2, seed=6)
    try:
        store.put([b"t0", b"t1"], RawPages(src, PAGE_BYTES), [0, 1], tagged).wait(10)
        store.put([b"u"], RawPages(src, PAGE_BYTES), [0], OTHER).wait(10)
        ticket = store.invalidate_tag("model:v3")
        assert ticket.wait(10) and ticket.result() == 2
        assert store.leading([b"t0", b"t1"], tagged) == 0 and store.contains(b"u", OTHER)
    finally:
        store.close()

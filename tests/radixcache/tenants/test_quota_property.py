"""Random request sequences of several tenants under device quotas.

The machine of tests/radixcache/test_property.py (reference model of cached
prefixes, KV written from the whole prefix and checked on every live
request, ``check_integrity``), run on a cache with quotas, plus quota
changes at run time. After every step: the ledger equals a recount over the
tree; no tenant holds more than its limit (a limit lowered under pages that
live requests hold may be exceeded by those pages only, and the excess
never grows); an allocation, commit or ``evict`` on behalf of one tenant
never takes another below its floor.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from radixcache import CacheConfig, KVSpec, OutOfPagesError, RadixCache, Request
from radixcache.tenants import TenantQuota
from radixcache.tenants.eviction import ANY, TenantEviction
from tests.radixcache.test_property import NAMESPACES, CacheMachine, P

SALTS = [None, "t1"]  # the tenants of NAMESPACES: (none) holds namespaces 0 and 2
START = {None: TenantQuota(device_pages=4, device_floor=2), "t1": TenantQuota(device_floor=5)}
POOL_PAGES = 16  # tight: limits, floors and pressure all bind often


def tenant_of(ns: int) -> object:
    return NAMESPACES[ns].tenant


class QuotaMachine(CacheMachine):
    def __init__(self) -> None:
        super().__init__()
        spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float64, page_size=P)
        self.cache = RadixCache(CacheConfig(spec=spec, device_pages=POOL_PAGES, quotas=dict(START)))
        self.caps: dict[object, int] = {}  # what each tenant may hold now (see the module)

    # -------------------------------------------------------------- helpers
    def held(self) -> dict[object, int]:
        out: dict[object, int] = {}
        for node in self.cache.tree.nodes():
            if node.device is not None:
                key = node.namespace.tenant
                out[key] = out.get(key, 0) + int(node.device.size)
        return out

    def floor(self, key: object) -> int:
        return self.cache._gate.ledger.quota(key).device_floor  # type: ignore[arg-type]

    def check_floors(self, before: dict[object, int], who: object) -> None:
        after = self.held()
        for key, had in before.items():
            if key == who and who is not ANY:
                continue
            assert after.get(key, 0) >= min(had, self.floor(key)), (
                f"tenant {key!r} went from {had} to {after.get(key, 0)} pages, below its floor "
                f"{self.floor(key)}, for {who!r}"
            )

    # -------------------------------------------------------------- rules
    @rule(req=CacheMachine.requests, n=st.integers(0, 24))
    def reserve_and_commit(self, req: Request, n: int) -> None:
        if req.released:
            return
        who = tenant_of(self.ns_of[req.rid])
        before = self.held()
        n = min(n, req.num_tokens - req.num_computed)
        ev = self.cache.tree.eviction
        assert isinstance(ev, TenantEviction)
        room = self.cache.pool.free_count + ev.takeable(who)
        try:
            self.cache.reserve(req, n)
        except OutOfPagesError as err:
            assert err.requested > room and err.free < err.requested
            assert self.held() == before, "a refused allocation evicted pages"
            self.sync_evictions()
            return
        self.sync_evictions()
        self.write_kv(req, n)
        self.cache.commit(req, n)
        ns, toks = self.ns_of[req.rid], req.tokens
        self.check_floors(before, who)
        if req.rid not in self.stale:
            for end in range(P, req.shared_pages * P + 1, P):  # what the limit let in
                self.ref.add((ns, tuple(toks[:end].tolist())))
        self.sync_evictions()  # a commit may evict the tenant's own pages (its limit)

    @rule(ns=st.integers(0, len(NAMESPACES) - 1),
          body=st.lists(st.integers(0, 2), min_size=5, max_size=30))
    def serve(self, ns: int, body: list[int]) -> None:
        """A whole request in one step (admit, reserve+commit all, release):
        fills the cache fast, so limits and floors bind often."""
        req = CacheMachine.admit(self, ns, body, "none")
        self.reserve_and_commit(req, req.num_tokens - req.num_computed)
        if not req.released:
            self.release(req)

    @rule(n=st.integers(1, 8))
    def evict(self, n: int) -> None:
        ev = self.cache.tree.eviction
        assert isinstance(ev, TenantEviction)
        takeable = ev.takeable(ANY)
        before = self.held()
        freed = self.cache.evict(n)
        assert freed >= min(n, takeable)
        self.check_floors(before, ANY)
        self.sync_evictions()

    @rule(tenant=st.integers(0, len(SALTS) - 1), limit=st.none() | st.integers(0, 10),
          floor=st.integers(0, 6))
    def set_quota(self, tenant: int, limit: int | None, floor: int) -> None:
        if limit is not None:
            floor = min(floor, limit)
        salt = SALTS[tenant]
        key = NAMESPACES[0].tenant if salt is None else NAMESPACES[1].tenant
        before = self.held()
        self.cache.tenants.set_quota(salt, TenantQuota(device_pages=limit, device_floor=floor))
        after = self.held()
        for other, had in before.items():
            if other != key:
                assert after.get(other, 0) == had, "a quota change evicted another tenant"
        if limit is None:
            self.caps.pop(key, None)
        else:
            self.caps[key] = max(limit, after.get(key, 0))
        self.sync_evictions()

    # -------------------------------------------------------------- checks
    @invariant()
    def ledger_is_exact(self) -> None:
        ledger = self.cache._gate.ledger
        assert ledger.device == {k: v for k, v in self.held().items() if v}
        evictable: dict[object, int] = {}
        for node in self.cache.tree.nodes():
            if node.device is not None and node.lock_ref == 0:
                key = node.namespace.tenant
                evictable[key] = evictable.get(key, 0) + int(node.device.size)
        assert ledger.evictable == evictable

    @invariant()
    def no_tenant_over_its_limit(self) -> None:
        held = self.held()
        for key in {NAMESPACES[0].tenant, NAMESPACES[1].tenant}:
            limit = self.cache._gate.ledger.quota(key).device_pages
            if limit is None:
                continue
            cap = self.caps.get(key, limit)
            assert held.get(key, 0) <= cap, f"tenant {key!r} holds {held.get(key, 0)} > {cap}"
            self.caps[key] = max(limit, held.get(key, 0))


QuotaMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQuotaMachine = QuotaMachine.TestCase

"""The tiered machine (tests/radixcache/tiers/test_tiers_property.py: device,
host and a tiny LMDB store, every copy, read and write held until a rule
finishes, fails or shortens it, restarts, forgets, resets, KV checked
bit-exact) run on a cache with device and host quotas, plus quota changes
at run time. After every step: the ledger equals a recount over the tree
(device pages and host copies per tenant); no tenant holds more device or
host pages than its limit (one lowered under pages held, or host pages a
job in flight took before, may stay above it by those pages only, never
growing); and a request, commit or ``evict`` on
behalf of one tenant never takes another below its device or host floor
(of its cached pages: a forgotten namespace's pages a request or job still
holds go when it lets go; on the host, of the copies whose every ancestor
has a copy below the device: one under a device-only prefix goes with that
prefix). Cases it found are kept step by step in
tests/radixcache/tenants/test_quota_write_back.py.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from radixcache import Node, OutOfPagesError, Request
from radixcache.tenants import TenantQuota
from radixcache.tenants.eviction import ANY, TenantEviction
from tests.radixcache.tiers.test_tiers_property import NAMESPACES, P, TieredMachine

TENANTS = sorted({ns.tenant for ns in NAMESPACES}, key=repr)  # (none) and tenant-b
START = {
    None: TenantQuota(device_pages=4, device_floor=1, host_pages=2, host_floor=1),
    "tenant-b": TenantQuota(device_floor=4, host_pages=5, host_floor=2),
}


FLOORS = {"device_cached": "device", "host_anchored": "host"}  # what floors keep -> whose floor


def _anchored(node: Node) -> bool:
    """Every ancestor of ``node`` has a copy below the device (host or storage)."""
    n = node.parent
    while n is not None and n.parent is not None:
        if n.host is None and not n.stored:
            return False
        n = n.parent
    return True


class QuotaTieredMachine(TieredMachine):
    quotas = START  # type: ignore[assignment]

    def __init__(self) -> None:
        self.caps: dict[tuple[str, object], int] = {}  # (tier, tenant) -> what it may hold now
        super().__init__()

    # -------------------------------------------------------------- helpers
    def held(self) -> dict[tuple[str, object], int]:
        """Pages per (tier, tenant), and what floors keep of them (``FLOORS``):
        ``device_cached``, the device pages of namespaces not forgotten;
        ``host_anchored``, the host copies of those whose every ancestor has
        a copy below the device too. A forgotten namespace's pages that a
        request or job still held go when it lets go (they can never be
        served again), and a copy below a prefix held on the device alone
        goes with that prefix when the device evicts it (nothing could reach
        it any more): neither is an eviction a floor keeps pages from."""
        out: dict[tuple[str, object], int] = {}
        for node in self.cache.tree.nodes():
            key = node.namespace.tenant
            if node.device is not None:
                n = int(node.device.size)
                out["device", key] = out.get(("device", key), 0) + n
                if not node.forgotten:
                    out["device_cached", key] = out.get(("device_cached", key), 0) + n
            if node.host is not None:
                n = int(node.host.size)
                out["host", key] = out.get(("host", key), 0) + n
                if not node.forgotten and _anchored(node):
                    out["host_anchored", key] = out.get(("host_anchored", key), 0) + n
        return out

    def quota(self, key: object) -> TenantQuota:
        return self.cache._gate.ledger.quota(key)  # type: ignore[arg-type]

    def acting(self, before: dict[tuple[str, object], int], who: object) -> None:
        """Floors: no tenant but ``who`` went below one in this step."""
        after = self.held()
        for (measure, key), had in before.items():
            tier = FLOORS.get(measure)
            if tier is None or (key == who and who is not ANY):
                continue
            floor = self.quota(key).floor(tier)
            now = after.get((measure, key), 0)
            assert now >= min(had, floor), (
                f"{measure}: tenant {key!r} went from {had} to {now} pages, "
                f"below its {tier} floor {floor}, for {who!r}"
            )

    def _write(self, req: Request, n: int) -> None:
        """Reserve (refused only when eviction could not make room for this
        tenant: floors count), write, commit."""
        need = -(-(req.num_computed + n) // P) - req.num_pages
        ev = self.cache.tree.eviction
        assert isinstance(ev, TenantEviction)
        cover = self.cache.pool.free_count + ev.takeable(NAMESPACES[self.meta[req.rid][0]].tenant)
        try:
            self.cache.reserve(req, n)
        except OutOfPagesError as err:
            assert need > cover, f"{err} although {cover} pages were free or takeable"
            return
        self._put_kv(req, n)
        self.cache.commit(req, n)

    # -------------------------------------------------------------- rules
    @rule(ns=st.integers(0, 2), body=st.lists(st.integers(0, 2), min_size=1, max_size=14),
          pick=st.integers(0, 99))
    def serve(self, ns: int, body: list[int], pick: int) -> None:
        before = self.held()
        TieredMachine.serve(self, ns, body, pick)
        self.acting(before, NAMESPACES[ns].tenant)

    @rule(req=TieredMachine.requests, n=st.integers(0, 8))
    def compute(self, req: Request, n: int) -> None:
        if req.released:
            return
        before = self.held()
        TieredMachine.compute(self, req, n)
        self.acting(before, NAMESPACES[self.meta[req.rid][0]].tenant)

    @rule(n=st.integers(1, 6))
    def evict(self, n: int) -> None:
        before = self.held()
        TieredMachine.evict(self, n)
        self.acting(before, ANY)

    @rule(tenant=st.integers(0, len(TENANTS) - 1), device=st.none() | st.integers(0, 10),
          host=st.none() | st.integers(0, 6), floors=st.tuples(st.integers(0, 5), st.integers(0, 4)))
    def set_quota(self, tenant: int, device: int | None, host: int | None,
                  floors: tuple[int, int]) -> None:
        key = TENANTS[tenant]
        salt = None if key is None else "tenant-b"
        dev_floor = floors[0] if device is None else min(floors[0], device)
        host_floor = floors[1] if host is None else min(floors[1], host)
        before = self.held()
        self.cache.tenants.set_quota(salt, TenantQuota(device, dev_floor, host, host_floor))
        after = self.held()
        for (tier, other), had in before.items():
            if other != key:
                assert after.get((tier, other), 0) == had, "a quota change evicted another tenant"
        flying = self.cache._gate.ledger.host_in_flight.get(key, 0)  # may still land
        for tier, limit in (("device", device), ("host", host)):
            if limit is None:
                self.caps.pop((tier, key), None)
            else:
                extra = flying if tier == "host" else 0
                self.caps[tier, key] = max(limit, after.get((tier, key), 0) + extra)

    # -------------------------------------------------------------- checks
    @invariant()
    def quotas_hold(self) -> None:
        ledger = self.cache._gate.ledger
        held = self.held()
        assert ledger.device == {k: v for (t, k), v in held.items() if t == "device" and v}
        assert ledger.host == {k: v for (t, k), v in held.items() if t == "host" and v}
        for key in TENANTS:
            quota = self.quota(key)
            for tier in ("device", "host"):
                limit = quota.limit(tier)
                if limit is None:
                    continue
                now = held.get((tier, key), 0)
                cap = self.caps.get((tier, key), limit)
                assert now <= cap, f"{tier}: tenant {key!r} holds {now} pages, over {cap}"
                # Host pages a job took before a lowered limit may still land.
                flying = ledger.host_in_flight.get(key, 0) if tier == "host" else 0
                self.caps[tier, key] = max(limit, now + flying)

    def _open(self) -> None:
        super()._open()
        self.caps.clear()  # a new cache starts from the configured quotas


QuotaTieredMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RADIXCACHE_TIER_EXAMPLES", 150)),
    stateful_step_count=50,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQuotaTieredMachine = QuotaTieredMachine.TestCase

"""Quotas under write-back and loads in flight, step by step (cases the
tiered quota machine found, tests/radixcache/tenants/test_tier_quota_property.py):

* a device victim's backup, made while the device evicts for another
  tenant or for nobody, keeps the victim's tenant at its host floor (its
  own older copies make room under its limit only above the floor, and
  copies below the victim, which go with it if the backup fails, do not
  count for the floor);
* a backup the host pool cannot take anyway evicts no copy first;
* device pages a load back is bringing into the tree count against its
  tenant's device limit from the moment they are granted;
* pages of a forgotten namespace that a request (or job) still holds keep
  no floor: the floor keeps the tenant's cached pages.

Copies are held by the manual engine of the tier tests where a step needs
one in flight, so every step is deterministic."""

from __future__ import annotations

import numpy as np

from radixcache import CacheConfig, Namespace, RadixCache
from radixcache.tenants import TenantQuota
from radixcache.offload import HostPoolConfig
from radixcache.tiers import HostTiers, TierConfig
from tests.radixcache.tenants.kit import prompt, serve
from tests.radixcache.tiers.manual import ManualCopyEngine
from tests.radixcache.tiers.tierkit import SPEC

A, B = Namespace("a"), Namespace("b")


def make(quotas: dict[str, TenantQuota], device_pages: int = 16, host_pages: int = 16,
         prefetch: str = "wait_complete", write: str = "write_back") -> RadixCache:
    tiers = TierConfig(host=HostPoolConfig(pages=host_pages), write_policy=write,
                       prefetch_policy=prefetch, model_id="test-model")
    return RadixCache(CacheConfig(spec=SPEC, device_pages=device_pages, tiers=tiers,
                                  quotas=quotas))  # type: ignore[arg-type]


def manual_copies(cache: RadixCache) -> ManualCopyEngine:
    """Hold every copy until the test completes it."""
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers) and cache.kv is not None
    tiers.controller.copy.close()
    engine = ManualCopyEngine(cache.kv, tiers.host.buffer)
    tiers.controller.copy = engine  # type: ignore[assignment]
    return engine


def host_pages_of(cache: RadixCache, ns: Namespace, tokens: np.ndarray) -> int:
    """Host pages of the nodes on ``tokens``' path in the tree (from its root)."""
    pages = 0
    for node in cache.tree.nodes():
        if node.namespace == ns and node.host is not None and not node.forgotten:
            key = node.key
            n = node.parent
            while n is not None and n.parent is not None:
                key = np.concatenate([n.key, key])
                n = n.parent
            if np.array_equal(tokens[: key.size], key):
                pages += int(node.host.size)
    return pages


def device_pages_of(cache: RadixCache, ns: Namespace) -> int:
    """Device pages of ``ns``'s nodes that are not forgotten."""
    return sum(int(n.device.size) for n in cache.tree.nodes()
               if n.namespace == ns and n.device is not None and not n.forgotten)


def _a_at_its_host_limit(cache: RadixCache) -> tuple[np.ndarray, np.ndarray]:
    """A holds two host pages (its limit: ``old``, host-only) and one device
    page without a copy (``new``, write-back backs it up only when evicted)."""
    old, new = prompt(1, 2), prompt(2, 1)
    serve(cache, A, old)
    assert cache.evict(2) == 2  # write-back: backed up on the way out
    assert host_pages_of(cache, A, old) == 2
    serve(cache, A, new)
    assert device_pages_of(cache, A) == 1 and host_pages_of(cache, A, new) == 0
    return old, new


def test_the_runners_evict_backs_a_victim_up_without_taking_its_tenant_below_its_host_floor() -> None:
    cache = make({"a": TenantQuota(host_pages=2, host_floor=1)})
    old, new = _a_at_its_host_limit(cache)
    assert cache.evict(1) == 1  # nobody's pressure: every floor holds
    cache.check_integrity()
    # The backup of ``new`` needed one page under A's limit: one page of
    # ``old`` went (cut at the floor), not both.
    assert host_pages_of(cache, A, old) == 1
    assert host_pages_of(cache, A, new) == 1
    assert cache.tenants.stats()["a"].host_pages == 2


def test_host_copies_below_the_runners_victim_keep_no_floor_for_its_backup() -> None:
    """Copies below a device-only victim go with it if its backup is not
    made (here the engine is down): they cannot stand in for the floor."""
    cache = make({"a": TenantQuota(host_pages=2, host_floor=1)})
    old, pair = prompt(1, 1), prompt(2, 2)
    serve(cache, A, old)
    assert cache.evict(1) == 1  # ``old``: host only
    serve(cache, A, pair)
    assert cache.evict(1) == 1  # the tail of ``pair``: host only, below its device-only head
    assert host_pages_of(cache, A, old) == 1 and host_pages_of(cache, A, pair) == 1
    manual_copies(cache).raising = True  # any backup would fail
    assert cache.evict(1) == 1  # the head of ``pair``, and its tail with it
    cache.check_integrity()
    assert host_pages_of(cache, A, old) == 1  # the copy the floor keeps stayed
    assert host_pages_of(cache, A, pair) == 0
    stats = cache.tenants.stats()["a"]
    assert stats.host_pages == 1 and stats.counters.host_dropped_pages == 1


def test_a_backup_the_pool_cannot_take_evicts_no_copy_first() -> None:
    """A's own pressure may make room under its limit from its own copies,
    but not when the pool cannot hold the backup anyway (B is at its floor):
    the backup is skipped and A keeps what it had."""
    cache = make({"a": TenantQuota(host_pages=3), "b": TenantQuota(host_floor=2)},
                 device_pages=5, host_pages=4)
    old = prompt(1, 2)
    serve(cache, B, prompt(5, 2))
    assert cache.evict(2) == 2
    serve(cache, A, old)
    assert cache.evict(2) == 2  # two host copies each: the host pool is full
    serve(cache, A, prompt(2, 3))
    serve(cache, A, prompt(3, 4))  # evicts A's three-page node: its backup cannot fit
    cache.check_integrity()
    assert host_pages_of(cache, A, old) == 2
    assert cache.tenants.stats()["b"].host_pages == 2


def test_another_tenants_request_backs_a_victim_up_without_taking_it_below_its_host_floor() -> None:
    cache = make({"a": TenantQuota(host_pages=2, host_floor=2)}, device_pages=4)
    old, new = _a_at_its_host_limit(cache)
    serve(cache, B, prompt(3, 3))  # four device pages: A's ``new`` page goes
    cache.check_integrity()
    assert device_pages_of(cache, A) == 0
    assert host_pages_of(cache, A, old) == 2  # at its floor: its copies stay
    assert host_pages_of(cache, A, new) == 0  # so the backup was not made
    assert cache.tenants.stats()["a"].counters.host_dropped_pages == 1


def test_a_tenants_own_request_may_swap_its_host_copies_below_its_floor() -> None:
    cache = make({"a": TenantQuota(host_pages=2, host_floor=2)}, device_pages=4)
    old, new = _a_at_its_host_limit(cache)
    serve(cache, A, prompt(4, 3))  # A's own pressure: its older copies make room
    cache.check_integrity()
    assert host_pages_of(cache, A, new) == 1
    assert host_pages_of(cache, A, old) < 2


def test_a_load_in_flight_counts_against_the_device_limit() -> None:
    cache = make({"a": TenantQuota(device_pages=3)}, prefetch="best_effort")
    engine = manual_copies(cache)
    back = prompt(1, 1)
    serve(cache, A, back)
    engine.close()  # (no copy is made before the eviction: write-back)
    assert cache.evict(1) == 1
    cache.drain()
    assert device_pages_of(cache, A) == 0 and host_pages_of(cache, A, back) == 1
    req = cache.admit(back, A)  # loads its page back: one device page for A, in flight
    assert [kind for kind, _, _ in engine.pending] == ["h2d"]
    cache.commit(req, 0)  # best effort: it gives the load up; the load still lands
    cache.release(req)
    assert device_pages_of(cache, A) == 0
    serve(cache, A, prompt(2, 3))  # three pages: room for two next to the load
    assert device_pages_of(cache, A) == 2
    assert cache.tenants.stats()["a"].counters.dropped_pages == 1
    engine.close()  # the load lands
    cache.poll()
    cache.check_integrity()
    assert device_pages_of(cache, A) == 3  # at its limit, not over it
    assert cache.tenants.stats()["a"].device_pages == 3


def test_a_load_given_up_does_not_land_over_a_limit_lowered_meanwhile() -> None:
    """A's limit is lowered under pages a live request locks while a load
    nobody waits for any more is in flight: the load's pages go back to the
    pool when it lands (its host copy stays), A does not grow over."""
    cache = make({"a": TenantQuota()}, prefetch="best_effort")
    engine = manual_copies(cache)
    back = prompt(1, 1)
    serve(cache, A, back)
    engine.close()
    assert cache.evict(1) == 1
    cache.drain()
    holder = serve(cache, A, prompt(2, 3), release=False)  # three pages, locked
    req = cache.admit(back, A)  # loads its page back: one more for A, in flight
    assert [kind for kind, _, _ in engine.pending] == ["h2d"]
    cache.commit(req, 0)  # best effort: given up
    cache.release(req)
    cache.tenants.set_quota("a", TenantQuota(device_pages=2))  # under the locked three
    free = cache.pool.free_count
    engine.close()  # the load lands
    cache.poll()
    cache.check_integrity()
    assert device_pages_of(cache, A) == 3  # the locked pages only: not grown
    assert cache.pool.free_count == free + 1  # the load's page went back
    assert host_pages_of(cache, A, back) == 1  # still cached on the host
    cache.release(holder)


def test_forgotten_pages_a_request_holds_keep_no_device_floor() -> None:
    cache = make({"a": TenantQuota(device_floor=1)})
    holder = serve(cache, A, prompt(1, 1), release=False)
    cache.forget_namespace(A)  # its page stays until the request lets go
    serve(cache, A, prompt(2, 2))  # the new incarnation caches two pages
    assert device_pages_of(cache, A) == 2
    assert cache.tenants.stats()["a"].device_pages == 3  # the forgotten page counts until it goes
    cache.evict(4)  # nobody's pressure: A keeps one cached page
    cache.check_integrity()
    assert device_pages_of(cache, A) == 1
    cache.release(holder)
    cache.check_integrity()
    assert cache.tenants.stats()["a"].device_pages == 1


def test_forgotten_host_copies_a_request_holds_keep_no_host_floor() -> None:
    cache = make({"a": TenantQuota(host_floor=1)}, host_pages=4, write="write_through")
    holder = serve(cache, A, prompt(1, 1), release=False)
    cache.drain()
    cache.forget_namespace(A)  # its copy stays until the request lets go
    kept = prompt(2, 1)
    serve(cache, A, kept)
    cache.drain()
    assert host_pages_of(cache, A, kept) == 1
    assert cache.tenants.stats()["a"].host_pages == 2  # the forgotten copy counts until it goes
    serve(cache, B, prompt(3, 3))  # its backup finds two free host pages of the three it needs
    cache.drain()
    cache.check_integrity()
    assert host_pages_of(cache, A, kept) == 1  # at its floor: B's backup is not made
    assert cache.tenants.stats()["b"].host_pages == 0
    cache.release(holder)
    cache.check_integrity()

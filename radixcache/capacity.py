"""Device capacity: the allocation ladder and device eviction.

A reservation (and a load back from the host or storage) asks for ``n``
device pages. The ladder climbs only as far as it must::

    1. the pool has n free pages                          -> take them
    2. n > free + cached + pages jobs own (all that is not  -> OutOfPagesError at once
       private to a request): it can never fit
    3. free + evictable < n, jobs in flight: apply finished copies (they pin device pages)
    4. still short, jobs in flight: wait for and apply every tier job (abandoned fetches, ...)
    5. free + evictable >= n: evict, take                  (and once more after a drain)
    6. otherwise: OutOfPagesError(n, free, evictable)

Step 5 runs only when free and evictable pages cover ``n``, and then
succeeds (a victim skipped because a job in flight holds its descendants
is taken after the drain, when no job holds anything), so a failed
allocation evicts nothing, locks nothing and allocates nothing (invariant
10); what steps 3 and 4 applied is work already in flight, exactly what the
next ``poll()`` would apply, and they run only while jobs are in flight:
with none, a failed allocation changes nothing but the failure counter.
With quotas (radixcache.tenants), "evictable" is what eviction may take for
the requesting tenant: its own evictable pages and every other tenant's
above that tenant's floor, counted page-exact (``TenantEviction.takeable``),
so the same guarantee holds.
``DeviceCapacity`` belongs to one ``RadixCache``; owner thread only.
"""

from __future__ import annotations

from typing import NoReturn

from radixcache.errors import OutOfPagesError
from radixcache.stats import Counters
from radixcache.tenants.gate import TenantGate
from radixcache.tiers.contract import NullTiers, Tiers
from radixcache.transfer import PageAllocator
from radixcache.tree.node import PageIds
from radixcache.tree.radix_tree import RadixTree


class DeviceCapacity:
    """Allocates device pages for the cache, evicting what the ladder allows.

    Built before the tree and the tiers (which take ``allocate_or_none`` for
    load-back), then ``bind``-ed to them.
    """

    def __init__(self, pool: PageAllocator, counters: Counters) -> None:
        self.pool = pool
        self.counters = counters
        self.tree: RadixTree | None = None
        self.tiers: Tiers = NullTiers()
        self.gate: TenantGate | None = None  # quotas: whom eviction is for, limits on loads

    def bind(self, tree: RadixTree, tiers: Tiers, gate: TenantGate | None = None) -> None:
        self.tree = tree
        self.tiers = tiers
        self.gate = gate

    def _evictable(self) -> int:
        """What eviction may free for the current allocation: every
        evictable page, or with quotas what floors leave (page-exact)."""
        gate = self.gate
        ev = None if gate is None else gate.eviction
        if ev is None:
            assert self.tree is not None
            return self.tree.evictable_pages
        return ev.takeable(gate.requester)  # type: ignore[union-attr]

    def allocate(self, n: int) -> PageIds:
        """``n`` device pages (see the ladder above); OutOfPagesError, with
        nothing allocated or evicted, when even eviction cannot make room."""
        pool, tree, tiers = self.pool, self.tree, self.tiers
        assert tree is not None, "DeviceCapacity used before bind()"
        pages = pool.allocate(n)
        if pages is not None:
            return pages
        if n > pool.free_count + tree.device_pages + int(tiers.job_device_pages().size):
            self._refuse(n)  # more than every page not private to a request
        if not tiers.busy():
            pass  # nothing in flight to settle: evict or refuse
        elif pool.free_count + self._evictable() < n and tiers.settle_copies():
            pass  # copies in flight pinned pages; once applied they may be free or evictable
        while pool.free_count + self._evictable() < n and tiers.busy() and tiers.drain():
            pass  # abandoned fetches, stores under host-only children, ...
        if pool.free_count + self._evictable() >= n:
            self.evict(n - pool.free_count)
            pages = pool.allocate(n)
            if pages is None and tiers.drain():
                # Jobs held descendants of the victims: they are done now.
                self.evict(n - pool.free_count)
                pages = pool.allocate(n)
        if pages is None:
            self._refuse(n)
        return pages

    def _refuse(self, n: int) -> NoReturn:
        assert self.tree is not None
        self.counters.out_of_pages += 1
        raise OutOfPagesError(n, self.pool.free_count, self._evictable())

    def allocate_or_none(self, n: int) -> PageIds | None:
        """``allocate(n)``, or None where it would raise or where the
        tenant's device limit leaves no room (load-back asks this way)."""
        if self.gate is not None and not self.gate.load_room(n):
            return None
        try:
            return self.allocate(n)
        except OutOfPagesError:
            return None

    def evict(self, num_pages: int) -> int:
        """Evict at least ``num_pages`` unlocked device pages if there are that
        many; returns how many were freed (back in the pool)."""
        tree = self.tree
        assert tree is not None, "DeviceCapacity used before bind()"
        gate = self.gate
        ev = None if gate is None else gate.eviction
        if ev is None:
            # (the gate holds the tiers' backup hook: None for a device-only cache)
            before_drop = self.tiers.before_device_drop if gate is None else gate.before_drop
            freed = tree.evict(num_pages, before_drop).device_pages
        else:
            # (victims' backups are made for the requester too: host floors hold against it)
            freed = ev.evict(num_pages, gate.back_up_victim, gate.requester).device_pages  # type: ignore[union-attr]
        if freed.size:
            self.pool.free(freed)
            self.counters.evicted_pages += int(freed.size)
        return int(freed.size)

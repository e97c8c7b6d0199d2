"""Device eviction with quotas: one candidate heap per tenant.

``TenantEviction`` replaces a tree's ``DeviceEviction`` when the cache runs
with quotas (``CacheConfig.quotas``). The candidates are the same (unlocked
device nodes without device children); their heap entries are kept per
tenant, so a tenant's own victims come out in its own policy order without
looking at anyone else's, and a global pass takes, at each step, the oldest
(policy-first) victim among the tenants it may take from:

* ``evict_own(tenant, n)``: only that tenant's pages (it is at its limit);
* ``evict(n, before_drop, requester)``: any tenant's pages, but never a page
  that would take another tenant below its device floor: a victim of such a
  tenant is cut (``tree.split``) so that only the pages above the floor go.

``takeable(requester)`` is what that pass can free, page-exact: the
requester's evictable pages plus, for each other tenant, its evictable pages
above its floor. The allocation ladder compares it with what it needs before
evicting anything, so a refused allocation evicts nothing (invariant 10).

A floor keeps cached pages. Pages of a forgotten namespace that a request
or job still holds (``forgotten`` nodes under detached roots) count in the
tenant's device pages until they go, but can never be served again, so
they hold no floor: what is above a floor is the tenant's pages less those
(``dead_pages``, a walk over the detached roots only: empty unless a
forget waits for its holders).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from radixcache.tenants.ledger import TenantLedger
from radixcache.tenants.quota import TenantKey
from radixcache.tree.eviction import DeviceEviction, EvictedTree
from radixcache.tree.node import EvictResult, Node, PageIds, concat_pages
from radixcache.tree.policies import EvictionPolicy

ANY = object()  # evict(): no requester (RadixCache.evict): floors hold against everyone


def dead_pages(tree: EvictedTree, ledger: TenantLedger, host: bool) -> dict[TenantKey, int]:
    """Per tenant, the device pages (``host``: host copies) of forgotten
    namespaces' nodes still in ``tree`` (held by requests or jobs, under
    detached roots): counted in the ledger, kept by no floor."""
    out: dict[TenantKey, int] = {}
    for root in tree.removal.detached:
        add_pages_below(root, ledger, host, out)
    return out


def add_pages_below(root: Node, ledger: TenantLedger, host: bool,
                    out: dict[TenantKey, int]) -> None:
    """Add to ``out``, per tenant, the device pages (``host``: host copies)
    of every node below ``root``."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        pages = node.host if host else node.device
        if pages is not None:
            key = ledger.key(node.namespace)
            out[key] = out.get(key, 0) + int(pages.size)


class TenantEviction(DeviceEviction):
    """Eviction candidates of one tree, a heap per tenant. Owner thread only."""

    def __init__(self, tree: EvictedTree, policy: EvictionPolicy, ledger: TenantLedger) -> None:
        super().__init__(tree, policy)
        self.ledger = ledger
        self.heaps: dict[TenantKey, list[tuple[object, ...]]] = {}

    # ------------------------------------------------------------------ heaps
    def push(self, node: Node) -> None:
        seq = next(self._seq)
        node.heap_seq = seq
        key = self.ledger.key(node.namespace)
        heap = self.heaps.get(key)
        if heap is None:
            heap = self.heaps[key] = []
        heapq.heappush(heap, (*self.policy.key(node), seq, node))

    def clear(self) -> None:
        super().clear()
        self.heaps.clear()

    def entries(self) -> list[tuple[object, ...]]:
        return [e for heap in self.heaps.values() for e in heap]

    def _rebuild_heap(self) -> None:
        key, seq, tenant = self.policy.key, self._seq, self.ledger.key
        heaps: dict[TenantKey, list[tuple[object, ...]]] = {}
        for node in self.candidates:
            node.heap_seq = s = next(seq)
            heaps.setdefault(tenant(node.namespace), []).append((*key(node), s, node))
        for heap in heaps.values():
            heapq.heapify(heap)
        self.heaps = heaps

    def _top(self, tenant: TenantKey) -> tuple[object, ...] | None:
        """The tenant's live, current first entry (stale ones dropped or
        re-pushed on the way), left in its heap; None if it has none."""
        heap = self.heaps.get(tenant)
        key = self.policy.key
        while heap:
            entry = heap[0]
            node = entry[-1]
            assert isinstance(node, Node)
            if entry[-2] != node.heap_seq or node not in self.candidates:
                heapq.heappop(heap)
                continue
            if key(node) != entry[:-2]:
                heapq.heappop(heap)
                self.push(node)
                continue
            return entry
        if heap is not None:
            del self.heaps[tenant]
        return None

    # ------------------------------------------------------------------ budgets
    def room_above_floor(self, tenant: TenantKey, dead: dict[TenantKey, int]) -> int:
        """Device pages of ``tenant`` that another tenant's pressure may take
        (``dead``: ``dead_pages`` of the tree, which hold no floor)."""
        ledger = self.ledger
        floor = ledger.quota(tenant).device_floor
        return max(0, ledger.device.get(tenant, 0) - dead.get(tenant, 0) - floor)

    def takeable(self, requester: object) -> int:
        """Pages ``evict(..., requester)`` can free, page-exact (see the module)."""
        ledger = self.ledger
        dead = dead_pages(self.tree, ledger, host=False)
        total = 0
        for tenant, evictable in ledger.evictable.items():
            if tenant == requester and requester is not ANY:
                total += evictable
            else:
                total += min(evictable, self.room_above_floor(tenant, dead))
        return total

    # ------------------------------------------------------------------ eviction
    def evict(
        self,
        num_pages: int,
        before_drop: Callable[[Node], None] | None = None,
        requester: object = ANY,
        own_only: bool = False,
    ) -> EvictResult:
        """Free ``num_pages`` device pages in policy order across tenants,
        keeping every tenant but ``requester`` at or above its floor; with
        ``own_only``, from ``requester``'s pages alone. Returns the released
        device page ids (the caller frees them)."""
        if len(self.candidates) * 2 + 64 < sum(len(h) for h in self.heaps.values()):
            self._rebuild_heap()  # mostly superseded entries: cheaper to start over
        tree = self.tree
        lower = tree.lower
        dev: list[PageIds] = []
        count = 0
        skipped: list[Node] = []
        blocked: set[TenantKey] = set()  # tenants at their floor for this pass
        # Fixed for the pass: a dead victim taken then lowers a tenant's room
        # like a live one, which keeps the floors and still frees what
        # ``takeable`` promised (the room at the start, or every victim).
        dead = dead_pages(tree, self.ledger, host=False)
        while count < num_pages:
            pick = self._pick(requester, own_only, blocked)
            if pick is None:
                break
            tenant, entry = pick
            node = entry[-1]
            assert isinstance(node, Node) and node.device is not None
            want = num_pages - count
            if tenant != requester or requester is ANY:
                room = self.room_above_floor(tenant, dead)
                if room <= 0:
                    blocked.add(tenant)  # at its floor: nothing more of it goes
                    continue
                size = int(node.device.size)
                if size > room:  # all of it would take the tenant below its floor
                    heapq.heappop(self.heaps[tenant])
                    self.candidates.discard(node)
                    tree.split(node, size - min(room, want))  # ``node`` is now the tail
                    self.update(node)  # a candidate again, same policy key
                    continue
            heapq.heappop(self.heaps[tenant])
            node = self._tail_victim(node, want)
            if before_drop is not None:
                before_drop(node)
            if node.children and not lower.resident(node) and tree.removal.held_below(node):
                skipped.append(node)  # descendants held by jobs: not now
                continue
            pages = self.drop_device(node)
            dev.append(pages)
            count += pages.size
            counters = self.ledger.of(tenant)
            if own_only:
                counters.own_evicted_pages += int(pages.size)
            else:
                counters.pressure_evicted_pages += int(pages.size)
        for node in skipped:
            if node in self.candidates:
                self.push(node)
        return EvictResult(concat_pages(dev))

    def evict_own(
        self, tenant: TenantKey, num_pages: int, before_drop: Callable[[Node], None] | None = None
    ) -> EvictResult:
        """Free up to ``num_pages`` of ``tenant``'s own device pages."""
        return self.evict(num_pages, before_drop, requester=tenant, own_only=True)

    def _pick(
        self, requester: object, own_only: bool, blocked: set[TenantKey]
    ) -> tuple[TenantKey, tuple[object, ...]] | None:
        if own_only:
            top = self._top(requester)  # type: ignore[arg-type]
            return None if top is None else (requester, top)  # type: ignore[return-value]
        best: tuple[TenantKey, tuple[object, ...]] | None = None
        for tenant in list(self.heaps):
            if tenant in blocked:
                continue
            top = self._top(tenant)
            if top is not None and (best is None or top < best[1]):
                best = (tenant, top)
        return best

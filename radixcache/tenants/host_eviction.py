"""Host eviction with quotas: one victims heap per tenant.

``TenantHostEviction`` replaces a ``HostIndex``'s ``HostEviction`` when the
cache runs with quotas (``CacheConfig.quotas``; ``radixcache.tenants.host``
swaps it in while the index is empty). The victims are the same (host
copies no lock or job holds, of nodes still on the device or without
children: ``radixcache.tiers.host_eviction``); their heap entries are kept
per tenant::

    heaps[tenant] = [(*policy.key(node), seq, node), ...]    lazily pruned

so a tenant's own victims come out in its policy order without looking at
anyone else's (``first_of``), and a pass across tenants takes, at each step,
the policy-first victim among the tenants it may take from (``first``, one
look at the front of each tenant's heap). Parked nodes (in use when they
came out) are shared by all tenants, as few as without quotas, and go back
into their tenant's heap at the next ``refresh``. The invariant and its
check are ``HostEviction``'s. Owner thread only; mutates only itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from radixcache.tenants.ledger import TenantLedger
from radixcache.tenants.quota import TenantKey
from radixcache.tiers.host_eviction import HostEviction
from radixcache.tree.node import Node
from radixcache.tree.policies import EvictionPolicy

Entry = tuple[object, ...]  # (*policy key, seq, node)


class TenantHostEviction(HostEviction):
    """Nodes with host copies in policy order, a heap per tenant."""

    def __init__(self, policy: EvictionPolicy, ledger: TenantLedger) -> None:
        super().__init__(policy)
        self.ledger = ledger
        self.heaps: dict[TenantKey, list[Entry]] = {}  # tenant -> its entries

    # ------------------------------------------------------------------ heaps
    def _push(self, node: Node) -> None:
        s = next(self._count)
        self.seq[node] = s
        key = self.ledger.key(node.namespace)
        heap = self.heaps.get(key)
        if heap is None:
            heap = self.heaps[key] = []
        heapq.heappush(heap, (*self.policy.key(node), s, node))

    def clear(self) -> None:
        super().clear()
        self.heaps.clear()

    def _entry_count(self) -> int:
        return sum(len(heap) for heap in self.heaps.values())

    def _entries(self) -> Iterator[Entry]:
        for heap in self.heaps.values():
            yield from heap

    def _rebuild(self) -> None:
        key, tenant = self.policy.key, self.ledger.key
        heaps: dict[TenantKey, list[Entry]] = {}
        for node in self.seq:
            self.seq[node] = s = next(self._count)
            heaps.setdefault(tenant(node.namespace), []).append((*key(node), s, node))
        for heap in heaps.values():
            heapq.heapify(heap)
        self.heaps = heaps

    # ------------------------------------------------------------------ victims
    def _front_of(self, tenant: TenantKey) -> Entry | None:
        """``tenant``'s first victim entry, left in its heap (an emptied heap goes)."""
        heap = self.heaps.get(tenant)
        if heap is None:
            return None
        entry = self._front(heap)
        if entry is None:
            del self.heaps[tenant]
        return entry

    def first_of(self, tenant: TenantKey) -> Node | None:
        """``tenant``'s policy-first victim now (not taken), or None."""
        entry = self._front_of(tenant)
        return None if entry is None else entry[-1]  # type: ignore[return-value]

    def first(self, blocked: set[TenantKey]) -> tuple[TenantKey, Node] | None:
        """The policy-first victim of every tenant not in ``blocked`` (not
        taken), with its tenant; None if there is none."""
        best: tuple[TenantKey, Entry] | None = None
        for tenant in list(self.heaps):
            if tenant in blocked:
                continue
            entry = self._front_of(tenant)
            if entry is not None and (best is None or entry < best[1]):
                best = (tenant, entry)
        if best is None:
            return None
        node = best[1][-1]
        assert isinstance(node, Node)
        return best[0], node

    def take(self, tenant: TenantKey) -> Node:
        """Untrack and return the victim ``first_of(tenant)`` or ``first``
        just found for ``tenant`` (the caller drops its host copy)."""
        return self._take(self.heaps[tenant])

    def victims(self) -> Iterator[Node]:
        """Every tenant's victims, in policy order across tenants (no floor
        holds here: ``HostQuota`` passes are the ones that keep floors)."""
        self.refresh()
        while (pick := self.first(set())) is not None:
            yield self.take(pick[0])

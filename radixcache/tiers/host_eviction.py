"""Host eviction: which host copies go first, found without walking the tree.

A host copy may be dropped when its node is a **victim**: it has a host
copy, no lock (``lock_ref == 0``), no job holds it (``holds == 0``), and it
is still on the device or has no children (dropping the last copy of an
inner node would orphan its children). Victims go in the tree's eviction
policy order (radixcache/tree/policies.py).

``HostEviction`` keeps the nodes with host copies in a lazy heap ordered by
the policy, as the device's eviction does (radixcache/tree/eviction.py)::

    heap entry = (*policy.key(node), seq, node)      flat: compares are on ints
    live       = seq == self.seq[node]               older entries are skipped

A node is **tracked** when it has a live entry (``seq``) or is **parked**
(``parked``: it came out of the heap while a lock or a job held it; such
nodes are few, those live requests and jobs use, and go back into the heap
at the start of the next eviction that finds them free). An entry whose key
went stale (the node was used since) comes out early, since policy keys
never decrease, and is pushed again with its key of now. A node that comes
out as an inner node without device pages is no victim and is untracked: it
becomes one only when its last child leaves (``HostTiers.evict_host_copy``
tracks the parent of every leaf it removes) or when it gets device pages
again (a load lands, an insert adopts it: both track it). The invariant,
checked by ``check_integrity``::

    every node that is a victim now is tracked

Cost: ``take`` pops O(victims + stale entries) entries at O(log n) each, plus
one look at each parked node; nothing walks the tree. Owner thread only;
mutates only itself (``HostIndex`` drops the copies it hands out). With
quotas, ``radixcache.tenants.host_eviction.TenantHostEviction`` keeps the
same victims in one heap per tenant (``_push``, ``_rebuild``, ``_entries``
are what it replaces).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator

from radixcache.tree.node import Node
from radixcache.tree.policies import EvictionPolicy


def is_victim(node: Node) -> bool:
    """Whether ``node``'s host copy may be dropped now (see the module docstring)."""
    return (
        node.host is not None
        and node.lock_ref == 0
        and node.holds == 0
        and (node.device is not None or not node.children)
    )


class HostEviction:
    """Nodes with host copies in policy order (see the module docstring)."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.heap: list[tuple[object, ...]] = []  # (*key, seq, node), lazily pruned
        self.seq: dict[Node, int] = {}  # node -> seq of its live heap entry
        self.parked: set[Node] = set()  # came out locked or held: back in at the next take
        self._count = itertools.count()  # entry sequence numbers (tie-breaker)

    def __len__(self) -> int:
        """Tracked nodes."""
        return len(self.seq) + len(self.parked)

    def track(self, node: Node) -> None:
        """Make sure ``node`` (with a host copy) has a live heap entry."""
        if node.host is None or node in self.seq:
            return
        self.parked.discard(node)
        self._push(node)

    def track_all(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            self.track(node)

    def untrack(self, node: Node) -> None:
        """``node``'s host copy went (its heap entry goes stale)."""
        self.seq.pop(node, None)
        self.parked.discard(node)

    def clear(self) -> None:
        self.heap.clear()
        self.seq.clear()
        self.parked.clear()

    def _push(self, node: Node) -> None:
        s = next(self._count)
        self.seq[node] = s
        heapq.heappush(self.heap, (*self.policy.key(node), s, node))

    def victims(self) -> Iterator[Node]:
        """Victims in policy order, lazily: each one yielded is untracked (the
        caller drops its host copy before asking for the next one)."""
        self.refresh()
        heap = self.heap
        while self._front(heap) is not None:
            yield self._take(heap)

    def refresh(self) -> None:
        """Before a pass of takes: parked nodes that are free again go back
        into the heap; a heap of mostly superseded entries is rebuilt."""
        self._unpark()
        if self._entry_count() > 2 * len(self.seq) + 64:
            self._rebuild()  # mostly superseded entries: cheaper to start over

    def _front(self, heap: list[tuple[object, ...]]) -> tuple[object, ...] | None:
        """The first entry of ``heap`` whose node is a victim now, left in
        ``heap``; None if there is none. Entries before it are taken out on
        the way: superseded ones dropped, stale keys pushed again with their
        key of now, nodes in use parked, inner host-only nodes untracked."""
        seq, key = self.seq, self.policy.key
        while heap:
            entry = heap[0]
            node = entry[-1]
            assert isinstance(node, Node)
            if seq.get(node) != entry[-2]:
                heapq.heappop(heap)  # superseded by a newer entry, or untracked
                continue
            if key(node) != entry[:-2]:
                heapq.heappop(heap)
                self._push(node)  # used since it was pushed: back with its key of now
                continue
            if node.host is not None and not (node.lock_ref or node.holds) and (
                node.device is not None or not node.children
            ):
                return entry
            heapq.heappop(heap)
            del seq[node]
            if node.host is not None and (node.lock_ref or node.holds):
                self.parked.add(node)  # in use: back at the next take that finds it free
            # else: no copy, or an inner host-only node (tracked again when it can go)
        return None

    def _take(self, heap: list[tuple[object, ...]]) -> Node:
        """Pop the victim ``_front(heap)`` found, untracked."""
        node = heapq.heappop(heap)[-1]
        assert isinstance(node, Node)
        del self.seq[node]
        return node

    def _entry_count(self) -> int:
        return len(self.heap)

    def _entries(self) -> Iterator[tuple[object, ...]]:
        return iter(self.heap)

    def _unpark(self) -> None:
        """Parked nodes that no lock or job holds any more go back into the heap."""
        if not self.parked:
            return
        for node in [n for n in self.parked if not (n.lock_ref or n.holds)]:
            self.parked.discard(node)
            if node.host is not None:
                self._push(node)

    def _rebuild(self) -> None:
        key = self.policy.key
        heap = []
        for node in self.seq:
            self.seq[node] = s = next(self._count)
            heap.append((*key(node), s, node))
        heapq.heapify(heap)
        self.heap = heap

    def check_integrity(self, nodes: Iterable[Node]) -> None:
        """Every victim among ``nodes`` (every tree node) is tracked; every
        tracked node has a host copy and a heap entry of its own."""
        for node in nodes:
            if is_victim(node):
                assert node in self.seq or node in self.parked, f"{node!r}: a victim not tracked"
        live = {entry[-2] for entry in self._entries()}
        for node, s in self.seq.items():
            assert node.host is not None, f"{node!r}: tracked without a host copy"
            assert s in live, f"{node!r}: tracked without a heap entry"
        assert not (self.parked & self.seq.keys()), "a node both parked and in the heap"
        for node in self.parked:
            assert node.host is not None, f"{node!r}: parked without a host copy"

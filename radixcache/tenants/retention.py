"""Retention on the device and host tiers: a tenant's pages live at most
``TenantQuota.ttl_s`` seconds from when they were first cached.

``Retention`` belongs to one cache (owner thread only). It learns when each
node was first cached from the tree's residency reports (``RetentionRecorder``
wraps the cache's recorder and notes the first report of every node of a
tenant with a TTL), and keeps one heap per tenant ordered by that time, so an
expiry pass costs O(expired nodes x log n), never a walk of the tree.

``expire()`` runs at the start of every ``admit`` and ``poll``: a node past
its deadline leaves the tree with its whole subtree (what is below it cannot
be matched without it) through ``NodeRemoval.cut``: device pages freed, host
copies released, each removal recorded like any other (``BlockRemoved`` per
medium). A node a live request or a job in flight still holds cannot go yet:
it is *masked* (``cut_match`` ends every later match before it, and a request
whose match it cut keeps its pages private, so nothing it adopts is the
expired KV) and cut again on each pass until nothing holds it.

Times: a node is dated by the first report of its pages (its insert, or the
load that brought it in); the two pieces of a split share the date (they share
``uid``); pages appended to a leaf later count from the leaf's date (they
expire early, never late). Pages read back from storage are dated when they
land; storage records carry the deadline they were written with
(``PutMeta.expires_at``, ``deadline``) and a store never serves one past it.
A TTL set at run time dates the tenant's pages already cached from that moment.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from radixcache.namespace import Namespace
from radixcache.tenants.quota import QuotaBook, TenantKey
from radixcache.tree.node import MatchResult, Node, PageIds, concat_pages

if TYPE_CHECKING:
    from radixcache.events.types import KvEvent
    from radixcache.recorder import EventSink
    from radixcache.tenants.ledger import TenantLedger
    from radixcache.tree.radix_tree import RadixTree

Clock = Callable[[], float]
EVERY: Final = object()  # ``expire``: every tenant
Entry = tuple[float, int, int, Node]  # (first cached, uid, push number: ties never compare nodes, node)


class Retention:
    """TTL deadlines of one cache's tree. Owner thread only."""

    def __init__(self, book: QuotaBook, clock: Clock, ledger: TenantLedger | None = None) -> None:
        self.book = book
        self.clock = clock
        self.ledger = ledger
        self.tree: RadixTree | None = None  # bound by the cache once built
        self.free: Callable[[PageIds], None] = lambda pages: None  # gives device pages back
        self.born: dict[int, float] = {}  # uid -> when the node was first cached
        self._heaps: dict[TenantKey, list[Entry]] = {}
        self._ttl_tenants: set[TenantKey] = set()  # tenants with a TTL now
        self._masked: dict[int, Node] = {}  # uid -> expired node still held
        self._default_ttl = False  # tenants not listed have a TTL
        self._dated_default = False  # ... and their cached nodes were dated
        self.expired_pages = 0  # device + host pages removed past their TTL
        self._compact_at = 4096  # entries past which stale ones are dropped
        self._seq = itertools.count()
        self.refresh()

    # ------------------------------------------------------------------ dates
    def refresh(self) -> None:
        """Re-read which tenants have a TTL (after a quota change). A tenant
        given one now has its cached nodes dated now."""
        book = self.book
        had = self._ttl_tenants
        now_ttl = {k for k, q in book.items() if q.ttl_s is not None}
        self._default_ttl = book.default.ttl_s is not None
        new = now_ttl - had
        self._ttl_tenants = now_ttl
        tree = self.tree
        if tree is None:
            return
        fresh = self._default_ttl and not self._dated_default
        self._dated_default = self._default_ttl
        if new or fresh:
            now = self.clock()
            for root in tree.removal.roots.values():
                key = root.namespace.tenant
                if key in new or (fresh and self.ttl(key) is not None):
                    for node in tree.removal.subtree(root):
                        if node.parent is not None:
                            self._date(node, key, now)

    def ttl(self, key: TenantKey) -> float | None:
        return self.book.get(key).ttl_s

    @property
    def active(self) -> bool:
        """Some tenant has a TTL (else reports are not even looked at)."""
        return self._default_ttl or bool(self._ttl_tenants)

    def noted(self, node: Node) -> None:
        """``node``'s pages were reported resident: date it if it is new."""
        uid = node.uid
        if uid in self.born or node.parent is None or uid in self._masked:
            return  # dated already, a root, or past its TTL (held): never dated again
        ledger = self.ledger
        key = node.namespace.tenant if ledger is None else ledger.key(node.namespace)
        if self.book.get(key).ttl_s is None:
            return
        self._date(node, key, self.clock())

    def _date(self, node: Node, key: TenantKey, now: float) -> None:
        if node.uid in self.born or node.uid in self._masked:
            return
        self.born[node.uid] = now
        heapq.heappush(self._heaps.setdefault(key, []), (now, node.uid, next(self._seq), node))

    def cap(self, node: Node, deadline: float | None) -> None:
        """``node`` came from storage, whose record expires at ``deadline``
        (None: unknown or none): date it no later than that deadline minus the
        tenant's TTL, so reading a page back never extends its life."""
        ttl = self.ttl(node.namespace.tenant)
        if deadline is None or ttl is None:
            return
        self.noted(node)
        born = self.born.get(node.uid)
        if born is not None and deadline - ttl < born:
            self.born[node.uid] = deadline - ttl
            heapq.heappush(self._heaps.setdefault(node.namespace.tenant, []),
                           (deadline - ttl, node.uid, next(self._seq), node))

    def deadline(self, nodes: Sequence[Node]) -> float | None:
        """When the earliest of ``nodes`` (one namespace) expires; None: never.
        A node of a tenant with a TTL that has no date any more is past it
        (its entry left the heap: expired, held then): now."""
        ttl = self.ttl(nodes[0].namespace.tenant)
        if ttl is None:
            return None
        born = self.born
        dates = [born.get(n.uid) for n in nodes]
        if None in dates:
            return self.clock()
        return min(dates) + ttl  # type: ignore[type-var, operator]

    # ------------------------------------------------------------------ expiry
    def expire(self, only: TenantKey | object = EVERY) -> int:
        """Remove every node past its deadline that nothing holds; mask the
        held ones; ``only``: of that tenant alone (a quota change, which
        touches no one else). Returns the device pages freed."""
        if not self._heaps and not self._masked:
            return 0
        tree = self.tree
        assert tree is not None
        if len(self.born) > self._compact_at:
            self._compact()
        now = self.clock()
        dev: list[PageIds] = []
        for uid, node in list(self._masked.items()):  # held ones from earlier passes
            if only is not EVERY and node.namespace.tenant != only:
                continue
            if node.forgotten or not tree.below.is_attached(node) or self._cut(node, dev):
                del self._masked[uid]
        for key, heap in self._heaps.items():
            ttl = self.ttl(key)
            if ttl is None or (only is not EVERY and key != only):
                continue
            limit = now - ttl
            while heap and heap[0][0] <= limit:
                born, uid, _, node = heapq.heappop(heap)
                if self.born.get(uid) != born:
                    continue  # superseded by an earlier date (``cap``), or gone
                del self.born[uid]
                top = _top(node)
                if top.forgotten or not tree.below.is_attached(top):
                    continue
                if not self._cut(top, dev):
                    self._masked[uid] = top
        pages = concat_pages(dev)
        if pages.size:
            self.free(pages)
        return int(pages.size)

    def _cut(self, top: Node, dev: list[PageIds]) -> bool:
        tree = self.tree
        assert tree is not None
        before = tree.device_pages + _host_pages(tree)
        done = tree.removal.cut(top, dev)
        gone = before - tree.device_pages - _host_pages(tree)
        self.expired_pages += gone
        if self.ledger is not None and gone:
            self.ledger.counters_of(top.namespace).expired_pages += gone
        return done

    def clear(self) -> None:
        """Forget every date (the cache was reset: every node is gone)."""
        self.born.clear()
        self._heaps.clear()
        self._masked.clear()

    def _compact(self) -> None:
        """Drop the entries of nodes no longer in the tree (evicted, forgotten):
        they would otherwise stay until their deadline. Amortized O(1) per entry."""
        tree = self.tree
        assert tree is not None
        def live(node: Node) -> bool:
            top = _top(node)
            return not top.forgotten and tree.below.is_attached(top)

        for heap in self._heaps.values():
            kept = [e for e in heap if live(e[3])]
            for e in heap:
                if not live(e[3]):
                    self.born.pop(e[1], None)
            heap[:] = kept
            heapq.heapify(heap)
        self._compact_at = 2 * len(self.born) + 4096

    # ------------------------------------------------------------------ matches
    @property
    def masking(self) -> bool:
        return bool(self._masked)

    def cut_match(self, match: MatchResult) -> MatchResult | None:
        """``match`` ended before its first masked (expired, held) node;
        None if it has none."""
        masked = self._masked
        path: list[Node] = []
        n = match.last_device_node
        while n is not None and n.parent is not None:
            path.append(n)
            n = n.parent
        path.reverse()
        dev_nodes = len(path)
        path.extend(match.host_nodes)
        cut = next((i for i, node in enumerate(path) if node.uid in masked), None)
        if cut is None:
            return None
        if cut < dev_nodes:
            kept = path[:cut]
            pages = concat_pages([n.device for n in kept if n.device is not None])
            length = sum(int(n.key.size) for n in kept)
            return MatchResult(length, pages, kept[-1] if kept else None)
        hosts = tuple(path[dev_nodes:cut])
        return MatchResult(match.device_len, match.device_pages, match.last_device_node,
                           sum(int(n.key.size) for n in hosts), hosts)


def _top(node: Node) -> Node:
    """The highest piece of ``node``'s splits (its ancestors of the same uid:
    the upper pieces keep the uid and the date). The heap holds the piece that
    kept the node's identity, the lowest; it may have left the tree (a leaf is
    evicted first) while the pieces above it are still there, and its parent
    link still leads to them."""
    uid = node.uid
    while node.parent is not None and node.parent.uid == uid:
        node = node.parent
    return node


def _host_pages(tree: RadixTree) -> int:
    return int(getattr(tree.lower, "host_pages", 0))


class RetentionRecorder:
    """The cache's recorder, with every residency report also shown to
    ``Retention`` (which dates new nodes of tenants with a TTL)."""

    def __init__(self, inner: EventSink, retention: Retention) -> None:
        self.inner = inner
        self.retention = retention

    @property
    def unknown_removals(self) -> int:
        return self.inner.unknown_removals

    @unknown_removals.setter
    def unknown_removals(self, value: int) -> None:
        self.inner.unknown_removals = value

    def stored(self, node: Node, start: int, count: int, medium: str) -> None:
        if self.retention.active:
            self.retention.noted(node)
        self.inner.stored(node, start, count, medium)

    def removed(self, node: Node, medium: str) -> None:
        self.inner.removed(node, medium)

    def removed_keys(self, keys: Sequence[bytes], medium: str) -> None:
        self.inner.removed_keys(keys, medium)

    def cleared(self) -> None:
        self.inner.cleared()

    def stored_ids(self, block_ids: list[int], parent_id: int | None,
                   tokens: npt.NDArray[np.int32], namespace: Namespace, medium: str,
                   keys: bytes = b"") -> None:
        self.inner.stored_ids(block_ids, parent_id, tokens, namespace, medium, keys)

    def take(self) -> list[KvEvent]:
        return self.inner.take()

"""Device eviction: the candidates, their order, and dropping a victim.

``DeviceEviction`` belongs to one ``RadixTree`` (built by it, driven by its
owner thread). It keeps the eviction candidates, the unlocked nodes with
device pages and no device-resident child, in a lazy heap ordered by the
``EvictionPolicy`` (radixcache/tree/policies.py)::

    heap entry = (*policy.key(node), seq, node)      flat: compares are on ints

Only the entry whose ``seq`` equals ``node.heap_seq`` is live; older ones are
dropped when popped. A live entry whose key went stale (the node was touched
since) comes out early, since policy keys never decrease, and is pushed again.

The tree keeps the candidates current as it goes (``update`` when a node
may have become one, ``push`` when a candidate's key changed, a discard from
``candidates`` on a lock or when a node gains a device child).

What it mutates: its own candidate set and heap, ``node.heap_seq``; and, when
it drops a victim (``drop_device``), the victim's ``device``, its parent's
``device_children``, the tree's ``device_pages``/``evictable_pages``
counters, and the tree's structure (a victim not resident below the device
leaves the tree, with its descendants, through the tree's ``NodeRemoval``).
A victim may be split first (page-granular eviction, ``_tail_victim``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Final, Protocol

from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.tree.policies import EvictionPolicy
from radixcache.tree.lower import LowerTiers
from radixcache.tree.node import EvictResult, Node, PageIds, concat_pages
from radixcache.tree.recording import Recorder
from radixcache.tree.removal import NodeRemoval, PageLedger

GPU: Final = "GPU"  # the device medium, as the recorder names it


class EvictedTree(Protocol):
    """What eviction uses of the tree it belongs to (``RadixTree``)."""

    page_size: int
    ledger: PageLedger | None
    lower: LowerTiers
    recorder: Recorder
    device_pages: int  # counters eviction keeps exact as it drops pages
    evictable_pages: int

    @property
    def removal(self) -> NodeRemoval: ...

    def split(self, node: Node, pages: int) -> Node: ...


class DeviceEviction:
    """Eviction candidates of one tree, in policy order. Owner thread only."""

    def __init__(self, tree: EvictedTree, policy: EvictionPolicy) -> None:
        self.tree = tree
        self.policy = policy
        self.candidates: set[Node] = set()  # unlocked device nodes without device children
        self.heap: list[tuple[object, ...]] = []  # (*key, seq, node) entries, see above
        self._seq = itertools.count()  # tie-breaker for heap entries

    # ------------------------------------------------------------------ candidates
    def update(self, node: Node) -> None:
        """Add ``node`` to the candidates if it qualifies."""
        if (
            node.lock_ref == 0
            and node.device is not None
            and node.device_children == 0
            and node.parent is not None
            and node not in self.candidates
        ):
            self.candidates.add(node)
            self.push(node)

    def push(self, node: Node) -> None:
        """Give ``node`` a fresh heap entry (its key may have changed)."""
        seq = next(self._seq)
        node.heap_seq = seq
        heapq.heappush(self.heap, (*self.policy.key(node), seq, node))

    def clear(self) -> None:
        self.candidates.clear()
        self.heap.clear()

    def entries(self) -> list[tuple[object, ...]]:
        """Every heap entry, superseded ones included (integrity checks)."""
        return self.heap

    def _rebuild_heap(self) -> None:
        key = self.policy.key
        seq = self._seq
        heap = []
        for node in self.candidates:
            node.heap_seq = s = next(seq)
            heap.append((*key(node), s, node))
        heapq.heapify(heap)
        self.heap = heap

    # ------------------------------------------------------------------ eviction
    def evict(
        self, num_pages: int, before_drop: Callable[[Node], None] | None = None
    ) -> EvictResult:
        """Drop device pages of unlocked leaves until ``num_pages`` are freed.

        Leaves go in policy order; a parent whose last device child went
        becomes a candidate. Eviction is page-granular where it can be: of
        the last victim, only the tail pages still wanted are dropped when it
        is a plain device leaf (see ``_tail_victim``); otherwise whole nodes
        go, and more pages than asked may come back. ``before_drop(node)``
        runs first for each victim (the tiers back it up there when their
        policy says so). A victim keeps its
        place in the tree if it is resident below the device; otherwise it is
        removed, with its descendants (the lower tiers are told through
        ``discard``). Returns the released device page ids (the caller frees
        them in its pool). With the compiled core, the loop below runs in C
        (``evict_loop``, radixcache/native/_core.pyx), the same steps.
        """
        if _evict_loop is not None:
            return EvictResult(_evict_loop(self, num_pages, before_drop))
        dev: list[PageIds] = []
        count = 0
        if len(self.heap) > len(self.candidates) + 64:
            self._rebuild_heap()  # mostly superseded entries: cheaper to start over
        heap = self.heap
        key = self.policy.key
        tree = self.tree
        lower = tree.lower
        skipped: list[Node] = []
        while count < num_pages and heap:
            entry = heapq.heappop(heap)
            node = entry[-1]
            assert isinstance(node, Node)
            if entry[-2] != node.heap_seq or node not in self.candidates:
                continue  # superseded by a newer entry, or no longer a candidate
            if key(node) != entry[:-2]:
                self.push(node)  # touched since it was pushed
                continue
            node = self._tail_victim(node, num_pages - count)
            if before_drop is not None:
                before_drop(node)
            if node.children and not lower.resident(node) and tree.removal.held_below(node):
                skipped.append(node)  # descendants held by jobs: not now
                continue
            pages = self.drop_device(node)
            dev.append(pages)
            count += pages.size
        for node in skipped:  # still candidates: give them their heap entry back
            if node in self.candidates:
                self.push(node)
        return EvictResult(concat_pages(dev))

    def _tail_victim(self, node: Node, short: int) -> Node:
        """The part of candidate ``node`` to evict when ``short`` pages are
        still wanted: ``node`` itself, or, when it holds more than that and is
        a plain device leaf (no children, nothing below the device refers to
        it: no copy, no job), its last ``short`` pages, cut off by a split.

        Page-granular eviction: a request for n pages frees about n pages
        instead of a whole multi-page leaf. The head keeps the leaf's policy
        fields (a split copies them), so it stays where the leaf stood in
        eviction order and goes next if more pages are wanted; the tail pages
        go first because no other sequence can use them without the head.
        """
        assert node.device is not None
        have = int(node.device.size)
        if short >= have or node.children or not self.tree.lower.bare(node):
            return node
        self.tree.split(node, have - short)  # ``node`` keeps its identity: now the tail
        return node

    def drop_device(self, node: Node) -> PageIds:
        """Remove ``node``'s device residency (it must be an unlocked device leaf).

        Returns its device page ids. A node not resident below the device
        leaves the tree, with its descendants (none may be held by a job).
        """
        tree = self.tree
        pages = node.device
        parent = node.parent
        assert pages is not None and parent is not None, "drop_device on a node without pages"
        assert node.lock_ref == 0 and node.device_children == 0, "drop_device on a protected node"
        tree.recorder.removed(node, GPU)
        node.device = None
        tree.device_pages -= pages.size
        tree.evictable_pages -= pages.size
        if tree.ledger is not None:
            tree.ledger.sub_device(node.namespace, int(pages.size), True)
        self.candidates.discard(node)
        parent.device_children -= 1
        if not tree.lower.resident(node):  # (so it holds nothing below the device)
            removal = tree.removal
            if node.children:
                for child in list(node.children.values()):
                    assert child.lock_ref == 0, "a locked node under a victim"
                    del node.children[child.key[: tree.page_size].tobytes()]
                    for gone in removal.subtree(child):
                        removal.discount(gone, [])
            removal.unlink(node)
        self.update(parent)
        return pages


_evict_loop = None if native_core is None else native_core.evict_loop
if native_core is not None:  # the same steps, compiled (radixcache/native/_core.pyx)
    DeviceEviction.drop_device = native_core.drop_device  # type: ignore[method-assign]
    DeviceEviction.update = native_core.eviction_update  # type: ignore[method-assign]
    DeviceEviction.push = native_core.eviction_push  # type: ignore[method-assign]
    native_core.bind_eviction(DeviceEviction)  # (its own calls of these skip the method lookup)

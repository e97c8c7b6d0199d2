"""The page-granular token radix tree.

Every namespace has its own root; a node holds a run of whole pages::

    root(ns) ── [p0 p1 p2]  ── [p3 p4]        each [..] is one node: its tokens
                    │                          (int32, len % P == 0) and, per
                    └─────── [p3' p4' p5']     tier, one page id per page

Children are keyed by the bytes of their first page, so a step down the tree
is one dict lookup and one vectorized comparison of the whole run; no Python
object exists per page or per token.

The tree is the index, device residency, device eviction and locks. It
knows nothing of CUDA, storage, events or tier jobs: page ids are opaque
arrays handed in by the caller and handed back on eviction, and the caller
frees them. What lives below the device (host copies, stored pages, the holds
of jobs in flight) is the business of the ``LowerTiers`` given at
construction, which the tree only asks (is this node resident below? held by
a job?) and tells (a node was split, or left the tree). The ``Recorder``
given at construction hears of every device residency change. It is driven by
one owner thread and starts no thread.

Forgetting a namespace detaches its root: pages that requests or jobs still
hold stay allocated under the detached root, invisible to ``match`` and
``insert``, until ``sweep_detached`` finds them free. Their removal is
recorded at the forget; marked ``forgotten``, they report nothing after.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Final

import numpy as np

from radixcache.eviction import EvictionPolicy
from radixcache.lower_tiers import LowerTiers, NoLowerTiers
from radixcache.hashing import KEY_BYTES
from radixcache.namespace import Namespace
from radixcache.event_ids import EventIds
from radixcache.page_keys import PageKeys
from radixcache.tree_check import check_tree
from radixcache.recorder import NullRecorder, Recorder
from radixcache.node import (
    EMPTY_PAGES,
    EvictResult,
    ForgetResult,
    InsertResult,
    MatchResult,
    Node,
    PageIds,
    TokenArray,
)


GPU: Final = "GPU"  # the device medium, as the recorder names it


def _concat(parts: list[PageIds]) -> PageIds:
    if not parts:
        return EMPTY_PAGES.copy()
    if len(parts) == 1:
        return parts[0].copy()
    return np.concatenate(parts)


class RadixTree:
    """Index of cached token prefixes, page-granular, per namespace.

    Counters (exact at every moment):
    ``device_pages`` (device pages held by nodes), ``evictable_pages`` (those
    in unlocked nodes), ``protected_pages`` (those in locked nodes),
    ``node_count`` (non-root nodes, detached ones included).
    """

    def __init__(
        self,
        page_size: int,
        policy: EvictionPolicy,
        recorder: Recorder | None = None,
        lower: LowerTiers | None = None,
    ) -> None:
        if not isinstance(page_size, int) or page_size <= 0 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a positive power of two, got {page_size!r}")
        self.page_size = page_size
        self.policy = policy
        self._roots: dict[Namespace, Node] = {}
        self._tick = 0  # logical clock: +1 per match/insert, stamps nodes
        self._seq = itertools.count()  # tie-breaker for heap entries
        # Eviction candidates: unlocked nodes with device pages and no
        # device-resident child. ``_heap`` holds (key, seq, node) entries; only
        # the entry whose seq equals ``node.heap_seq`` is live, older ones are
        # dropped when popped. A live entry whose key went stale (the node was
        # touched) comes out early, since policy keys never decrease, and is
        # re-pushed.
        self._evictable: set[Node] = set()
        self._heap: list[tuple[object, ...]] = []  # (*key, seq, node): flat, so compares are on ints
        self._detached: list[Node] = []  # roots of forgotten namespaces still holding pages
        self.device_pages = 0
        self.evictable_pages = 0
        self.node_count = 0
        self.keys = PageKeys(page_size)
        self.ids = EventIds(page_size)  # event ids of nodes (store jobs write them into records)
        self.recorder: Recorder = NullRecorder() if recorder is None else recorder
        self.lower: LowerTiers = NoLowerTiers() if lower is None else lower

    # ------------------------------------------------------------------ lookup
    @property
    def protected_pages(self) -> int:
        return self.device_pages - self.evictable_pages

    def match(self, namespace: Namespace, tokens: TokenArray, priority: int = 0) -> MatchResult:
        """Longest cached prefix of ``tokens`` (whole pages only) in ``namespace``.

        ``tokens`` must be a validated 1-D int32 array. Mutates: stamps the
        matched nodes (recency, hit count, priority) and, when the match ends
        inside a node, splits that node at the page boundary so the result
        ends on a node. Cached content is never changed.
        """
        p = self.page_size
        n = tokens.size - tokens.size % p
        root = self._roots.get(namespace)
        if root is None or n == 0:
            return MatchResult(0, EMPTY_PAGES.copy(), None)
        self._tick += 1
        tick = self._tick
        node = root
        pos = 0
        device_len = 0
        device_parts: list[PageIds] = []
        last_device: Node | None = None
        host_nodes: list[Node] = []
        while pos < n:
            child = node.children.get(tokens[pos : pos + p].tobytes())
            if child is None:
                break
            matched = self._common_len(child.key, tokens, pos, n)
            if matched < child.key.size:
                child = self._split(child, matched // p)
            child.last_access = tick
            child.hit_count += 1
            if priority > child.priority:
                child.priority = priority
            if child.device is not None and not host_nodes:
                device_parts.append(child.device)
                device_len += matched
                last_device = child
            elif self.lower.resident(child):
                host_nodes.append(child)
            else:  # the device part ended and this node is not on the host
                break
            pos += matched
            node = child
        return MatchResult(
            device_len=device_len,
            device_pages=_concat(device_parts),
            last_device_node=last_device,
            host_len=pos - device_len,
            host_nodes=tuple(host_nodes),
        )

    def peek(self, namespace: Namespace, tokens: TokenArray) -> int:
        """Tokens of the longest device-resident cached prefix of ``tokens``
        (whole pages) in ``namespace``.

        Read-only: no lock, no recency or hit stamp, no split; what ``match``
        would find on the device, for a scheduler that only wants the length.
        """
        p = self.page_size
        n = tokens.size - tokens.size % p
        node = self._roots.get(namespace)
        pos = 0
        while node is not None and pos < n:
            child = node.children.get(tokens[pos : pos + p].tobytes())
            if child is None or child.device is None:
                break
            matched = self._common_len(child.key, tokens, pos, n)
            pos += matched
            node = child if matched == child.key.size else None
        return pos

    def _common_len(self, key: TokenArray, tokens: TokenArray, pos: int, n: int) -> int:
        """Tokens (page-aligned) that ``key`` shares with ``tokens[pos:n]``."""
        klen = key.size
        end = pos + klen
        if end <= n and (tokens[pos:end] == key).all():
            return klen
        m = min(klen, n - pos)
        eq = tokens[pos : pos + m] == key[:m]
        if eq.all():
            return m
        first_diff = int(np.argmin(eq))
        return first_diff - first_diff % self.page_size

    def _split(self, node: Node, pages: int) -> Node:
        """Cut ``node`` after ``pages`` pages; return the new upper node.

        The lower part keeps the identity of ``node`` (so locks and handles
        pointing at it stay valid); the upper part inherits its lock count.
        """
        p = self.page_size
        cut = pages * p
        parent = node.parent
        assert parent is not None and 0 < cut < node.key.size
        upper = Node(node.key[:cut], parent, node.namespace, node.uid)
        upper.device = None if node.device is None else node.device[:pages]
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        upper.hit_count = node.hit_count
        upper.priority = node.priority
        upper.forgotten = node.forgotten
        if node.keys is not None:  # may cover only a prefix of the node
            upper.keys = node.keys[: pages * KEY_BYTES]
            rest = node.keys[pages * KEY_BYTES :]
            node.keys = rest if rest else None
        if node.ids is not None:  # likewise for event block ids
            upper.ids = node.ids[:pages]
            node.ids = node.ids[pages:] if node.ids.size > pages else None
        node.key = node.key[cut:]
        if node.device is not None:
            node.device = node.device[pages:]
            upper.device_children = 1
        self.lower.split(upper, node, pages)
        parent.children[upper.key[:p].tobytes()] = upper
        upper.children = {node.key[:p].tobytes(): node}
        node.parent = upper
        self.node_count += 1
        return upper

    # ------------------------------------------------------------------ insert
    def insert(
        self, namespace: Namespace, tokens: TokenArray, pages: PageIds, priority: int = 0
    ) -> InsertResult:
        """Insert whole pages ``tokens`` whose KV sits in device ``pages``.

        Returns how many leading pages were already on the device (the caller
        owns ``pages[:existing_pages]`` still and must free them: the tree's
        own pages for them are in ``device_pages``). Every later page id in
        ``pages`` now belongs to the tree. A cached node that had lost its
        device copy (host-only) takes the caller's pages for it. Splits a
        node where the new sequence diverges inside it.
        """
        p = self.page_size
        total = tokens.size
        if total % p:
            raise ValueError(f"insert takes whole pages: {total} tokens is not a multiple of {p}")
        if pages.size * p != total:
            raise ValueError(f"{total} tokens need {total // p} pages, got {pages.size}")
        root = self._roots.get(namespace)
        if root is None:
            root = Node(tokens[:0].copy(), None, namespace, -1)
            self._roots[namespace] = root
        self._tick += 1
        tick = self._tick
        node = root
        pos = 0
        existing = 0
        parts: list[PageIds] = []
        new_nodes: list[Node] = []
        offsets: list[int] = []
        while pos < total:
            child = node.children.get(tokens[pos : pos + p].tobytes())
            if child is None:
                break
            matched = self._common_len(child.key, tokens, pos, total)
            if child.device is None and not self.lower.adoptable(child):
                break  # being loaded back: no adoption; the insert stops here
            if matched < child.key.size:
                child = self._split(child, matched // p)
            child.last_access = tick
            if priority > child.priority:
                child.priority = priority
            if child in self._evictable:
                self._push(child)  # its key changed: keep the heap fresh
            if child.device is None:
                self._attach_device(child, pages[pos // p : (pos + matched) // p].copy())
                self.recorder.stored(child, 0, matched // p, GPU)
                new_nodes.append(child)
                offsets.append(pos // p)
            elif existing * p == pos:
                existing += matched // p
            assert child.device is not None
            parts.append(child.device)
            pos += matched
            node = child
        blocked = pos < total and (
            (child := node.children.get(tokens[pos : pos + p].tobytes())) is not None
        )
        if blocked:  # stopped at a node being loaded back: the rest stays with the caller
            return InsertResult(existing, _concat(parts), node, new_nodes, offsets, pos // p)
        if pos < total and self._can_extend(node):
            old_pages = node.key.size // p
            self._extend_leaf(node, tokens[pos:], pages[pos // p :])
            self.recorder.stored(node, old_pages, (total - pos) // p, GPU)
            new_nodes.append(node)
            offsets.append(pos // p)
            parts.append(pages[pos // p :].copy())
        elif pos < total:
            leaf = Node(tokens[pos:].copy(), node, namespace, tick)
            leaf.last_access = tick
            leaf.priority = priority
            node.children[tokens[pos : pos + p].tobytes()] = leaf
            self.node_count += 1
            self._attach_device(leaf, pages[pos // p :].copy())
            self.recorder.stored(leaf, 0, (total - pos) // p, GPU)
            new_nodes.append(leaf)
            offsets.append(pos // p)
            parts.append(leaf.device)  # type: ignore[arg-type]
            node = leaf
        return InsertResult(existing, _concat(parts), node, new_nodes, offsets, total // p)

    def _can_extend(self, node: Node) -> bool:
        """Whether new pages may be appended to ``node`` itself.

        Path compression: a chat that grows turn by turn would otherwise
        become a chain of one-child nodes, each costing a step on every
        match. Only a device-only, unlocked leaf is extended, so no lock,
        host copy, stored flag or job ever covers pages it was not taken for.
        """
        return (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and node.device is not None
            and self.lower.bare(node)
        )

    def _extend_leaf(self, node: Node, tokens: TokenArray, pages: PageIds) -> None:
        assert node.device is not None
        node.key = np.concatenate([node.key, tokens])
        node.device = np.concatenate([node.device, pages])
        self.device_pages += pages.size
        self.evictable_pages += pages.size

    def _attach_device(self, node: Node, pages: PageIds) -> None:
        """Give ``node`` (without device pages) its device pages."""
        parent = node.parent
        assert node.device is None and parent is not None
        node.device = pages
        self.device_pages += pages.size
        if node.lock_ref == 0:
            self.evictable_pages += pages.size
        parent.device_children += 1
        self._evictable.discard(parent)
        self._update_candidate(node)

    def _update_candidate(self, node: Node) -> None:
        """Add ``node`` to the eviction candidates if it qualifies."""
        if (
            node.lock_ref == 0
            and node.device is not None
            and node.device_children == 0
            and node.parent is not None
            and node not in self._evictable
        ):
            self._evictable.add(node)
            self._push(node)

    def _push(self, node: Node) -> None:
        seq = next(self._seq)
        node.heap_seq = seq
        heapq.heappush(self._heap, (*self.policy.key(node), seq, node))

    # ------------------------------------------------------------------ locks
    def lock(self, node: Node) -> None:
        """Protect ``node`` and its ancestors from device eviction (counted)."""
        n: Node | None = node
        while n is not None:
            if n.lock_ref == 0:
                if n.device is not None:
                    self.evictable_pages -= n.device.size
                self._evictable.discard(n)
            n.lock_ref += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        """Undo one ``lock(node)``. Raises ValueError if ``node`` is not locked."""
        if node.lock_ref <= 0:
            raise ValueError(f"unlock of a node that is not locked: {node!r}")
        n: Node | None = node
        while n is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0 and n.device is not None:
                self.evictable_pages += n.device.size
                self._update_candidate(n)
            n = n.parent

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
        them in its pool).
        """
        dev: list[PageIds] = []
        count = 0
        if len(self._heap) > len(self._evictable) + 64:
            self._rebuild_heap()  # mostly superseded entries: cheaper to start over
        heap = self._heap
        key = self.policy.key
        lower = self.lower
        skipped: list[Node] = []
        while count < num_pages and heap:
            entry = heapq.heappop(heap)
            node = entry[-1]
            assert isinstance(node, Node)
            if entry[-2] != node.heap_seq or node not in self._evictable:
                continue  # superseded by a newer entry, or no longer a candidate
            if key(node) != entry[:-2]:
                self._push(node)  # touched since it was pushed
                continue
            node = self._tail_victim(node, num_pages - count)
            if before_drop is not None:
                before_drop(node)
            if node.children and not lower.resident(node) and self._held_below(node):
                skipped.append(node)  # descendants held by jobs: not now
                continue
            pages = self.drop_device(node)
            dev.append(pages)
            count += pages.size
        for node in skipped:  # still candidates: give them their heap entry back
            if node in self._evictable:
                self._push(node)
        return EvictResult(_concat(dev))

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
        if short >= have or node.children or not self.lower.bare(node):
            return node
        self._split(node, have - short)  # ``node`` keeps its identity: now the tail
        return node

    def _rebuild_heap(self) -> None:
        key = self.policy.key
        seq = self._seq
        heap = []
        for node in self._evictable:
            node.heap_seq = s = next(seq)
            heap.append((*key(node), s, node))
        heapq.heapify(heap)
        self._heap = heap

    def drop_device(self, node: Node) -> PageIds:
        """Remove ``node``'s device residency (it must be an unlocked device leaf).

        Returns its device page ids. A node not resident below the device
        leaves the tree, with its descendants (none may be held by a job).
        """
        pages = node.device
        parent = node.parent
        assert pages is not None and parent is not None, "drop_device on a node without pages"
        assert node.lock_ref == 0 and node.device_children == 0, "drop_device on a protected node"
        self.recorder.removed(node, GPU)
        node.device = None
        self.device_pages -= pages.size
        self.evictable_pages -= pages.size
        self._evictable.discard(node)
        parent.device_children -= 1
        if not self.lower.resident(node):  # (so it holds nothing below the device)
            if node.children:
                for child in list(node.children.values()):
                    assert child.lock_ref == 0, "a locked node under a victim"
                    del node.children[child.key[: self.page_size].tobytes()]
                    for gone in self._subtree(child):
                        self._discount(gone, [])
            self._unlink(node)
        self._update_candidate(parent)
        return pages

    def _held_below(self, node: Node) -> bool:
        """True if a job in flight holds ``node`` or any descendant."""
        held = self.lower.held
        return any(held(n) for n in self._subtree(node))

    def _unlink(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None and not node.children, "removing an inner node"
        del parent.children[node.key[: self.page_size].tobytes()]
        self.node_count -= 1
        if parent.parent is None and not parent.children:
            if self._roots.get(parent.namespace) is parent:
                del self._roots[parent.namespace]
            elif parent in self._detached:
                self._detached.remove(parent)

    # ------------------------------------------------------------------ for the lower tiers
    def attach_device(self, node: Node, pages: PageIds) -> None:
        """Record that a ``node`` without device pages is back on the device
        in ``pages`` (a load from below finished).

        Its parent must be on the device already (load back in path order).
        """
        parent = node.parent
        assert parent is not None and (parent.parent is None or parent.device is not None), (
            "device residency must stay prefix-closed"
        )
        assert pages.size * self.page_size == node.key.size, "device pages do not cover the node"
        self._attach_device(node, pages)
        self.recorder.stored(node, 0, int(pages.size), GPU)

    def add_leaf(self, namespace: Namespace, parent: Node | None, tokens: TokenArray) -> Node | None:
        """Add a leaf of whole pages ``tokens`` with no device pages under
        ``parent`` (None: the namespace's root, created if missing). The caller
        makes it resident below the device at once. Returns None, changing
        nothing, if ``parent`` already has a child for the first page.
        """
        p = self.page_size
        assert tokens.size % p == 0 and tokens.size > 0
        if parent is None:
            parent = self._roots.get(namespace)
            if parent is None:
                parent = Node(tokens[:0].copy(), None, namespace, -1)
                self._roots[namespace] = parent
        first = tokens[:p].tobytes()
        if first in parent.children:
            return None
        self._tick += 1
        leaf = Node(tokens.copy(), parent, namespace, self._tick)
        leaf.forgotten = parent.forgotten
        parent.children[first] = leaf
        self.node_count += 1
        return leaf

    def remove_leaf(self, node: Node) -> None:
        """Remove a childless node without device pages whose copy below the
        device is gone (the lower tiers dropped it)."""
        assert node.device is None and not node.children and node.lock_ref == 0
        self._unlink(node)
        parent = node.parent
        assert parent is not None
        self._update_candidate(parent)

    def pieces(self, last: Node, pages: int) -> list[Node]:
        """The nodes, in path order, that now hold a run of ``pages`` pages
        ending with ``last``'s last page (a node split while a job was in
        flight became a chain of pieces)."""
        out: list[Node] = []
        p = self.page_size
        node: Node | None = last
        while pages > 0:
            assert node is not None and node.parent is not None, "job pages outside the tree"
            out.append(node)
            pages -= node.key.size // p
            node = node.parent
        assert pages == 0, "a job's run does not end on a node boundary"
        out.reverse()
        return out

    def is_attached(self, node: Node) -> bool:
        """True if ``node`` is still part of the tree, under a live (not
        forgotten) root."""
        parent = node.parent
        if parent is None:
            return self._roots.get(node.namespace) is node
        return (
            parent.children.get(node.key[: self.page_size].tobytes()) is node
            and self.is_attached(parent)
        )

    # ------------------------------------------------------------------ hashes
    def page_keys(self, node: Node) -> bytes:
        """16-byte chained keys of ``node``'s pages, concatenated (cached)."""
        return self.keys.page_keys(node)

    def parent_key(self, node: Node) -> bytes | None:
        """The key of the page before ``node``'s first page, None at a root."""
        return self.keys.parent_key(node)

    # ------------------------------------------------------------------ bulk
    def forget(self, namespace: Namespace) -> ForgetResult:
        """Remove every node of ``namespace`` that no lock or job holds.

        Held nodes (and so their ancestors) stay, under the namespace's root,
        which is detached: from now on ``match`` and ``insert`` see a fresh,
        empty namespace, and ``sweep_detached`` removes the held nodes once
        nothing holds them any more. Every page of the namespace is reported
        removed (from every medium) now, held ones included; the held nodes
        are marked ``forgotten`` and report nothing more, so a later removal
        cannot contradict the namespace's new pages (same keys).
        """
        root = self._roots.pop(namespace, None)
        if root is None:
            return ForgetResult(0, 0, EMPTY_PAGES.copy())
        dev: list[PageIds] = []
        pending = self._prune(root, dev)
        if root.children:
            self._detached.append(root)
            for kept in root.children.values():
                for node in self._subtree(kept):
                    if node.device is not None:
                        self.recorder.removed(node, GPU)
                    self.lower.forgotten(node)
                    node.forgotten = True
        root.forgotten = True
        d = _concat(dev)
        return ForgetResult(int(d.size), pending, d)

    def sweep_detached(self) -> PageIds:
        """Remove what no lock or job holds any more under forgotten roots;
        returns the device pages released (the caller frees them)."""
        if not self._detached:
            return EMPTY_PAGES
        dev: list[PageIds] = []
        for root in list(self._detached):
            self._prune(root, dev)
            if not root.children:
                self._detached.remove(root)
        return _concat(dev)

    @property
    def detached_count(self) -> int:
        """Roots of forgotten namespaces that still hold pages."""
        return len(self._detached)

    def _prune(self, root: Node, dev: list[PageIds]) -> int:
        """Remove every unheld subtree below ``root``; returns the device pages kept."""
        pending = 0
        stack = [root]
        while stack:
            node = stack.pop()
            for first, child in list(node.children.items()):
                if child.lock_ref > 0 or self._held_below(child):
                    if child.device is not None:
                        pending += child.device.size
                    stack.append(child)
                    continue
                del node.children[first]
                if child.device is not None:
                    node.device_children -= 1
                for gone in self._subtree(child):
                    self._discount(gone, dev)
            if node.parent is not None:
                self._update_candidate(node)  # it may have become a leaf
        return pending

    def _discount(self, node: Node, dev: list[PageIds]) -> None:
        """Forget an (unlocked) node's pages in the counters; collect its
        device pages; the lower tiers release the rest."""
        self.node_count -= 1
        self._evictable.discard(node)
        if node.device is not None:
            self.recorder.removed(node, GPU)
            self.device_pages -= node.device.size
            self.evictable_pages -= node.device.size
            dev.append(node.device)
        self.lower.discard(node)

    def _subtree(self, node: Node) -> Iterator[Node]:
        stack = [node]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def reset(self) -> PageIds:
        """Drop everything, locks included. Returns the device page ids held
        (the lower tiers clear their own side)."""
        dev: list[PageIds] = []
        for n in self.nodes():
            if n.device is not None:
                dev.append(n.device)
        self._roots.clear()
        self._detached.clear()
        self._evictable.clear()
        self._heap.clear()
        self.recorder.cleared()
        self.device_pages = self.evictable_pages = self.node_count = 0
        return _concat(dev)

    def nodes(self) -> Iterator[Node]:
        """Every non-root node, parents before children (detached ones too)."""
        for root in [*self._roots.values(), *self._detached]:
            for child in root.children.values():
                yield from self._subtree(child)

    def namespaces(self) -> list[Namespace]:
        return list(self._roots)

    # ------------------------------------------------------------------ checks
    def check_integrity(
        self, locks: dict[Node, int] | None = None, job_locks: dict[Node, int] | None = None
    ) -> None:
        """Verify every structural invariant and counter; AssertionError if broken.

        ``locks`` maps each node to the number of ``lock`` calls the caller
        holds on it (``job_locks`` adds those of in-flight jobs); when given,
        every node's ``lock_ref`` must equal its own locks plus its children's
        ``lock_ref``. (The lower tiers check their own fields.) See
        radixcache/tree_check.py.
        """
        check_tree(self, locks, job_locks)

    def roots(self) -> list[Node]:
        """Every namespace root, live ones first, then detached (forgotten) ones."""
        return [*self._roots.values(), *self._detached]

    @property
    def evictable_nodes(self) -> set[Node]:
        """The eviction candidates (for checks)."""
        return self._evictable

    @property
    def heap_entries(self) -> list[tuple[object, ...]]:
        """The eviction heap (for checks)."""
        return self._heap

    def device_page_ids(self) -> PageIds:
        """Every device page id the tree holds (O(nodes); for checks)."""
        return _concat([n.device for n in self.nodes() if n.device is not None])

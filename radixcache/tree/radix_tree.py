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

Here: lookup, insert, split, locks. Three parts the tree owns keep the rest:
``eviction`` (device_eviction.py: candidates in policy order, ``evict``),
``removal`` (tree_removal.py: nodes leaving, namespaces forgotten and swept),
``below`` (tree_below.py: what the tiers below the device add and remove).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import numpy as np

from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.tree.eviction import DeviceEviction
from radixcache.tree.policies import EvictionPolicy
from radixcache.tree.lower import LowerTiers, NoLowerTiers
from radixcache.keys.hashing import KEY_BYTES
from radixcache.namespace import Namespace
from radixcache.keys.event_ids import EventIds
from radixcache.keys.page_keys import PageKeys
from radixcache.tree.check import check_tree
from radixcache.tree.below import BelowDevice
from radixcache.tree.removal import NodeRemoval, PageLedger
from radixcache.tree.recording import NullRecorder, Recorder
from radixcache.tree.node import EMPTY_PAGES, EvictResult, InsertResult, MatchResult, Node
from radixcache.tree.node import PageIds, TokenArray, common_len, concat_pages, first_page

GPU: Final = "GPU"  # the device medium, as the recorder names it


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
        self.tick = 0  # logical clock: +1 per match/insert, stamps nodes
        self.device_pages = 0
        self.evictable_pages = 0
        self.node_count = 0
        self.keys = PageKeys(page_size)
        self.ids = EventIds(page_size)  # event ids of nodes (store jobs write them into records)
        self.recorder: Recorder = NullRecorder() if recorder is None else recorder
        self.lower: LowerTiers = NoLowerTiers() if lower is None else lower
        self.ledger: PageLedger | None = None  # per-tenant counts (radixcache.tenants), if kept
        self.eviction = DeviceEviction(self, policy)  # candidates in policy order
        self.removal = NodeRemoval(self, self._roots)  # nodes leaving, namespaces forgotten
        self.below = BelowDevice(self, self._roots)  # edits of the tiers below the device

    # ------------------------------------------------------------------ lookup
    @property
    def protected_pages(self) -> int:
        return self.device_pages - self.evictable_pages

    def match(
        self, namespace: Namespace, tokens: TokenArray, priority: int = 0, end: int = -1
    ) -> MatchResult:
        """Longest cached prefix of ``tokens[:end]`` (whole pages only; ``end``
        -1: all of ``tokens``) in ``namespace``.

        ``tokens`` must be a validated 1-D int32 array. Mutates: stamps the
        matched nodes (recency, hit count, priority) and, when the match ends
        inside a node, splits that node at the page boundary so the result
        ends on a node. Cached content is never changed.
        """
        p = self.page_size
        n = tokens.size if end < 0 else min(end, tokens.size)
        n -= n % p
        root = self._roots.get(namespace)
        if root is None or n == 0:
            return MatchResult(0, EMPTY_PAGES, None)
        self.tick += 1
        return self._walk(root, tokens, n, priority, self.tick)

    def _walk(self, root: Node, tokens: TokenArray, n: int, priority: int, tick: int) -> MatchResult:
        """The loop of ``match`` below ``root``, over ``tokens[:n]`` (whole
        pages), and its result: the device part, then the host-resident
        nodes after it."""
        p = self.page_size
        node = root
        pos = 0
        device_len = 0
        device_parts: list[PageIds] = []
        last_device: Node | None = None
        host_nodes: list[Node] = []
        while pos < n:
            child = node.children.get(first_page(tokens, pos, p))
            if child is None:
                break
            matched = common_len(child.key, tokens, pos, n, p)
            if matched < child.key.size:
                child = self.split(child, matched // p)
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
        pages = concat_pages(device_parts) if device_parts else EMPTY_PAGES
        return MatchResult(device_len, pages, last_device, pos - device_len, tuple(host_nodes))

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
            child = node.children.get(first_page(tokens, pos, p))
            if child is None or child.device is None:
                break
            matched = common_len(child.key, tokens, pos, n, p)
            pos += matched
            node = child if matched == child.key.size else None
        return pos

    def split(self, node: Node, pages: int) -> Node:
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
        kept = node.id_pages  # the kept event id goes with the page it is of
        upper.id_pages, upper.last_id = (kept, node.last_id) if kept <= pages else (0, 0)
        node.id_pages = kept - pages if kept > pages else 0
        node.key = node.key[cut:]
        if node.device is not None:
            node.device = node.device[pages:]
            upper.device_children = 1
        self.lower.split(upper, node, pages)
        parent.children[first_page(upper.key, 0, p)] = upper
        upper.children = {first_page(node.key, 0, p): node}
        node.parent = upper
        self.node_count += 1
        if kept > pages:  # (ids were asked for: the upper's last one is what its children chain from)
            self.ids.last_id(upper)
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
        self.tick += 1
        return InsertResult(*self._insert_walk(root, namespace, tokens, pages, priority, self.tick))

    def _insert_walk(
        self, root: Node, namespace: Namespace, tokens: TokenArray, pages: PageIds, priority: int, tick: int
    ) -> tuple[int, list[PageIds], Node, list[Node], list[int], int]:
        """The steps of ``insert`` below ``root`` (arguments checked): the
        fields of its ``InsertResult``, in order."""
        p = self.page_size
        total = tokens.size
        node = root
        pos = 0
        existing = 0
        parts: list[PageIds] = []
        new_nodes: list[Node] = []
        offsets: list[int] = []
        eviction = self.eviction
        child: Node | None = None
        key = b""  # the first page at ``pos`` (what the children are keyed by)
        while pos < total:
            key = first_page(tokens, pos, p)
            child = node.children.get(key)
            if child is None:
                break
            matched = common_len(child.key, tokens, pos, total, p)
            if child.device is None and not self.lower.adoptable(child):
                break  # being loaded back: no adoption; the insert stops here
            if matched < child.key.size:
                child = self.split(child, matched // p)
            child.last_access = tick
            if priority > child.priority:
                child.priority = priority
            if child in eviction.candidates:
                eviction.push(child)  # its key changed: keep the heap fresh
            if child.device is None:
                self.attach_pages(child, pages[pos // p : (pos + matched) // p].copy())
                self.recorder.stored(child, 0, matched // p, GPU)
                new_nodes.append(child)
                offsets.append(pos // p)
            elif existing * p == pos:
                existing += matched // p
            assert child.device is not None
            parts.append(child.device)
            pos += matched
            node = child
        # (the loop stopped with ``child`` None where nothing is cached at ``pos``)
        if pos < total and child is not None:
            # stopped at a node being loaded back: the rest stays with the caller
            return existing, parts, node, new_nodes, offsets, pos // p
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
            node.children[key] = leaf
            self.node_count += 1
            self.attach_pages(leaf, pages[pos // p :].copy())
            self.recorder.stored(leaf, 0, (total - pos) // p, GPU)
            new_nodes.append(leaf)
            offsets.append(pos // p)
            parts.append(leaf.device)  # type: ignore[arg-type]
            node = leaf
        return existing, parts, node, new_nodes, offsets, total // p

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
        # (both int32 arrays: ``concat_pages``, the compiled core's where built, joins
        # each in one C call, ~1 us less than numpy's concatenate of two parts)
        node.key = concat_pages([node.key, tokens])
        node.device = concat_pages([node.device, pages])
        self.device_pages += pages.size
        self.evictable_pages += pages.size
        if self.ledger is not None:
            self.ledger.add_device(node.namespace, int(pages.size), True)

    def attach_pages(self, node: Node, pages: PageIds) -> None:
        """Give ``node`` (without device pages) its device pages: counters
        and eviction candidates (no event; the caller records the store)."""
        parent = node.parent
        assert node.device is None and parent is not None
        node.device = pages
        self.device_pages += pages.size
        if node.lock_ref == 0:
            self.evictable_pages += pages.size
        if self.ledger is not None:
            self.ledger.add_device(node.namespace, int(pages.size), node.lock_ref == 0)
        parent.device_children += 1
        eviction = self.eviction
        eviction.candidates.discard(parent)
        eviction.update(node)

    # ------------------------------------------------------------------ locks
    def lock(self, node: Node) -> None:
        """Protect ``node`` and its ancestors from device eviction (counted)."""
        candidates = self.eviction.candidates
        n: Node | None = node
        while n is not None:
            if n.lock_ref == 0:
                if n.device is not None:
                    self.evictable_pages -= n.device.size
                candidates.discard(n)
            n.lock_ref += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        """Undo one ``lock(node)``. Raises ValueError if ``node`` is not locked."""
        if node.lock_ref <= 0:
            raise ValueError(f"unlock of a node that is not locked: {node!r}")
        update = self.eviction.update
        n: Node | None = node
        while n is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0 and n.device is not None:
                self.evictable_pages += n.device.size
                update(n)
            n = n.parent

    # ------------------------------------------------------------------ eviction
    def evict(
        self, num_pages: int, before_drop: Callable[[Node], None] | None = None
    ) -> EvictResult:
        """Drop device pages of unlocked leaves, in policy order, until
        ``num_pages`` are freed; returns the released device page ids (the
        caller frees them). See ``DeviceEviction.evict``."""
        return self.eviction.evict(num_pages, before_drop)

    # ------------------------------------------------------------------ bulk
    def reset(self) -> PageIds:
        """Drop everything, locks included. Returns the device page ids held
        (the lower tiers clear their own side). See ``NodeRemoval.remove_all``."""
        return self.removal.remove_all()

    def nodes(self) -> Iterator[Node]:
        """Every non-root node, parents before children (detached ones too)."""
        for root in self.removal.all_roots():
            for child in root.children.values():
                yield from NodeRemoval.subtree(child)

    def page_keys(self, node: Node) -> bytes:
        """16-byte chained keys of ``node``'s pages, concatenated (cached)."""
        return self.keys.page_keys(node)

    def parent_key(self, node: Node) -> bytes | None:
        """The key of the page before ``node``'s first page, None at a root."""
        return self.keys.parent_key(node)

    def check_integrity(
        self, locks: dict[Node, int] | None = None, job_locks: dict[Node, int] | None = None
    ) -> None:
        """Verify every structural invariant and counter (radixcache/tree/check.py);
        AssertionError if broken. ``locks``: the ``lock`` calls the caller holds
        per node (``job_locks``: those of jobs in flight); when given, every
        ``lock_ref`` must equal its own locks plus its children's ``lock_ref``."""
        check_tree(self, locks, job_locks)


if native_core is not None:  # the same loops, compiled (radixcache/native/_core.pyx)
    RadixTree.match = native_core.match  # type: ignore[method-assign]
    RadixTree.insert = native_core.insert  # type: ignore[method-assign]
    RadixTree._insert_walk = native_core.insert_walk  # type: ignore[method-assign]
    native_core.bind_tree(RadixTree)  # (the walk attaches pages without a method call)
    RadixTree.lock = native_core.lock  # type: ignore[method-assign]
    RadixTree.unlock = native_core.unlock  # type: ignore[method-assign]

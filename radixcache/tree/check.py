"""The radix tree's integrity check: every structural invariant and counter.

Walks every root (live and detached) and recomputes what the tree keeps
incrementally: device page counts, evictable pages, lock counts, the eviction
candidate set and heap, page ownership. O(nodes); for tests and
``RadixCache.check_integrity()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from radixcache.keys.hashing import KEY_BYTES
from radixcache.tree.lower import LowerTiers
from radixcache.tree.node import EMPTY_PAGES, Node, PageIds


class CheckedRoots(Protocol):
    """The tree's roots (``NodeRemoval``)."""

    def all_roots(self) -> list[Node]: ...


class CheckedEviction(Protocol):
    """The tree's eviction candidates and heap (``DeviceEviction``)."""

    candidates: set[Node]
    heap: list[tuple[object, ...]]

    def entries(self) -> list[tuple[object, ...]]:
        """Every heap entry, superseded ones included."""


class CheckedTree(Protocol):
    """What the check reads of a ``RadixTree``."""

    page_size: int
    lower: LowerTiers
    node_count: int
    device_pages: int
    evictable_pages: int

    @property
    def removal(self) -> CheckedRoots: ...

    @property
    def eviction(self) -> CheckedEviction: ...

    def nodes(self) -> Iterator[Node]: ...


def _concat(parts: list[PageIds]) -> PageIds:
    return np.concatenate(parts) if parts else EMPTY_PAGES


def check_tree(
    tree: CheckedTree, locks: dict[Node, int] | None, job_locks: dict[Node, int] | None
) -> None:
    """AssertionError if ``tree`` breaks an invariant (see ``RadixTree.check_integrity``)."""
    if locks is not None and job_locks:
        merged = dict(locks)
        for node, n in job_locks.items():
            merged[node] = merged.get(node, 0) + n
        locks = merged
    p = tree.page_size
    device_pages = evictable = count = 0
    seen_device: list[PageIds] = []
    candidates: set[Node] = set()
    roots = [(r.namespace, r) for r in tree.removal.all_roots()]
    for ns, root in roots:
        assert root.parent is None and root.namespace == ns and root.key.size == 0
        assert root.children, f"empty root kept for {ns!r}"
        stack = [root]
        while stack:
            node = stack.pop()
            dev_children = 0
            child_locks = 0
            for first, child in node.children.items():
                assert child.parent is node, f"{child!r} has the wrong parent"
                assert child.namespace == ns, f"{child!r} is in the wrong namespace"
                assert child.key[:p].tobytes() == first, f"{child!r} filed under the wrong key"
                dev_children += child.device is not None
                child_locks += child.lock_ref
                stack.append(child)
            assert node.device_children == dev_children, f"{node!r}: device_children wrong"
            own = 0 if locks is None else locks.get(node, 0)
            if locks is not None:
                assert node.lock_ref == own + child_locks, (
                    f"{node!r}: lock_ref {node.lock_ref} != own {own} + children {child_locks}"
                )
            assert node.lock_ref >= child_locks, f"{node!r}: lock_ref below its children's"
            if node.parent is None:
                continue
            count += 1
            size = node.key.size
            assert size > 0 and size % p == 0, f"{node!r}: key length {size} not whole pages"
            assert node.device is not None or tree.lower.resident(node), (
                f"{node!r}: no residency"
            )
            if node.device is not None:
                assert node.device.size * p == size, f"{node!r}: device pages do not cover it"
                assert node.parent.parent is None or node.parent.device is not None, (
                    f"{node!r}: device residency is not prefix-closed"
                )
                device_pages += node.device.size
                if node.lock_ref == 0:
                    evictable += node.device.size
                    if dev_children == 0:
                        candidates.add(node)
                seen_device.append(node.device)
            if node.keys is not None:
                assert len(node.keys) % KEY_BYTES == 0, f"{node!r}: ragged page keys"
                assert len(node.keys) <= KEY_BYTES * (size // p), f"{node!r}: stale page keys"
    assert count == tree.node_count, f"node_count {tree.node_count} != {count}"
    assert device_pages == tree.device_pages, f"device_pages {tree.device_pages} != {device_pages}"
    assert evictable == tree.evictable_pages, (
        f"evictable_pages {tree.evictable_pages} != {evictable}"
    )
    eviction = tree.eviction
    assert candidates == eviction.candidates, "eviction candidate set is out of date"
    live_heap = {e[-1] for e in eviction.entries() if isinstance(e[-1], Node) and e[-2] == e[-1].heap_seq}
    assert eviction.candidates <= live_heap, "an eviction candidate has no live heap entry"
    ids = _concat(seen_device)
    assert np.unique(ids).size == ids.size, "a device page is owned by two nodes"


def device_page_ids(tree: CheckedTree) -> PageIds:
    """Every device page id ``tree`` holds (O(nodes); for checks)."""
    return _concat([n.device for n in tree.nodes() if n.device is not None])

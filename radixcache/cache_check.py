"""The cache's integrity check: requests, tree, pools and jobs agree.

Walks every live request and recomputes who owns each device page: the
tree's nodes, the jobs in flight, the requests' private pages. Every page the
device pool has allocated is owned exactly once; every request's lock and
shared pages match the tree's path to its locked node. O(nodes + pages); for
tests and ``RadixCache.check_integrity()`` (the tree's own invariants are
radixcache/tree/check.py's, the host side radixcache/tiers/host_index.py's).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from radixcache.tree.node import Node, PageIds
from radixcache.request import Request
from radixcache.tiers.contract import Tiers
from radixcache.transfer import PageAllocator
from radixcache.tree.radix_tree import RadixTree
from radixcache.tree.check import device_page_ids


def check_cache(
    page_size: int,
    live: Collection[Request],
    tree: RadixTree,
    pool: PageAllocator,
    tiers: Tiers,
) -> None:
    """AssertionError unless the tree, the device pool, the jobs in flight and
    every ``live`` request agree (no leaks, no double ownership, exact lock
    counts)."""
    locks: dict[Node, int] = {}
    private: list[PageIds] = []
    for req in live:
        if req.locked_node is not None:
            locks[req.locked_node] = locks.get(req.locked_node, 0) + 1
        table = req.page_table
        assert req.num_pages * page_size >= req.reserved_tokens >= req.num_computed
        assert req.shared_pages * page_size <= max(req.num_computed, req.cached_len)
        private.append(table[req.shared_pages :])
        # Shared pages before the first pending load are locked in the tree
        # (those from it on are covered by the jobs filling them).
        covered = req.pending[0].start_page if req.pending else req.shared_pages
        if covered:
            assert req.locked_node is not None, f"{req!r} shares pages without a lock"
    tree.check_integrity(locks, tiers.job_locks())
    pool.check_integrity()
    tiers.check_integrity()
    tree_pages = device_page_ids(tree)
    job_pages = tiers.job_device_pages()
    owned = np.concatenate([tree_pages, job_pages, *private])
    assert np.unique(owned).size == owned.size, "a device page is owned twice"
    allocated = pool.allocated_ids()
    assert np.array_equal(np.sort(owned), allocated), (
        f"pool accounting: {allocated.size} allocated, {owned.size} owned by tree and requests"
    )
    for req in live:
        if req.locked_node is None or req.pending:
            continue
        parts: list[PageIds] = []
        node: Node | None = req.locked_node
        while node is not None and node.device is not None:
            parts.append(node.device)
            node = node.parent
        path = np.concatenate(parts[::-1])
        assert np.array_equal(path, req.page_table[: req.shared_pages]), (
            f"{req!r}: shared pages differ from the tree's path to its locked node"
        )

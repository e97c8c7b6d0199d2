"""Wiring quotas into a tree: the ledger, per-tenant eviction, counted locks.

``attach(tree, ledger)`` is called once, on an empty tree, by the cache's
builder. Every tree gets the ledger (per-tenant device page counts); with
quotas on (``ledger.book`` set) the tree also gets ``TenantEviction`` and
lock/unlock that keep the per-tenant evictable counts exact. Those are the
pure-Python lock loops of ``RadixTree`` plus one ledger update per node
whose lock state flips; the compiled ones stay in use without quotas.
"""

from __future__ import annotations

from functools import partial

from radixcache.tenants.eviction import TenantEviction
from radixcache.tenants.ledger import TenantLedger
from radixcache.tree.node import Node
from radixcache.tree.radix_tree import RadixTree


def attach(tree: RadixTree, ledger: TenantLedger) -> None:
    """Give ``tree`` (empty) its ledger, and with quotas its tenant eviction."""
    if tree.node_count or tree.device_pages:
        raise ValueError("tenant accounting is attached to an empty tree only")
    tree.ledger = ledger
    if ledger.book is None:
        return
    tree.eviction = TenantEviction(tree, tree.policy, ledger)
    tree.lock = partial(_lock, tree, ledger)  # type: ignore[method-assign]
    tree.unlock = partial(_unlock, tree, ledger)  # type: ignore[method-assign]


def _lock(tree: RadixTree, ledger: TenantLedger, node: Node) -> None:
    """``RadixTree.lock``, counting per tenant."""
    candidates = tree.eviction.candidates
    n: Node | None = node
    while n is not None:
        if n.lock_ref == 0:
            if n.device is not None:
                size = int(n.device.size)
                tree.evictable_pages -= size
                ledger.lock_change(n.namespace, -size)
            candidates.discard(n)
        n.lock_ref += 1
        n = n.parent


def _unlock(tree: RadixTree, ledger: TenantLedger, node: Node) -> None:
    """``RadixTree.unlock``, counting per tenant."""
    if node.lock_ref <= 0:
        raise ValueError(f"unlock of a node that is not locked: {node!r}")
    update = tree.eviction.update
    n: Node | None = node
    while n is not None:
        n.lock_ref -= 1
        if n.lock_ref == 0 and n.device is not None:
            size = int(n.device.size)
            tree.evictable_pages += size
            ledger.lock_change(n.namespace, size)
            update(n)
        n = n.parent

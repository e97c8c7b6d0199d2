"""Operations on a whole cache: ending requests, forgetting a namespace,
reset, shutting the tiers down.

``CacheBulk`` belongs to one ``RadixCache`` and works on its parts: the
tree, the device pool, the tiers, and the cache's own tables of live
requests and of forgets per namespace (the same dicts, shared). The cache
checks every argument and its own state before it calls in here; nothing
here raises for a failing tier (the tiers degrade failures to misses).
Owner thread only.
"""

from __future__ import annotations

from radixcache.namespace import Namespace
from radixcache.request import Request
from radixcache.tiers.contract import Tiers
from radixcache.transfer import PageAllocator
from radixcache.tree.radix_tree import RadixTree


class CacheBulk:
    """The bulk operations of one cache. Owner thread only."""

    def __init__(
        self,
        tree: RadixTree,
        pool: PageAllocator,
        tiers: Tiers,
        live: dict[int, Request],
        forgets: dict[Namespace, int],
    ) -> None:
        self.tree = tree
        self.pool = pool
        self.tiers = tiers
        self.live = live  # the cache's live requests (the same dict)
        self.forgets = forgets  # the cache's forget counts per namespace (the same dict)

    def end(self, req: Request) -> None:
        """Give up ``req``'s pending loads, unlock it, free its private pages
        (the caller takes it out of ``live``)."""
        if req.pending:
            self.tiers.abandon(req)
        private = req.end(self.tree)
        if private.size:
            self.pool.free(private)

    def sweep(self) -> None:
        """Remove pages of forgotten namespaces that nothing holds any more."""
        if self.tree.removal.detached_count:
            freed = self.tree.removal.sweep_detached()
            if freed.size:
                self.pool.free(freed)

    def forget(self, namespace: Namespace) -> int:
        """Remove ``namespace`` from every tier (see ``RadixCache.forget_namespace``);
        returns the device pages still held by live requests or jobs."""
        self.forgets[namespace] = self.forgets.get(namespace, 0) + 1
        result = self.tree.removal.forget(namespace)
        if result.device_page_ids.size:
            self.pool.free(result.device_page_ids)
        self.tiers.forget(namespace)
        return result.pending_pages

    def reset(self) -> None:
        """Drop every cached page; live requests are ended (their handles
        die), jobs in flight finish first."""
        for req in self.live.values():
            if req.pending:
                self.tiers.abandon(req)
        self.tiers.drain()
        for req in self.live.values():
            req.end_forced()
        self.live.clear()
        self.pool.free(self.tree.reset())
        self.tiers.reset()
        leftover = self.pool.allocated_ids()  # private pages of the ended requests
        self.pool.free(leftover)

    def close(self) -> None:
        """Release every live request, finish the jobs in flight, stop the
        tiers' threads."""
        for req in list(self.live.values()):
            self.end(req)
        self.live.clear()
        self.sweep()
        self.tiers.close()

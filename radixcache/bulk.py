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

import logging
from collections.abc import Sequence

from radixcache.errors import RequestStateError
from radixcache.namespace import Namespace, check_tag
from radixcache.request import Request
from radixcache.tenants.ledger import StorageShare, TenantLedger
from radixcache.tenants.quota import TenantKey
from radixcache.tenants.retention import Retention
from radixcache.tenants.tags import TagBook
from radixcache.offload import StorageConfig
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.tiers.config import with_quota_book
from radixcache.tiers.contract import Tiers
from radixcache.transfer import PageAllocator
from radixcache.tree.node import Node
from radixcache.tree.radix_tree import RadixTree

log = logging.getLogger(__name__)


class CacheBulk:
    """The bulk operations of one cache. Owner thread only."""

    def __init__(
        self,
        tree: RadixTree,
        pool: PageAllocator,
        tiers: Tiers,
        live: dict[int, Request],
        forgets: dict[Namespace, int],
        tags: TagBook | None = None,
        retention: Retention | None = None,
        ledger: TenantLedger | None = None,
        own_storage: object = None,
    ) -> None:
        self.tree = tree
        self.pool = pool
        self.tiers = tiers
        self.live = live  # the cache's live requests (the same dict)
        self.forgets = forgets  # the cache's forget counts per namespace (the same dict)
        self.tags = TagBook() if tags is None else tags
        self.retention = retention
        self.ledger = ledger
        self.own_storage = own_storage  # the storage config as the user wrote it (TierConfig.storage)
        if retention is not None:
            retention.tree = tree
            retention.free = pool.free
        # store jobs carry deadlines and tags; pages read back are dated (retention)
        tiers.bind_records(self.put_extras, None if retention is None else self.date_fetched)

    def sync_storage_quotas(self) -> None:
        """Hand the quota book's byte quotas to the storage tier again (after a
        run-time change), laid over the store's own configured ones
        (``with_quota_book``, as at open): an LMDB store takes ``storage_bytes``
        / ``storage_floor``, a pool ``pool_bytes``. A store that cannot change
        them at run time keeps those it opened with."""
        book = None if self.ledger is None else self.ledger.book
        storage = getattr(self.tiers, "storage", None)
        setter = getattr(storage, "set_tenant_quotas", None)
        own = self.own_storage
        if book is None or setter is None or not isinstance(own, (StorageConfig, ValkeyConfig)):
            return
        from radixcache.cache_config import pool_quotas, storage_quotas  # (it imports this module)

        laid = with_quota_book(own, *storage_quotas(book), pool_quotas(book))
        try:
            setter(laid.tenant_quotas, laid.tenant_quota_default)
        except Exception:  # never raised into the runner: the store keeps its quotas
            log.exception("the storage tier refused the new byte quotas; it keeps its own")

    def storage_shares(self) -> dict[TenantKey, StorageShare]:
        """Each tenant's share of the storage tier, where the store counts per
        tenant (``tenant_stats``); {} without one, or if it cannot be read."""
        storage = getattr(self.tiers, "storage", None)
        read = getattr(storage, "tenant_stats", None)
        if read is None:
            return {}
        try:
            stats = read()
        except Exception:  # a pool that is down: no figures this time
            log.warning("the storage tier's per-tenant figures could not be read", exc_info=True)
            return {}
        medium = str(getattr(storage, "medium", ""))
        return {key: StorageShare(medium, s.stored_bytes, s.quota_evicted, s.dropped_pages)
                for key, s in stats.items()}

    def date_fetched(self, node: Node, keys: list[bytes]) -> None:
        """Pages read back from storage are dated by their records' deadlines
        (for a tenant with a TTL; ``Retention.cap`` ignores the others). A store
        that cannot tell, or tells of none, leaves them dated as past their
        TTL: they serve the request that fetched them, and no one after."""
        retention = self.retention
        assert retention is not None
        if retention.ttl(node.namespace.tenant) is None:
            return  # no TTL: nothing to date, so no lookup (a pool's is a round trip)
        deadlines = getattr(self.tiers.storage, "deadlines", None)  # type: ignore[attr-defined]
        found: list[float] = []
        if deadlines is not None:
            try:
                found = [d for d in deadlines(keys) if d is not None]
            except Exception:  # unknown: as if past
                log.warning("storage could not tell the deadlines of pages read back", exc_info=True)
        retention.cap(node, min(found) if found else retention.clock())

    def put_extras(self, nodes: Sequence[Node]) -> tuple[float | None, tuple[str, ...]]:
        """The retention deadline and the tags a store of ``nodes`` records."""
        deadline = None if self.retention is None else self.retention.deadline(nodes)
        return deadline, self.tags.tags_of(nodes[0].namespace)

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

    def forget(self, namespace: Namespace, invalidated: bool = False) -> int:
        """Remove ``namespace`` from every tier (see ``RadixCache.forget_namespace``);
        returns the device pages still held by live requests or jobs."""
        self.forgets[namespace] = self.forgets.get(namespace, 0) + 1
        result = self.tree.removal.forget(namespace)
        if result.device_page_ids.size:
            self.pool.free(result.device_page_ids)
        if self.ledger is not None:
            went = int(result.device_page_ids.size) + result.pending_pages
            counters = self.ledger.counters_of(namespace)
            if invalidated:
                counters.invalidated_pages += went
            else:
                counters.forgotten_pages += went
        self.tiers.forget(namespace)
        return result.pending_pages

    def invalidate(self, tag: str) -> int:
        """Forget every namespace admitted with ``tag``, then storage's records
        under it (see ``RadixCache.invalidate``); returns the device pages
        live requests or jobs still hold."""
        held = sum(self.forget(ns, invalidated=True) for ns in self.tags.take(tag))
        self.tiers.invalidate_tag(tag)
        return held

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
        if self.retention is not None:
            self.retention.clear()
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


class BulkCalls:
    """The bulk calls of ``RadixCache`` (a base class of it: the class body
    holds the request lifecycle, these whole-cache operations live here)."""

    _bulk: CacheBulk
    _live: dict[int, Request]

    def _check_open(self) -> None:
        raise NotImplementedError

    def forget_namespace(self, namespace: Namespace) -> int:
        """Remove everything cached under ``namespace``, on every tier.

        From the return on, no request is served a page of ``namespace``
        cached before the call. Pages live requests (or jobs in flight) still
        hold stay allocated, invisible to new requests, and go when they are
        released; returns how many device pages that is. Pages cached after
        the call are untouched. If storage cannot delete its pages (a storage
        error, counted in ``tier_stats().failed_jobs``), this cache never reads
        them back. Raises TypeError if ``namespace`` is not a Namespace,
        CacheClosedError after ``close()``.
        """
        self._check_open()
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        return self._bulk.forget(namespace)

    def invalidate(self, tag: str) -> int:
        """Forget every namespace carrying ``tag`` (``Namespace.tags``) on every
        tier, as ``forget_namespace`` does each, and every record storage holds
        under the tag (other processes' and engines' included); storage's part
        is done (durable) when this returns, or owed and retried (nothing is
        read from storage meanwhile). Returns the device pages live requests
        still hold. TypeError / ValueError for a bad tag, CacheClosedError."""
        self._check_open()
        return self._bulk.invalidate(check_tag(tag))

    def reset(self, force: bool = False) -> None:
        """Drop every cached page. Refuses (RequestStateError, nothing
        changed) while requests hold pages, unless ``force``: then they are
        ended and their handles die. TypeError for a non-bool ``force``,
        CacheClosedError after ``close()``."""
        self._check_open()
        if type(force) is not bool:
            raise TypeError(f"force must be a bool, got {force!r}")
        if self._live and not force:
            raise RequestStateError(
                f"reset refused: {len(self._live)} live requests hold pages; "
                f"release them or pass force=True"
            )
        self._bulk.reset()

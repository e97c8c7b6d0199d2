"""RadixCache: the KV allocator a model runner drives every step.

Lifecycle of one request (all calls on the runner's thread)::

    req = cache.admit(prompt)          match + lock the cached prefix
    cache.reserve(req, n)              pages for the next n positions (prefill chunk or decode)
    ... runner writes K/V at cache.kv.slots(req.page_table, req.num_computed, n) ...
    cache.extend(req, [new_token])     (decode) tokens sampled by the runner
    cache.commit(req, n)               n computed tokens; full pages join the tree
    cache.release(req)                 unlock; private pages go back to the pool

A committed page is shared at once: a request admitted later (or concurrently
in the same batch) that has the same prefix reuses it.

This module has the request lifecycle, the allocation ladder (allocate,
settle copies, drain, evict, retry) and the bulk operations. The
configuration and the wiring of tree and tiers are radixcache/cache_config.py,
the integrity check radixcache/cache_check.py.
"""

from __future__ import annotations

from radixcache.cache_check import check_cache
from radixcache.cache_config import CacheConfig, build_index
from radixcache.errors import OutOfPagesError, RequestStateError
from radixcache.events.types import KvEvent
from radixcache.namespace import DEFAULT_NAMESPACE, Namespace
from radixcache.tree.node import EMPTY_PAGES, PageIds
from radixcache.request import Request
from radixcache.stats import CacheStats, Counters
from radixcache.tiers.config import TierStats
from radixcache.tiers.contract import Tiers
from radixcache.tokens import as_tokens
from radixcache.tree.radix_tree import RadixTree
from radixcache.transfer import DeviceKVBuffer, PageAllocator

__all__ = ["CacheConfig", "RadixCache"]


class RadixCache:
    """Prefix-sharing KV allocator over a device page pool.

    Owns the tree, the device page pool and the KV buffer. Single-threaded:
    every method must be called from the owner (scheduler) thread.
    """

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.spec = config.spec
        self.page_size = config.spec.page_size
        num_pages = config.num_device_pages
        self.kv: DeviceKVBuffer | None = (
            DeviceKVBuffer(config.spec, num_pages, config.device) if config.allocate_kv else None
        )
        self.pool = PageAllocator(num_pages, "device")
        self.counters = Counters()
        self._live: dict[int, Request] = {}
        self._next_rid = 0
        self._forgets: dict[Namespace, int] = {}  # forget_namespace calls per namespace
        built = build_index(config, self.kv, self._allocate_or_none, self.pool.free)
        self.tree: RadixTree = built.tree
        self.tiers: Tiers = built.tiers
        self._recorder = built.recorder

    # ------------------------------------------------------------------ lifecycle
    def admit(
        self,
        tokens: object,
        namespace: Namespace = DEFAULT_NAMESPACE,
        priority: int = 0,
    ) -> Request:
        """Start a request: match its cached prefix and lock it.

        ``tokens`` is the prompt (numpy int array, CPU tensor or list). At
        least one token is always left to compute, so the runner gets logits
        for the last one. Returns a handle whose ``cached_len`` tokens are
        already in ``page_table``.
        """
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"priority must be an int, got {priority!r}")
        arr = as_tokens(tokens, "prompt")
        if arr is tokens:
            arr = arr.copy()  # never keep a reference the caller may mutate
        req = Request(self._next_rid, namespace, arr, priority, self._forgets.get(namespace, 0))
        self._next_rid += 1
        usable = arr[: max(arr.size - 1, 0)]
        match = self.tree.match(namespace, usable, priority)
        if self.tiers.wait_for_loads(match):
            # Another request is loading this prefix back: let those copies land
            # (memcpy speed) and share them instead of stopping short.
            match = self.tree.match(namespace, usable, priority)
        req.admit_cached(self.tree, match.last_device_node, match.device_pages, match.device_len)
        self._live[req.rid] = req
        self.tiers.on_admit(req, match, arr)
        c = self.counters
        c.requests += 1
        c.prompt_tokens += int(arr.size)
        c.hit_tokens += match.device_len
        c.hit_pages += req.num_pages
        return req

    def peek(self, tokens: object, namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """Tokens of ``tokens`` that ``admit`` would find on the device now.

        Read-only and lock-free: nothing is locked, stamped or split, so a
        scheduler may ask for many candidates and admit only some. The hit
        may shrink before ``admit`` (eviction); host and storage hits are not
        counted.
        """
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        arr = as_tokens(tokens, "prompt")
        return self.tree.peek(namespace, arr[: max(arr.size - 1, 0)])

    def reserve(self, req: Request, num_tokens: int) -> PageIds:
        """Make room for the KV of the next ``num_tokens`` positions.

        Allocates whole pages (evicting unlocked cached pages if the pool is
        short) so that ``page_table`` covers positions up to
        ``num_computed + num_tokens``. Returns the page table (a view).
        Raises OutOfPagesError, allocating nothing, if even eviction cannot
        make room.
        """
        self._begin_step(req, num_tokens, "reserve")
        target = req.num_computed + num_tokens
        if target > req.reserved_tokens:
            need = -(-target // self.page_size) - req.num_pages
            req.add_pages(self._allocate(need) if need > 0 else EMPTY_PAGES, target)
        return req.page_table

    def _begin_step(self, req: Request, num_tokens: int, what: str) -> None:
        """Checks shared by reserve and commit; settles pending tier loads
        (the prefetch policy decides how long to wait)."""
        self._check_live(req)
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
            raise ValueError(f"{what} takes a non-negative int, got {num_tokens!r}")
        if req.pending:
            self.tiers.resolve(req)

    def extend(self, req: Request, tokens: object) -> None:
        """Append tokens the runner produced (e.g. the sampled token) to ``req``."""
        self._check_live(req)
        req.append_tokens(as_tokens(tokens, "extend"))

    def commit(self, req: Request, num_tokens: int) -> None:
        """Record that KV for the next ``num_tokens`` positions was written.

        Every full page now computed joins the tree, where other requests can
        share it. Pages another request inserted first are kept from the tree
        and this request's copies go back to the pool (its page table is
        updated to the tree's pages, which hold the same KV).
        """
        self._begin_step(req, num_tokens, "commit")
        end = req.num_computed + num_tokens
        if end > req.reserved_tokens:
            raise ValueError(
                f"commit of {num_tokens} tokens reaches position {end}, "
                f"but only {req.reserved_tokens} were reserved"
            )
        if end > req.num_tokens:
            raise ValueError(
                f"commit of {num_tokens} tokens reaches position {end}, "
                f"but the request has {req.num_tokens} tokens; extend() it first"
            )
        req.computed(end)
        full = end // self.page_size
        if full > req.shared_pages:
            self._insert(req, full)

    def _insert(self, req: Request, full: int) -> None:
        if self._forgets and not req.may_insert(self._forgets.get(req.namespace, 0)):
            return  # its prefix was forgotten: later pages stay its own, freed at release
        p = self.page_size
        # Unlock first: the insert may then extend the request's own leaf in
        # place (nothing can be evicted between here and the lock below).
        req.unlock(self.tree)
        result = self.tree.insert(
            req.namespace, req.tokens[: full * p], req.page_table[:full], req.priority
        )
        # A node being loaded back (its device pages in flight) stops the insert
        # early: the pages after it stay private to this request and are
        # inserted by a later commit or freed at release.
        full = result.inserted_pages
        # Pages [shared_pages, existing) were computed by this request but are
        # already cached: adopt the tree's pages, free ours.
        dup_to = max(result.existing_pages, req.shared_pages)
        dup = req.inserted(self.tree, result.last_node, full, result.device_pages, dup_to)
        if dup.size:
            self.pool.free(dup)
            self.counters.duplicate_pages += int(dup.size)
        self.counters.committed_pages += full - dup_to
        self.tiers.on_insert(result)

    def release(self, req: Request) -> None:
        """End ``req``: unlock its cached pages and free its private ones.

        A partial last page and reserved-but-unused pages return to the pool.
        Raises RequestStateError if ``req`` was already released.
        """
        self._check_live(req)
        if req.pending:
            self.tiers.abandon(req)
        private = req.end(self.tree)
        if private.size:
            self.pool.free(private)
        del self._live[req.rid]
        self._sweep()

    def _sweep(self) -> None:
        """Remove pages of forgotten namespaces that nothing holds any more."""
        if self.tree.removal.detached_count:
            freed = self.tree.removal.sweep_detached()
            if freed.size:
                self.pool.free(freed)

    # ------------------------------------------------------------------ capacity
    def _allocate(self, n: int) -> PageIds:
        """``n`` device pages, evicting if the pool is short. Evicts nothing
        unless the free and evictable pages cover ``n`` (a failed allocation
        changes nothing); jobs in flight that pin device pages are finished
        first when that helps."""
        pool, tree = self.pool, self.tree
        pages = pool.allocate(n)
        if pages is not None:
            return pages
        if pool.free_count + tree.evictable_pages < n and self.tiers.settle_copies():
            pass  # copies in flight pinned pages; once applied they may be free or evictable
        while pool.free_count + tree.evictable_pages < n and self.tiers.drain():
            pass  # abandoned fetches, stores under host-only children, ...
        if pool.free_count + tree.evictable_pages >= n:
            self.evict(n - pool.free_count)
            pages = pool.allocate(n)
            if pages is None and self.tiers.drain():
                # Jobs held descendants of the victims: they are done now.
                self.evict(n - pool.free_count)
                pages = pool.allocate(n)
        if pages is None:
            self.counters.out_of_pages += 1
            raise OutOfPagesError(n, pool.free_count, tree.evictable_pages)
        return pages

    def _allocate_or_none(self, n: int) -> PageIds | None:
        try:
            return self._allocate(n)
        except OutOfPagesError:
            return None

    def evict(self, num_pages: int) -> int:
        """Evict at least ``num_pages`` unlocked cached device pages if there are
        that many (pages with a host copy stay cached on the host); returns how
        many device pages were freed."""
        result = self.tree.evict(num_pages, self.tiers.before_device_drop)
        freed = result.device_pages
        if freed.size:
            self.pool.free(freed)
            self.counters.evicted_pages += int(freed.size)
        return int(freed.size)

    def poll(self) -> int:
        """Apply finished tier jobs (backups, loads, storage) to the cache.

        Call once per step on the owner thread; returns how many finished.
        """
        done = self.tiers.poll()
        self._sweep()  # pages of forgotten namespaces that jobs held may go now
        return done

    def drain(self) -> int:
        """Wait for every tier job in flight (backups, stores, loads, fetches)
        and apply it; returns how many finished. For a consistent view of the
        tiers (tests, tools, a checkpoint before shutdown)."""
        finished = 0
        while True:
            self.tiers.drain()
            n = self.tiers.poll()
            finished += n
            if not n:
                break
        self._sweep()
        return finished

    def tier_stats(self) -> TierStats | None:
        """A snapshot of the host and storage tiers, None without them."""
        return self.tiers.stats()

    def take_events(self) -> list[KvEvent]:
        """Page events since the last call, in order (empty unless
        ``record_events``). Call once per engine step and publish the list:
        ``publisher.publish(cache.take_events())`` (empty lists are skipped)."""
        return self._recorder.take()

    def close(self) -> None:
        """Finish in-flight tier jobs and stop their threads."""
        self.tiers.close()

    # ------------------------------------------------------------------ bulk
    def forget_namespace(self, namespace: Namespace) -> int:
        """Remove everything cached under ``namespace``, on every tier.

        From the return on, no request is served a page of ``namespace``
        cached before the call. Pages live requests (or jobs in flight) still
        hold stay allocated, invisible to new requests, and go when they are
        released; returns how many device pages that is. Pages cached after
        the call are untouched. Raises TypeError if ``namespace`` is not a
        Namespace.
        """
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        self._forgets[namespace] = self._forgets.get(namespace, 0) + 1
        result = self.tree.removal.forget(namespace)
        if result.device_page_ids.size:
            self.pool.free(result.device_page_ids)
        self.tiers.forget(namespace)
        return result.pending_pages

    def reset(self, force: bool = False) -> None:
        """Drop every cached page.

        Refuses (RequestStateError) while requests hold pages, unless
        ``force``; forced, those requests are ended and their handles become
        unusable.
        """
        if self._live and not force:
            raise RequestStateError(
                f"reset refused: {len(self._live)} live requests hold pages; "
                f"release them or pass force=True"
            )
        for req in self._live.values():
            if req.pending:
                self.tiers.abandon(req)
        self.tiers.drain()
        for req in self._live.values():
            req.end_forced()
        self._live.clear()
        self.pool.free(self.tree.reset())
        self.tiers.reset()
        leftover = self.pool.allocated_ids()  # private pages of the ended requests
        self.pool.free(leftover)

    # ------------------------------------------------------------------ views
    def stats(self) -> CacheStats:
        c = self.counters
        tree = self.tree
        private = self.pool.used_count - tree.device_pages
        return CacheStats(
            requests=c.requests,
            live_requests=len(self._live),
            prompt_tokens=c.prompt_tokens,
            hit_tokens=c.hit_tokens,
            hit_pages=c.hit_pages,
            committed_pages=c.committed_pages,
            duplicate_pages=c.duplicate_pages,
            evicted_pages=c.evicted_pages,
            out_of_pages=c.out_of_pages,
            pool_pages=self.pool.capacity,
            free_pages=self.pool.free_count,
            cached_pages=tree.device_pages,
            evictable_pages=tree.evictable_pages,
            protected_pages=tree.protected_pages,
            private_pages=private,
            nodes=tree.node_count,
        )

    @property
    def live_requests(self) -> list[Request]:
        return list(self._live.values())

    def _check_live(self, req: Request) -> None:
        if not isinstance(req, Request):
            raise TypeError(f"expected a Request, got {type(req).__name__}")
        if req.released:
            raise RequestStateError(f"request {req.rid} was already released")
        if self._live.get(req.rid) is not req:
            raise RequestStateError(f"request {req.rid} does not belong to this cache")

    def check_integrity(self) -> None:
        """Verify the tree, the pools, in-flight jobs and every live request
        agree (no leaks, no double ownership, exact lock counts). AssertionError
        if not."""
        check_cache(self.page_size, self._live.values(), self.tree, self.pool, self.tiers)

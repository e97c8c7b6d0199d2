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

Every public call succeeds or raises an error its docstring names and
changes nothing (invariant 12; README "What the lifecycle guarantees"):
arguments are checked before the first mutation, and nothing after it
raises, because the tiers below the device turn failures into misses. One
exception: ``reserve`` raising ``OutOfPagesError`` may first have applied
the prefetch policy and tier jobs already in flight (what ``poll()`` does).

This module has the request lifecycle and the checks of every call. The
allocation ladder is radixcache/capacity.py, the bulk operations (forget,
reset, close) radixcache/bulk.py, the configuration and the wiring of tree
and tiers radixcache/cache_config.py, the integrity check
radixcache/cache_check.py.
"""

from __future__ import annotations

import logging
import os
import time

from radixcache.bulk import BulkCalls, CacheBulk
from radixcache.cache_check import check_cache
from radixcache.cache_config import CacheConfig, build_index, quota_book
from radixcache.capacity import DeviceCapacity
from radixcache.errors import CacheClosedError, RequestStateError
from radixcache.events.types import KvEvent
from radixcache.namespace import DEFAULT_NAMESPACE, Namespace
from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.request import Request
from radixcache.stats import CacheStats, Counters, snapshot
from radixcache.tenants.api import Tenants
from radixcache.tenants.gate import TenantGate
from radixcache.tenants.ledger import TenantCounters, TenantLedger
from radixcache.tenants.retention import Clock
from radixcache.tenants.tags import TagBook
from radixcache.tiers.config import TierStats
from radixcache.tiers.contract import NullTiers, Tiers
from radixcache.tokens import as_tokens
from radixcache.transfer import DeviceKVBuffer, PageAllocator
from radixcache.transfer.forks import forked_message, on_fork_in_child
from radixcache.tree.node import EMPTY_PAGES, PageIds
from radixcache.tree.radix_tree import RadixTree

__all__ = ["CacheConfig", "RadixCache"]

log = logging.getLogger(__name__)


class RadixCache(BulkCalls):
    """Prefix-sharing KV allocator over a device page pool.

    Owns the tree, the device page pool and the KV buffer. Single-threaded:
    every method must be called from the owner (scheduler) thread. Every
    method raises ``CacheClosedError`` after ``close()``.
    """

    def __init__(self, config: CacheConfig, clock: Clock = time.time) -> None:
        """``clock``: wall-clock seconds, what TTL deadlines are compared with (tests fake it)."""
        self.config = config
        self.spec = config.spec
        self.page_size = config.spec.page_size
        num_pages = config.num_device_pages
        self.kv: DeviceKVBuffer | None = (
            DeviceKVBuffer(config.spec, num_pages, config.device) if config.allocate_kv else None
        )
        self.pool = PageAllocator(num_pages, "device", native_core)  # (C loops when compiled)
        self.counters = Counters()
        self._live: dict[int, Request] = {}
        self._next_rid = 0
        self._forgets: dict[Namespace, int] = {}  # forget_namespace calls per namespace
        self._capacity = DeviceCapacity(self.pool, self.counters)
        ledger = TenantLedger(quota_book(config.quotas))
        built = build_index(config, self.kv, self._capacity.allocate_or_none, self.pool.free, ledger,
                            clock)
        self.tree: RadixTree = built.tree
        self.tiers: Tiers = built.tiers
        self._ledger = ledger
        self._gate = TenantGate(self.tree, ledger, self._free_evicted)
        self._tiered = not isinstance(self.tiers, NullTiers)  # (no calls into a device-only cache's)
        self._gate.before_drop = self.tiers.before_device_drop if self._tiered else None
        self._gate.host = built.host_quota  # host limits, enforced by set_quota too
        self._capacity.bind(self.tree, self.tiers, self._gate)
        self._tags = TagBook()  # namespaces by tag, for invalidate()
        self._bulk = CacheBulk(self.tree, self.pool, self.tiers, self._live, self._forgets,
                               self._tags, built.retention, ledger,
                               None if config.tiers is None else config.tiers.storage)
        self.tenants = Tenants(self._gate, self._check_open, self._bulk.sync_storage_quotas,
                               self._bulk.storage_shares)
        self._retention = self._gate.retention = built.retention
        self._recorder = built.recorder
        self._refusal: str | None = None  # why every call is refused (closed, forked); None: open
        self._pid = os.getpid()
        on_fork_in_child(self, _forked)

    # ------------------------------------------------------------------ lifecycle
    def admit(
        self,
        tokens: object,
        namespace: Namespace = DEFAULT_NAMESPACE,
        priority: int = 0,
    ) -> Request:
        """Start a request: match its cached prefix and lock it.

        ``tokens`` is the prompt (numpy int array, CPU tensor or list); it
        is copied (the caller may reuse its buffer at once). At least one
        token is always left to compute, so the runner gets logits for the
        last one. Returns a handle whose ``cached_len`` tokens are already in
        ``page_table`` (host and storage hits still on their way included,
        see ``Request.ready``).

        Raises TypeError / ValueError for bad ``tokens``, ``namespace`` or
        ``priority``, CacheClosedError after ``close()``; nothing changed.
        """
        if self._refusal is not None:
            raise CacheClosedError(self._refusal)
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        if type(priority) is not int:
            raise TypeError(f"priority must be an int, got {priority!r}")
        arr = as_tokens(tokens, "prompt", copy=True)
        # Nothing below raises: a tier that fails degrades to a miss.
        if self._retention is not None:
            self._retention.expire()  # nothing past its TTL is matched
        if namespace.tags:
            self._tags.note(namespace)
        forgets = self._forgets.get(namespace, 0) if self._forgets else 0
        req = Request(self._next_rid, namespace, arr, priority, forgets)
        usable = arr.size - 1 if arr.size else 0  # the last token is always computed
        match = self.tree.match(namespace, arr, priority, usable)
        if self._tiered and self.tiers.wait_for_loads(match):
            # Another request is loading this prefix back: let those copies land
            # (memcpy speed) and share them instead of stopping short.
            match = self.tree.match(namespace, arr, priority, usable)
        if self._retention is not None and self._retention.masking:
            cut = self._retention.cut_match(match)  # expired pages still held: end before them
            if cut is not None:
                match, req.forgets = cut, -1  # and its own pages stay private
        if match.last_device_node is not None:  # (a miss leaves the new handle as it is)
            req.admit_cached(self.tree, match.last_device_node, match.device_pages, match.device_len)
        if self._tiered:
            self._gate.serving(namespace)  # load-backs are for its tenant
            try:
                self.tiers.on_admit(req, match, arr)
            except BaseException:  # a defect below: undo the admission, leave no live ghost
                self._bulk.end(req)
                raise
        self._next_rid += 1
        self._live[req.rid] = req
        c = self.counters
        c.requests += 1
        c.prompt_tokens += arr.size
        c.hit_tokens += match.device_len
        c.hit_pages += req.num_pages
        self._ledger.admitted(namespace, arr.size, match.device_len, req.cached_len)
        return req

    def peek(self, tokens: object, namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """Tokens of ``tokens`` that ``admit`` would find on the device now.

        Read-only and lock-free: nothing is locked, stamped or split, so a
        scheduler may ask for many candidates and admit only some. The hit
        may shrink before ``admit`` (eviction, a TTL that ran out: ``admit``
        and ``poll`` remove what expired); host and storage hits are not
        counted. Raises TypeError / ValueError for bad arguments,
        CacheClosedError after ``close()``.
        """
        self._check_open()
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        arr = as_tokens(tokens, "prompt")
        return self.tree.peek(namespace, arr[: max(arr.size - 1, 0)])

    def reserve(self, req: Request, num_tokens: int) -> PageIds:
        """Make room for the KV of the next ``num_tokens`` positions.

        Allocates whole pages (evicting unlocked cached pages if the pool is
        short) so that ``page_table`` covers positions up to
        ``num_computed + num_tokens``. Returns the page table (a view). The
        first ``reserve`` or ``commit`` of a request with pending loads
        applies the prefetch policy to them (they land, or the request
        recomputes them: ``cached_len`` shrinks).

        Raises ValueError for a bad ``num_tokens``, RequestStateError for a
        released or foreign request, CacheClosedError after ``close()``
        (nothing changed); OutOfPagesError if even eviction cannot make
        room: nothing allocated, evicted or locked (see radixcache/capacity.py).
        """
        self._begin_step(req, num_tokens, "reserve")
        target = req.num_computed + num_tokens
        if target > req.reserved_tokens:
            need = -(-target // self.page_size) - req.num_pages
            req.add_pages(self._capacity.allocate(need) if need > 0 else EMPTY_PAGES, target)
        return req.page_table

    def _begin_step(self, req: Request, num_tokens: int, what: str) -> None:
        """Checks shared by reserve and commit; then settles pending tier
        loads (the prefetch policy decides how long to wait)."""
        self._check_live(req)
        if type(num_tokens) is not int or num_tokens < 0:
            raise ValueError(f"{what} takes a non-negative int, got {num_tokens!r}")
        if what == "commit":
            req.check_commit(num_tokens)
        self._gate.serving(req.namespace)
        if req.pending:
            self.tiers.resolve(req)

    def extend(self, req: Request, tokens: object) -> None:
        """Append tokens the runner produced (e.g. the sampled token) to
        ``req`` (copied). Raises TypeError / ValueError for bad ``tokens``,
        RequestStateError for a released or foreign request,
        CacheClosedError after ``close()``; nothing changed."""
        self._check_live(req)
        req.append_tokens(as_tokens(tokens, "extend"))

    def commit(self, req: Request, num_tokens: int) -> None:
        """Record that KV for the next ``num_tokens`` positions was written.

        Every full page now computed joins the tree, where other requests can
        share it. Pages another request inserted first are kept from the tree
        and this request's copies go back to the pool (its page table is
        updated to the tree's pages, which hold the same KV).

        Raises ValueError for a bad ``num_tokens`` or one that reaches past
        the reserved positions or the request's tokens, RequestStateError for
        a released or foreign request or a commit of tokens while loads are
        pending (``reserve`` first), CacheClosedError after ``close()``;
        nothing changed. ``commit(req, 0)`` applies the prefetch policy.
        """
        self._begin_step(req, num_tokens, "commit")
        end = req.num_computed + num_tokens
        req.computed(end)
        full = end // self.page_size
        if full > req.shared_pages:
            self._insert(req, full, (end - num_tokens) // self.page_size)

    def _insert(self, req: Request, full: int, before: int) -> None:
        if (self._forgets or req.forgets < 0) and not req.may_insert(
                self._forgets.get(req.namespace, 0)):
            return  # its prefix was forgotten: later pages stay its own, freed at release
        full = self._gate.cap_insert(req.namespace, req.shared_pages, full, before)
        if full <= req.shared_pages:
            return  # the tenant is at its device limit: the pages stay private (counted)
        p = self.page_size
        # Unlock first: the insert may then extend the request's own leaf in
        # place (nothing can be evicted between here and the lock below).
        req.unlock(self.tree)
        tokens, pages = req.first_pages(full, p)
        result = self.tree.insert(req.namespace, tokens, pages, req.priority)
        # A node being loaded back (its device pages in flight) stops the insert
        # early: the pages after it stay private to this request and are
        # inserted by a later commit or freed at release.
        full = result.inserted_pages
        # Pages [shared_pages, existing) were computed by this request but are
        # already cached: adopt the tree's pages, free ours.
        dup_to = max(result.existing_pages, req.shared_pages)
        dup = req.inserted(self.tree, result, dup_to)
        if dup.size:
            self.pool.free(dup)
            self.counters.duplicate_pages += int(dup.size)
        self.counters.committed_pages += full - dup_to
        if self._tiered:
            self.tiers.on_insert(result)

    def release(self, req: Request) -> None:
        """End ``req``: unlock its cached pages and free its private ones.

        A partial last page and reserved-but-unused pages return to the pool.
        Raises RequestStateError if ``req`` was already released (or belongs
        to another cache), TypeError for a non-request, CacheClosedError
        after ``close()``; nothing changed.
        """
        self._check_live(req)
        if req.pending:
            self.tiers.abandon(req)
        private = req.end(self.tree)
        if private.size:
            self.pool.free(private)
        del self._live[req.rid]
        if self.tree.removal.detached:  # pages of forgotten namespaces it held may go now
            self._bulk.sweep()

    # ------------------------------------------------------------------ capacity
    def evict(self, num_pages: int) -> int:
        """Evict at least ``num_pages`` unlocked cached device pages if there are
        that many (pages with a host copy stay cached on the host); returns how
        many device pages were freed. Raises ValueError for a bad
        ``num_pages``, CacheClosedError after ``close()``."""
        self._check_open()
        if type(num_pages) is not int or num_pages < 0:
            raise ValueError(f"evict takes a non-negative int, got {num_pages!r}")
        self._gate.serving(None)  # nobody's pressure: floors hold against every tenant
        return self._capacity.evict(num_pages)

    def _free_evicted(self, pages: PageIds) -> None:
        self.pool.free(pages)
        self.counters.evicted_pages += int(pages.size)

    def poll(self) -> int:
        """Apply finished tier jobs (backups, loads, storage); call once per
        step. Returns how many finished; a failed one is counted
        (``tier_stats().failed_jobs``), never raised. CacheClosedError after
        ``close()``."""
        self._check_open()
        done = self.tiers.poll()
        self._bulk.sweep()  # pages of forgotten namespaces that jobs held may go now
        if self._retention is not None:
            self._retention.expire()
        return done

    def drain(self) -> int:
        """Wait for every tier job in flight (backups, stores, loads, fetches)
        and apply it; returns how many finished (tests, tools, a checkpoint).
        CacheClosedError after ``close()``."""
        self._check_open()
        finished = 0
        while True:
            self.tiers.drain()
            n = self.tiers.poll()
            finished += n
            if not n:
                break
        self._bulk.sweep()
        return finished

    def tier_stats(self) -> TierStats | None:
        """A snapshot of the host and storage tiers, None without them.
        Raises CacheClosedError after ``close()``."""
        self._check_open()
        return self.tiers.stats()

    def take_events(self) -> list[KvEvent]:
        """Page events since the last call, in order (empty unless
        ``record_events``). Call once per engine step and publish the list:
        ``publisher.publish(cache.take_events())``. CacheClosedError after
        ``close()`` (take the last events before closing)."""
        if self._refusal is not None:
            raise CacheClosedError(self._refusal)
        return self._recorder.take()

    def close(self) -> None:
        """Release every live request (their handles die: a runner closes
        at shutdown, often after an error with requests in flight), finish
        in-flight tier jobs and stop their threads; from then on every call
        raises CacheClosedError. A second ``close()`` does nothing; in a
        forked child it touches nothing of the parent's. Never raises for a
        failing tier (logged): the cache is closed either way."""
        if self._refusal is not None:
            return
        try:
            self._bulk.close()
        except Exception:
            log.exception("closing the cache's tiers failed; the cache is closed anyway")
        finally:
            self._refusal = "this cache is closed; build a new RadixCache"

    # ------------------------------------------------------------------ views
    def stats(self) -> CacheStats:
        """A snapshot of the counters and the pools (cheap: read it every
        step). Raises CacheClosedError after ``close()``."""
        self._check_open()
        return snapshot(self.counters, len(self._live), self.pool, self.tree)

    @property
    def live_requests(self) -> list[Request]:
        """Requests admitted and not yet released (none once closed)."""
        return list(self._live.values())

    @property
    def closed(self) -> bool:
        """True after ``close()`` (and in a forked child): every call raises."""
        return self._refusal is not None

    def _check_open(self) -> None:
        if self._refusal is not None:
            raise CacheClosedError(self._refusal)

    def _check_live(self, req: Request) -> None:
        if self._refusal is not None:
            raise CacheClosedError(self._refusal)
        if not isinstance(req, Request):
            raise TypeError(f"expected a Request, got {type(req).__name__}")
        if req.released:
            raise RequestStateError(f"request {req.rid} was already released")
        if self._live.get(req.rid) is not req:
            raise RequestStateError(f"request {req.rid} does not belong to this cache")

    def check_integrity(self) -> None:
        """Verify the tree, the pools, in-flight jobs and every live request
        agree (no leaks, no double ownership, exact lock counts). AssertionError
        if not; CacheClosedError after ``close()``."""
        self._check_open()
        check_cache(self.page_size, self._live.values(), self.tree, self.pool, self.tiers)


def _forked(cache: RadixCache) -> None:
    """In a forked child: the cache's threads, store lock and sockets are the
    parent's; refuse every call (and make ``close`` touch nothing)."""
    if cache._refusal is None:
        cache._refusal = forked_message("this cache", cache._pid)


if native_core is not None:  # the lifecycle's common case in C (radixcache/native/lifecycle.pxi)
    (RadixCache.admit, RadixCache.reserve, RadixCache.commit, RadixCache.release,  # type: ignore[method-assign]
     RadixCache.take_events) = native_core.bind_cache(  # type: ignore[method-assign]
        RadixCache, Request, Namespace, DEFAULT_NAMESPACE, TenantLedger, TenantGate, EMPTY_PAGES, Counters,
        TenantCounters)

"""Where the cache asks about tenants: admission counts, the device limit on
inserts and load-backs, and whom an allocation evicts for.

``TenantGate`` belongs to one ``RadixCache`` (owner thread). Without quotas
it only counts (per-tenant requests and hit tokens); with them:

* ``cap_insert``: a commit of tenant T that would take T's cached device
  pages over its limit first evicts T's own unlocked pages (T's policy
  order; the request's own prefix is still locked then), and what still
  does not fit is not inserted: those pages stay private to the request
  (freed at release, like pages a forgotten namespace cannot cache) and are
  counted as dropped. The count of new pages is the request's computed
  pages past its shared prefix, an upper bound (some may turn out to be
  cached already), so a tenant never goes over its limit.
* ``load_room``: a load back from the host or storage of n pages for T
  makes room the same way, or is skipped (a miss: the request recomputes).
  Both count T's loads in flight (``TenantLedger.device_in_flight``) as
  held: their pages enter the tree when they land, granted already.
* ``requester``: the tenant an allocation is for; the capacity ladder
  evicts for it (``TenantEviction.evict``: floors hold against it), and
  its victims' backups are made for it too (``back_up_victim``: host
  floors hold against it).
* ``enforce``: after a quota change, the tenant's device pages and (with a
  host tier: ``host``, radixcache/tenants/host.py) its host copies are
  evicted down to its new limits.
"""

from __future__ import annotations

from collections.abc import Callable

from radixcache.namespace import Namespace
from radixcache.tenants.eviction import ANY, TenantEviction
from radixcache.tenants.host import HostQuota
from radixcache.tenants.ledger import TenantLedger
from radixcache.tenants.retention import Retention
from radixcache.tree.node import Node, PageIds
from radixcache.tree.radix_tree import RadixTree


class TenantGate:
    """Per-tenant admission counts and device limits of one cache."""

    def __init__(self, tree: RadixTree, ledger: TenantLedger,
                 free: Callable[[PageIds], None]) -> None:
        self.tree = tree
        self.ledger = ledger
        self._free = free  # returns evicted device pages to the pool
        self.before_drop: Callable[[Node], None] | None = None  # the tiers' backup hook
        self._serving: Namespace | None = None  # whose allocations come next; None: nobody's
        self.host: HostQuota | None = None  # host limits (quotas on, with a host tier)
        self.retention: Retention | None = None  # TTL deadlines (quotas on)

    @property
    def eviction(self) -> TenantEviction | None:
        ev = self.tree.eviction
        return ev if isinstance(ev, TenantEviction) else None

    def serving(self, namespace: Namespace | None) -> None:
        """The next allocations are for ``namespace``'s tenant (None: for
        nobody, e.g. the runner's ``evict``: every floor holds)."""
        self._serving = namespace  # (resolved only when eviction needs it)

    @property
    def requester(self) -> object:
        """The tenant the current allocation is for, or ``ANY`` (nobody's)."""
        ns = self._serving
        return ANY if ns is None else self.ledger.key(ns)

    def back_up_victim(self, node: Node) -> None:
        """``before_drop`` for a device eviction for the requester: the tiers
        back the victim ``node`` up (write-back) for the requester's
        pressure, so the victim's tenant, unless it is the requester, keeps
        its host floor (``HostQuota.evicting_for``)."""
        hook, host = self.before_drop, self.host
        if hook is None:
            return
        if host is None:
            hook(node)
            return
        host.evicting_for, host.victim = self.requester, node
        try:
            hook(node)
        finally:
            host.evicting_for, host.victim = None, None

    def _make_room(self, key: object, limit: int, n: int) -> int:
        """Evict ``key``'s own pages so ``n`` more fit under ``limit`` if they
        can; returns how many of the ``n`` fit."""
        held = self.ledger.device_held(key)  # type: ignore[arg-type]
        over = held + n - limit
        ev = self.eviction
        if over > 0 and ev is not None:
            freed = ev.evict_own(key, over, self.before_drop).device_pages  # type: ignore[arg-type]
            if freed.size:
                self._free(freed)  # (the cache counts them as evicted)
            held = self.ledger.device_held(key)  # type: ignore[arg-type]
        return max(0, min(n, limit - held))

    def cap_insert(self, namespace: Namespace, shared: int, full: int, before: int) -> int:
        """How many leading pages of a commit of ``full`` pages (``shared``
        of them in the tree already, ``before`` computed before this commit)
        may be cached under the tenant's limit. Pages a request computed and
        could not cache are counted as dropped once, by the commit that
        computed them (a later commit retries them without counting again)."""
        ledger = self.ledger
        if ledger.book is None:
            return full
        key = ledger.key(namespace)
        limit = ledger.book.get(key).device_pages
        if limit is None or full <= shared:
            return full
        fit = self._make_room(key, limit, full - shared)
        left_out = full - shared - fit
        counted = max(0, before - shared)  # left out by earlier commits: counted then
        if left_out > counted:
            ledger.of(key).dropped_pages += left_out - counted
        return shared + fit

    def load_room(self, n: int) -> bool:
        """Whether ``n`` device pages may be loaded back for the requester
        (its own pages evicted first where its limit needs it)."""
        ledger = self.ledger
        key = self.requester
        if ledger.book is None or key is ANY:
            return True
        limit = ledger.book.get(key).device_pages  # type: ignore[arg-type]
        if limit is None or self._make_room(key, limit, n) >= n:
            return True
        ledger.of(key).dropped_pages += n  # type: ignore[arg-type]
        return False

    def enforce(self, key: object) -> int:
        """Evict ``key``'s own unlocked device pages down to its limit, and
        its own host copies down to its host limit (after a quota change;
        counted in its ``host_own_evicted_pages``); returns the device pages
        that went."""
        book = self.ledger.book
        limit = None if book is None else book.get(key).device_pages  # type: ignore[arg-type]
        went = 0
        if limit is not None:
            before = self.ledger.device.get(key, 0)  # type: ignore[call-overload]
            self._make_room(key, limit, 0)
            went = before - self.ledger.device.get(key, 0)  # type: ignore[call-overload]
        if self.host is not None:  # after the device: its evictions may back pages up
            self.host.enforce(key)  # type: ignore[arg-type]
        if self.retention is not None:  # a TTL set or lowered: its pages past it go now
            self.retention.refresh()
            went += self.retention.expire(key)
        return went

"""Host quotas: a tenant's limit and floor on the host pool.

``attach_host(tiers, ledger)`` is called once, by the cache's builder, while
the host index is empty. Without quotas (``ledger.book`` is None) it does
nothing: host allocation and eviction stay exactly as they are. With them,
the index gets ``TenantHostEviction`` (a victims heap per tenant) and the
tiers' ``allocate_host`` becomes ``HostQuota.allocate``:

* **limit** (``TenantQuota.host_pages``): tenant T needs n host pages (a
  backup of T's node, or a fetch from storage into host pages of T's
  namespace). T's host pages now, plus those reserved for T's jobs in
  flight (``TenantLedger.host_in_flight``), plus n must fit its limit;
  else T's *own* host victims go first (T's policy order, counted in
  ``host_own_evicted_pages``), and if it still does not fit the backup or
  fetch is skipped (counted in ``host_dropped_pages``). That path never
  raised before (host allocation may fail) and does not now.
* **floor** (``TenantQuota.host_floor``): when the pool itself is short,
  victims go in policy order across tenants, but never one that would take
  a tenant other than T below its floor (host copies of a forgotten
  namespace that jobs still hold keep no floor): a victim larger than what its
  tenant has above the floor is cut (``tree.split``) so that only its tail
  goes, page-exact. Those evictions count in the victim tenant's
  ``host_pressure_evicted_pages``. When the free pages plus T's own and
  every other tenant's pages above its floor are fewer than n, nothing is
  evicted, not even under T's own limit: the backup or fetch is skipped at
  once (evicting T's copies first and failing then would lose them for
  nothing).
* **backups of another's victims**: when the device evicts T's pages for
  another tenant R's request, or for nobody (the runner's ``evict``), and
  the write policy backs them up (write-back), the host pages are taken
  for R's pressure, not T's (``evicting_for``, set by
  ``TenantGate.back_up_victim``): T's own copies make room under T's limit
  only above T's host floor (a victim cut page-exact at the floor; if that
  cannot make room, nothing of T's goes and the backup is skipped), and a
  short pool is a pass for R (for nobody: every floor holds). Else a
  backup would swap T's older copies below its floor for new ones, which
  other tenants' pressure must never do. Host copies below the victim
  (``victim``, when it is not stored) count for no floor meanwhile: if the
  backup is not made they go with it, so T's floor is kept by its others.

Every host copy that goes is dropped through ``HostTiers.evict_host_copy``,
which announces it (``BlockRemoved`` on the host medium) like any host
eviction. Granted pages are reserved for T until the job that got them
lands (``HostIndex.settle``). Owner thread only.
"""

from __future__ import annotations

from radixcache.namespace import Namespace
from radixcache.tenants.eviction import add_pages_below, dead_pages
from radixcache.tenants.host_eviction import TenantHostEviction
from radixcache.tenants.ledger import TenantLedger
from radixcache.tenants.quota import QuotaBook, TenantKey
from radixcache.tiers.host_tiers import HostTiers
from radixcache.tree.node import Node, PageIds


class HostQuota:
    """Host limits and floors of one cache's tenants (see the module)."""

    def __init__(self, tiers: HostTiers, ledger: TenantLedger, book: QuotaBook,
                 eviction: TenantHostEviction) -> None:
        self.tiers = tiers
        self.ledger = ledger
        self.book = book
        self.eviction = eviction
        # Whose device eviction the allocations made now back victims up for
        # (a tenant, or ANY: the runner's evict); None: the pages' own tenant's.
        # Set by ``TenantGate.back_up_victim`` around one victim's backup.
        self.evicting_for: object = None
        # The device victim being backed up then (set with ``evicting_for``):
        # host copies below it go with it if its backup is not made.
        self.victim: Node | None = None

    def allocate(self, n: int, namespace: Namespace) -> PageIds | None:
        """``n`` host pages for ``namespace``'s tenant, reserved for it; None
        if its limit or the pool leaves no room (see the module)."""
        ledger = self.ledger
        key = ledger.key(namespace)
        by = self.evicting_for
        requester = key if by is None else by  # whose pressure this allocation serves
        pool = self.tiers.host
        if pool.free_count < n and pool.free_count + self._takeable(requester) < n:
            return None  # the pool cannot make room: evict nothing (then fail)
        limit = self.book.get(key).host_pages
        if limit is not None and not self._fit(key, limit, n, keep_floor=requester != key):
            ledger.of(key).host_dropped_pages += n
            return None
        pages = pool.allocate(n)
        if pages is None and pool.free_count + self._takeable(requester) >= n:
            self._evict(requester, n - pool.free_count, own=False)  # type: ignore[arg-type]
            pages = pool.allocate(n)
        if pages is not None:
            ledger.reserve_host(namespace, n)
        return pages

    def enforce(self, key: TenantKey) -> int:
        """Evict ``key``'s own host copies down to its host limit (after a
        quota change); returns the host pages that went."""
        limit = self.book.get(key).host_pages
        if limit is None:
            return 0
        ledger = self.ledger
        over = ledger.host.get(key, 0) + ledger.host_in_flight.get(key, 0) - limit
        return self._evict(key, over, own=True) if over > 0 else 0

    def _fit(self, key: TenantKey, limit: int, n: int, keep_floor: bool) -> bool:
        """Whether ``n`` more host pages fit ``key``'s ``limit``, after
        evicting its own host copies where that helps (with ``keep_floor``,
        only those above its host floor: the pages are backups of victims
        of another's device eviction)."""
        ledger = self.ledger
        flying = ledger.host_in_flight.get(key, 0)
        if n + flying > limit:
            return False  # not even with every copy of its own gone: evict nothing
        over = ledger.host.get(key, 0) + flying + n - limit
        if over > 0 and keep_floor and over > self._room_above_floor(key, self._dead()):
            return False  # only with copies its floor keeps: evict nothing
        if over > 0:
            self._evict(key, over, own=True, keep_floor=keep_floor)
            over = ledger.host.get(key, 0) + flying + n - limit
        return over <= 0

    def _takeable(self, requester: object) -> int:
        """An upper bound of what a pass for ``requester`` (a tenant, or ANY:
        nobody) may free: its own host pages and every other tenant's above
        its floor (copies in use may not go either). Below what is needed,
        nothing is evicted."""
        dead = self._dead()
        total = 0
        for tenant, held in self.ledger.host.items():
            total += held if tenant == requester else max(0, self._room_above_floor(tenant, dead))
        return total

    def _dead(self) -> dict[TenantKey, int]:
        """Host copies no floor keeps, per tenant: those of forgotten
        namespaces still held (radixcache/tenants/eviction.py), and those
        below the victim being backed up, which go with it if the backup
        is not made (its own tenant's floor is then kept by its other
        copies, so a failed backup cannot take it below)."""
        dead = dead_pages(self.tiers.tree, self.ledger, host=True)
        victim = self.victim
        # (a forgotten victim's subtree is detached: counted just above)
        if victim is not None and not (victim.stored or victim.forgotten):
            add_pages_below(victim, self.ledger, True, dead)
        return dead

    def _room_above_floor(self, tenant: TenantKey, dead: dict[TenantKey, int]) -> int:
        held = self.ledger.host.get(tenant, 0) - dead.get(tenant, 0)
        return held - self.book.get(tenant).host_floor

    def _evict(self, requester: TenantKey, want: int, own: bool, keep_floor: bool = False) -> int:
        """Drop up to ``want`` host pages (whole victims, more if the last is
        larger): ``own``: of ``requester`` alone, in its policy order (with
        ``keep_floor``, keeping it at or above its floor); else of every
        tenant in policy order, keeping tenants other than ``requester`` at
        or above their floors. Returns the pages freed."""
        ev, tiers, ledger = self.eviction, self.tiers, self.ledger
        ev.refresh()
        freed = 0
        blocked: set[TenantKey] = set()  # tenants at their floor for this pass
        dead = self._dead()  # fixed for the pass (as for the device: TenantEviction.evict)
        while freed < want:
            if own:
                node = ev.first_of(requester)
                if node is None:
                    break
                tenant = requester
            else:
                pick = ev.first(blocked)
                if pick is None:
                    break
                tenant, node = pick
            assert node.host is not None
            keep = 0  # leading pages the floor keeps
            if tenant != requester or keep_floor:
                room = self._room_above_floor(tenant, dead)
                if room <= 0:
                    if own:
                        break  # its own copies were all it could give
                    blocked.add(tenant)  # at its floor: nothing more of it goes
                    continue
                size = int(node.host.size)
                if size > room:  # all of it would take the tenant below its floor
                    keep = size - min(room, want - freed)
            ev.take(tenant)
            if keep:
                tiers.tree.split(node, keep)  # ``node`` is now the tail; the head stays tracked
            pages = tiers.evict_host_copy(node)
            freed += pages
            counters = ledger.of(tenant)
            if own:
                counters.host_own_evicted_pages += pages
            else:
                counters.host_pressure_evicted_pages += pages
        return freed


def attach_host(tiers: HostTiers, ledger: TenantLedger) -> HostQuota | None:
    """With quotas on, give ``tiers`` (its host index empty) per-tenant host
    eviction and ``HostQuota.allocate``; returns the ``HostQuota`` (None,
    and nothing changed, without quotas)."""
    book = ledger.book
    if book is None:
        return None
    index = tiers.index
    if index.host_pages or len(index.eviction):
        raise ValueError("host quotas are attached to an empty host index only")
    eviction = TenantHostEviction(index.eviction.policy, ledger)
    index.eviction = eviction
    quota = HostQuota(tiers, ledger, book, eviction)
    tiers.allocate_host = quota.allocate  # type: ignore[method-assign]
    return quota

"""``RadixCache.tenants``: the run-time view and controls of tenants."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from radixcache.tenants.gate import TenantGate
from radixcache.tenants.ledger import StorageShare, TenantCounters, TenantStats
from radixcache.tenants.quota import QuotaBook, Salt, TenantKey, TenantQuota, tenant_key, tenant_label


class Tenants:
    """Per-tenant quotas and statistics of one cache (owner thread, like the
    cache; every call raises CacheClosedError after the cache's ``close()``)."""

    def __init__(self, gate: TenantGate, check_open: Callable[[], None],
                 changed: Callable[[], None] = lambda: None,
                 storage: Callable[[], dict[TenantKey, StorageShare]] = dict) -> None:
        self._gate = gate
        self._check_open = check_open
        self._changed = changed  # the storage tier takes the byte quotas again
        self._storage = storage  # the storage tier's per-tenant figures

    @property
    def quotas_on(self) -> bool:
        """True if the cache was opened with quotas (``CacheConfig.quotas``)."""
        return self._gate.ledger.book is not None

    def _book(self) -> QuotaBook:
        self._check_open()
        book = self._gate.ledger.book
        if book is None:
            raise ValueError("quotas are off for this cache: open it with CacheConfig(quotas=...) "
                             "({} turns them on with none set)")
        return book

    def quota(self, salt: Salt) -> TenantQuota:
        """The quota that applies to the tenant of ``salt`` (its own, else the default)."""
        return self._book().get(tenant_key(salt))

    def set_quota(self, salt: Salt, quota: TenantQuota | None) -> int:
        """Set (None: clear) the quota of the tenant of ``salt``, at once.

        A lowered device limit is enforced now: the tenant's own unlocked
        device pages are evicted (its policy order, announced as removals)
        until it fits; pages live requests hold cannot go and count until
        released, and its next insert makes room again. A lowered host
        limit likewise evicts its own host copies (counted in
        ``host_own_evicted_pages``); storage byte limits go to the store
        (LMDB, a Valkey pool) for the writes that follow; a TTL holds at
        once (pages past it go now). Returns the device pages evicted. TypeError / ValueError for a bad salt or quota
        (nothing changed), ValueError if the cache runs without quotas."""
        book = self._book()
        key = tenant_key(salt)  # validates the salt first
        if quota is not None and not isinstance(quota, TenantQuota):
            raise TypeError(f"quota must be a TenantQuota or None, got {type(quota).__name__}")
        book.set(salt, quota)
        self._changed()
        return self._gate.enforce(key)

    def set_default(self, quota: TenantQuota) -> int:
        """Set the quota of every tenant without its own; enforced at once
        for each tenant it applies to (see ``set_quota``). Returns the
        device pages evicted."""
        book = self._book()
        if not isinstance(quota, TenantQuota):
            raise TypeError(f"quota must be a TenantQuota, got {type(quota).__name__}")
        book.default = quota
        self._changed()
        own = {k for k, _ in book.items()}
        ledger = self._gate.ledger
        tenants = {*ledger.device, *ledger.host, *ledger.host_in_flight} - own
        return sum(self._gate.enforce(k) for k in tenants)

    def stats(self) -> dict[str, TenantStats]:
        """Per tenant (named as events name its salt; ``(none)``: no salt):
        its quota, cached device and host pages now, its counters, and its
        share of the storage tier where the store counts per tenant (LMDB;
        a Valkey pool: one round trip)."""
        self._check_open()
        ledger = self._gate.ledger
        out = ledger.stats()
        for key, share in self._storage().items():
            label = tenant_label(key)
            had = out.get(label)
            out[label] = (replace(had, storage=share) if had is not None else
                          TenantStats(label, ledger.quota(key), 0, 0, TenantCounters(), share))
        return out

"""What each tenant holds and did: exact page counts per tier, and counters.

``TenantLedger`` belongs to one cache (owner thread). The tree keeps its
device counts exact as pages come and go (attach, extend, drop, removal,
reset); with quotas on, also the evictable (unlocked) device pages per
tenant, which the allocation ladder needs to know what eviction may take
for whom, and ``device_in_flight``: device pages of a tenant's loads back
from the host or storage that have not landed in the tree yet (reserved
by the load jobs when they start, settled when they land), so that a
commit or another load of the tenant cannot take the room a load in flight
was granted. The host tier keeps ``host`` likewise (``HostIndex``: every host
copy attached, dropped or discarded) and, with quotas on, ``host_in_flight``:
host pages allocated for a tenant's backup or fetch that has not landed yet
(reserved by ``radixcache.tenants.host``, settled by the job when it lands),
so that jobs in flight cannot take a tenant past its host limit together.
Nothing here decides anything: ``radixcache.tenants.eviction``,
``radixcache.tenants.host`` and the cache read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from radixcache.namespace import Namespace
from radixcache.tenants.quota import QuotaBook, TenantKey, TenantQuota, tenant_label


@dataclass(slots=True)
class TenantCounters:
    """Monotonic per-tenant counters (pages and tokens)."""

    requests: int = 0  # requests admitted
    prompt_tokens: int = 0  # tokens of their prompts
    device_hit_tokens: int = 0  # found on the device at admission
    lower_hit_tokens: int = 0  # found on the host or in storage at admission
    own_evicted_pages: int = 0  # device pages evicted to keep the tenant within its limit
    pressure_evicted_pages: int = 0  # device pages evicted to make room (any tenant's request)
    dropped_pages: int = 0  # device pages not cached because the tenant was at its limit
    host_own_evicted_pages: int = 0  # host pages evicted to keep it within its host limit
    host_pressure_evicted_pages: int = 0  # host pages evicted to make room
    host_dropped_pages: int = 0  # backups to the host not made: at its host limit
    expired_pages: int = 0  # device and host pages removed past the tenant's TTL
    invalidated_pages: int = 0  # device pages removed by invalidate(tag)
    forgotten_pages: int = 0  # device pages removed by forget_namespace


@dataclass(frozen=True, slots=True)
class StorageShare:
    """A tenant's share of the storage tier (its store's own per-tenant figures:
    ``LmdbStorage.tenant_stats``, ``ValkeyStorage.tenant_stats``)."""

    medium: str  # "DISK" (LMDB) or "EXTERNAL" (a shared pool)
    stored_bytes: int  # bytes of its records or values now
    quota_evicted: int  # removed to keep it within its byte limit (since the store opened)
    dropped_pages: int  # not written: over its limit (since the store opened)


@dataclass(frozen=True, slots=True)
class TenantStats:
    """One tenant's snapshot (``RadixCache.tenant_stats``)."""

    tenant: str  # the salt as events carry it; "(none)" for no salt
    quota: TenantQuota
    device_pages: int  # cached device pages now
    host_pages: int  # host-pool pages now
    counters: TenantCounters  # a copy
    storage: StorageShare | None = None  # its share of the storage tier, if the store counts it

    @property
    def hit_ratio(self) -> float:
        """Share of prompt tokens found cached (any tier) at admission."""
        c = self.counters
        return (c.device_hit_tokens + c.lower_hit_tokens) / c.prompt_tokens if c.prompt_tokens else 0.0


class TenantLedger:
    """Per-tenant page counts of one cache, and its per-tenant counters."""

    def __init__(self, book: QuotaBook | None) -> None:
        self.book = book  # None: no quotas (counts and counters only)
        self.device: dict[TenantKey, int] = {}  # cached device pages
        self.evictable: dict[TenantKey, int] = {}  # of those, unlocked (with quotas only)
        self.device_in_flight: dict[TenantKey, int] = {}  # loads not landed (with quotas only)
        self.host: dict[TenantKey, int] = {}  # host-pool pages (attached host copies)
        self.host_in_flight: dict[TenantKey, int] = {}  # reserved for jobs (with quotas only)
        self.counters: dict[TenantKey, TenantCounters] = {}
        self._keys: dict[Namespace, TenantKey] = {}
        self._by_ns: dict[Namespace, TenantCounters] = {}

    @property
    def quotas_on(self) -> bool:
        return self.book is not None

    def key(self, namespace: Namespace) -> TenantKey:
        key = self._keys.get(namespace, _MISSING)
        if key is _MISSING:
            key = self._keys[namespace] = namespace.tenant
        return key  # type: ignore[return-value]

    def of(self, key: TenantKey) -> TenantCounters:
        c = self.counters.get(key)
        if c is None:
            c = self.counters[key] = TenantCounters()
        return c

    def counters_of(self, namespace: Namespace) -> TenantCounters:
        """``of(key(namespace))`` in one lookup (admission calls it per request)."""
        c = self._by_ns.get(namespace)
        if c is None:
            c = self._by_ns[namespace] = self.of(self.key(namespace))
        return c

    def admitted(self, namespace: Namespace, prompt: int, device: int, cached: int) -> None:
        """A request of ``namespace`` was admitted: ``prompt`` tokens, of
        which ``device`` found on the device and ``cached`` in all."""
        c = self._by_ns.get(namespace)  # (``counters_of`` without its frame: once per request)
        if c is None:
            c = self.counters_of(namespace)
        c.requests += 1
        c.prompt_tokens += prompt
        c.device_hit_tokens += device
        c.lower_hit_tokens += cached - device

    def quota(self, key: TenantKey) -> TenantQuota:
        return self.book.get(key) if self.book is not None else _NONE

    # ------------------------------------------------------------------ device counts
    def add_device(self, namespace: Namespace, n: int, evictable: bool) -> None:
        key = self.key(namespace)
        _add(self.device, key, n)
        if evictable and self.book is not None:
            _add(self.evictable, key, n)

    def sub_device(self, namespace: Namespace, n: int, evictable: bool) -> None:
        key = self.key(namespace)
        _add(self.device, key, -n)
        if evictable and self.book is not None:
            _add(self.evictable, key, -n)

    def lock_change(self, namespace: Namespace, n: int) -> None:
        """``n`` device pages of the tenant became evictable (n > 0) or locked."""
        _add(self.evictable, self.key(namespace), n)

    def reserve_load(self, namespace: Namespace, n: int) -> None:
        """A load of ``n`` device pages of ``namespace`` started: they count
        against its tenant's device limit until ``settle_load``. No-op
        without quotas."""
        if self.book is not None:
            _add(self.device_in_flight, self.key(namespace), n)

    def settle_load(self, namespace: Namespace, n: int) -> None:
        """A load's ``n`` reserved device pages landed (counted in ``device``
        now) or went back to the pool. No-op without quotas."""
        if self.book is not None:
            _add(self.device_in_flight, self.key(namespace), -n)

    def load_fits(self, namespace: Namespace, n: int) -> bool:
        """Whether ``n`` more device pages of the tenant fit its device limit
        next to what it holds and what other loads will add (True without
        quotas or a limit)."""
        if self.book is None:
            return True
        key = self.key(namespace)
        limit = self.book.get(key).device_pages
        return limit is None or self.device_held(key) + n <= limit

    def device_held(self, key: TenantKey) -> int:
        """The tenant's cached device pages plus those its loads in flight
        will add to the tree (granted already: they count from the start)."""
        return self.device.get(key, 0) + self.device_in_flight.get(key, 0)

    def check_loads(self, in_flight: Iterable[tuple[Namespace, int]]) -> None:
        """AssertionError unless, with quotas, ``device_in_flight`` equals
        ``in_flight`` (what live load jobs reserved), summed per tenant."""
        if self.book is None:
            return
        flying = self._per_tenant(in_flight)
        assert self.device_in_flight == flying, (
            f"ledger device pages in flight {self.device_in_flight} != the loads' {flying}"
        )

    def clear_device(self) -> None:
        self.device.clear()
        self.evictable.clear()
        self.device_in_flight.clear()

    # ------------------------------------------------------------------ host counts
    def add_host(self, namespace: Namespace, n: int) -> None:
        key = self._keys.get(namespace)  # ``key`` inlined (every host copy comes here)
        if key is None and namespace.salt is not None:
            key = self.key(namespace)
        _add(self.host, key, n)

    def sub_host(self, namespace: Namespace, n: int) -> None:
        key = self._keys.get(namespace)
        if key is None and namespace.salt is not None:
            key = self.key(namespace)
        _add(self.host, key, -n)

    def reserve_host(self, namespace: Namespace, n: int) -> None:
        """``n`` host pages were allocated for a job of the tenant (quotas on)."""
        _add(self.host_in_flight, self.key(namespace), n)

    def settle_host(self, namespace: Namespace, n: int) -> None:
        """A job's ``n`` reserved host pages landed (attached: counted in
        ``host`` now) or went back to the pool. No-op without quotas (nothing
        was reserved)."""
        if self.book is None:
            return
        _add(self.host_in_flight, self.key(namespace), -n)

    def clear_host(self) -> None:
        self.host.clear()
        self.host_in_flight.clear()

    def check_host(
        self, held: Mapping[Namespace, int], in_flight: Iterable[tuple[Namespace, int]]
    ) -> None:
        """AssertionError unless ``host`` equals ``held`` (host pages of the
        tree's nodes, per namespace) and, with quotas, ``host_in_flight``
        equals ``in_flight`` (what live jobs reserved), summed per tenant."""
        want = self._per_tenant(held.items())
        assert self.host == want, f"ledger host pages {self.host} != the tree's {want}"
        if self.book is None:
            return
        flying = self._per_tenant(in_flight)
        assert self.host_in_flight == flying, (
            f"ledger host pages in flight {self.host_in_flight} != the jobs' {flying}"
        )

    def _per_tenant(self, counts: Iterable[tuple[Namespace, int]]) -> dict[TenantKey, int]:
        """``counts`` per namespace summed per tenant (zeros left out), for the checks."""
        out: dict[TenantKey, int] = {}
        for namespace, n in counts:
            if n:
                key = self.key(namespace)
                out[key] = out.get(key, 0) + n
        return out

    # ------------------------------------------------------------------ views
    def stats(self) -> dict[str, TenantStats]:
        keys = set(self.device) | set(self.host) | set(self.counters)
        if self.book is not None:
            keys |= {k for k, _ in self.book.items()}
        out: dict[str, TenantStats] = {}
        for key in keys:
            c = self.counters.get(key) or TenantCounters()
            copy = TenantCounters(*(getattr(c, f.name) for f in fields(TenantCounters)))
            label = tenant_label(key)
            out[label] = TenantStats(label, self.quota(key), self.device.get(key, 0),
                                     self.host.get(key, 0), copy)
        return out


def _add(counts: dict[TenantKey, int], key: TenantKey, n: int) -> None:
    """``counts[key] += n``; a count that reaches 0 leaves the dict (the
    dicts hold only tenants with pages, so their views stay small)."""
    left = counts.get(key, 0) + n
    assert left >= 0, f"tenant {key!r}: a count went below zero ({left})"
    if left:
        counts[key] = left
    else:
        del counts[key]


_MISSING = object()
_NONE = TenantQuota()

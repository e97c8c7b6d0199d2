"""The cache's configuration, and the parts it wires together.

``CacheConfig`` is the frozen, validated configuration of the device tier
and the index (the tiers below the device have their own ``TierConfig``).
``build_index`` makes what a ``RadixCache`` indexes its pages with: the
tree, with its event recorder, and the tiers below the device (``NullTiers``
without them; else a host pool, its ``HostIndex``, storage as configured,
and ``HostTiers`` driving them). Called once, by ``RadixCache.__init__``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.tree.policies import make_eviction_policy
from radixcache.tiers.host_index import HostIndex
from radixcache.tree.node import PageIds
from radixcache.offload import HostPool
from radixcache.keys.page_keys import PageKeys
from radixcache.recorder import EventRecorder, EventSink, NoEvents
from radixcache.tiers.survivors import announce_survivors
from radixcache.tiers.config import TierConfig, open_storage
from radixcache.tiers.contract import NullTiers, Tiers
from radixcache.tiers.host_tiers import AllocateDevice, HostTiers
from radixcache.transfer import DeviceKVBuffer, KVSpec
from radixcache.tree.radix_tree import RadixTree
from radixcache.tenants.device import attach
from radixcache.tenants.host import HostQuota, attach_host
from radixcache.tenants.ledger import TenantLedger
from radixcache.tenants.quota import QuotaBook, TenantQuota
from radixcache.tenants.retention import Clock, Retention, RetentionRecorder


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Configuration of the device tier and the index.

    Give the device pool size as ``device_pages`` or ``device_bytes`` (exactly
    one). ``allocate_kv=False`` runs the same index and page accounting with
    no KV tensors (capacity planning, trace replay).
    """

    spec: KVSpec  # KV geometry; its page_size is the tree's page size
    device_pages: int | None = None  # device pool size in pages
    device_bytes: int | None = None  # ...or in bytes (whole pages are kept)
    device: str = "cpu"  # "cuda" when present, else the CPU
    eviction_policy: str = "lru"  # lru, lfu, fifo, priority (see radixcache.tree.policies)
    allocate_kv: bool = True  # False: index and pools only, no KV tensors
    tiers: TierConfig | None = None  # host (and storage) tiers; None: device only
    record_events: bool = False  # record page events for take_events() (routers)
    # Per-tenant limits and floors (radixcache.tenants): {salt: TenantQuota}, a
    # QuotaBook, or None (off). {} turns quotas on with none set (set_quota later).
    quotas: QuotaBook | dict[str | bytes | None, TenantQuota] | None = field(
        default=None, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.spec, KVSpec):
            raise TypeError(f"spec must be a KVSpec, got {type(self.spec).__name__}")
        if (self.device_pages is None) == (self.device_bytes is None):
            raise ValueError("give exactly one of device_pages or device_bytes")
        if self.device_pages is not None and (
            not isinstance(self.device_pages, int) or self.device_pages <= 0
        ):
            raise ValueError(f"device_pages must be a positive int, got {self.device_pages!r}")
        if self.device_bytes is not None and self.device_bytes < self.spec.page_bytes:
            raise ValueError(
                f"device_bytes={self.device_bytes} holds no page of {self.spec.page_bytes} B"
            )
        make_eviction_policy(self.eviction_policy)  # validates the name
        quota_book(self.quotas)  # validates
        if self.tiers is not None and not self.allocate_kv:
            raise ValueError("host and storage tiers need KV tensors (allocate_kv=True)")

    @property
    def num_device_pages(self) -> int:
        if self.device_pages is not None:
            return self.device_pages
        assert self.device_bytes is not None
        return self.device_bytes // self.spec.page_bytes


def quota_book(quotas: object) -> QuotaBook | None:
    """A fresh ``QuotaBook`` of ``CacheConfig.quotas`` (the cache's own, so
    ``set_quota`` changes no one else's), or None when quotas are off."""
    if quotas is None:
        return None
    if isinstance(quotas, QuotaBook):
        return QuotaBook(dict(quotas.items_by_salt()), quotas.default)
    if not isinstance(quotas, dict):
        raise TypeError(f"quotas must be a dict of salt -> TenantQuota, a QuotaBook or None, "
                        f"got {type(quotas).__name__}")
    return QuotaBook(quotas)


StorageQuota = tuple[int | None, int]  # (limit bytes or None, floor bytes)


def storage_quotas(
    book: QuotaBook | None,
) -> tuple[dict[bytes | None, StorageQuota], StorageQuota | None]:
    """The storage byte quotas ``book`` sets (``storage_bytes``,
    ``storage_floor``), as the LMDB store takes them: per tenant, and for
    tenants not listed (None: the book sets none). A quota that sets neither
    is left out: the store's own ``StorageConfig`` quota holds for it."""
    if book is None:
        return {}, None

    def sets(q: TenantQuota) -> bool:
        return q.storage_bytes is not None or q.storage_floor > 0

    quotas = {t: (q.storage_bytes, q.storage_floor) for t, q in book.items() if sets(q)}
    d = book.default
    return quotas, ((d.storage_bytes, d.storage_floor) if sets(d) else None)


def pool_quotas(book: QuotaBook | None) -> tuple[dict[bytes | None, int | None], int | None]:
    """The shared-pool byte limits ``book`` sets (``pool_bytes``), as a Valkey
    pool takes them: per tenant, and for tenants not listed."""
    if book is None:
        return {}, None
    return ({t: q.pool_bytes for t, q in book.items() if q.pool_bytes is not None},
            book.default.pool_bytes)


@dataclass(frozen=True, slots=True)
class CacheIndex:
    """What ``build_index`` made."""

    tree: RadixTree  # the index, device residency, locks; its recorder records events
    tiers: Tiers  # the tiers below the device (``NullTiers``: none)
    recorder: EventSink  # what the tree and the tiers report; ``take_events`` drains it
    host_quota: HostQuota | None = None  # host limits and floors (quotas on, a host tier)
    retention: Retention | None = None  # TTL deadlines (quotas on)


def build_index(
    config: CacheConfig,
    kv: DeviceKVBuffer | None,
    allocate_device: AllocateDevice,
    free_device: Callable[[PageIds], None],
    ledger: TenantLedger,
    clock: Clock = time.time,
) -> CacheIndex:
    """The tree and the tiers for ``config``. ``kv`` is the device KV buffer
    (None without KV tensors); the tiers take device pages for load-back
    through ``allocate_device`` (None when there is no room) and give them
    back through ``free_device``. With storage and ``record_events``, what
    storage kept from an earlier run is announced at once (for routers)."""
    page_size = config.spec.page_size
    policy = make_eviction_policy(config.eviction_policy)
    recorder: EventSink = (
        EventRecorder(PageKeys(page_size)) if config.record_events else NoEvents()
    )
    # With quotas on, the tree's reports also date nodes for retention (TTL).
    retention = None if ledger.book is None else Retention(ledger.book, clock, ledger)
    reports: EventSink = recorder if retention is None else RetentionRecorder(recorder, retention)
    if config.tiers is None:
        tree = RadixTree(page_size, policy, reports)
        attach(tree, ledger)
        return CacheIndex(tree, NullTiers(), recorder, None, retention)
    assert kv is not None
    host = HostPool(config.spec, config.tiers.host, config.num_device_pages, native_core)
    index = HostIndex(host, reports, page_size, policy, ledger)
    tree = RadixTree(page_size, policy, reports, index)
    attach(tree, ledger)
    tiers = HostTiers(
        tree,
        index,
        kv,
        config.tiers,
        open_storage(config.tiers, config.spec, *storage_quotas(ledger.book),
                     pool_quotas(ledger.book)),
        allocate_device,
        free_device,
    )
    host_quota = attach_host(tiers, ledger)
    if config.record_events:  # what storage kept from an earlier run, for routers
        announce_survivors(tiers.storage, recorder, page_size)
    return CacheIndex(tree, tiers, recorder, host_quota, retention)

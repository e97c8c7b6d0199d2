"""Configuration, counters and the stats snapshot of the tiers below the device."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from radixcache.offload import (
    HostPoolConfig,
    LatencyHistogram,
    ModelFingerprint,
    NullStorage,
    PrefetchPolicy,
    StorageConfig,
    StorageOpening,
    StorageStats,
    StorageTarget,
    WritePolicy,
    make_prefetch_policy,
    make_write_policy,
    open_backend,
    storage_config,
)
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.native import hand_to_storage
from radixcache.transfer import KVSpec

log = logging.getLogger(__name__)
hand_to_storage()  # the stores this module opens copy and sum records in one pass (compiled core)
_Own = TypeVar("_Own")


@dataclass(frozen=True, slots=True)
class TierConfig:
    """Host and storage tiers (names follow HiCache's where they exist)."""

    host: HostPoolConfig = field(default_factory=lambda: HostPoolConfig(ratio=2.0))
    write_policy: str = "write_through"  # write_through, write_through_selective, write_back
    write_threshold: int = 2  # hits before write_through_selective backs a node up
    prefetch_policy: str = "best_effort"  # best_effort, wait_complete, timeout
    prefetch_base_s: float = 0.002  # timeout policy: fixed wait per request
    prefetch_per_token_s: float = 2e-7  # timeout policy: extra wait per token in flight
    # None: no storage tier; an LMDB StorageConfig, a ValkeyConfig, a
    # MooncakeConfig, or a URL / directory (``lmdb:///DIR``, ``DIR``,
    # ``valkey://HOST:PORT/DB[?cluster=true]``, ``mooncake://HOST:PORT?...``),
    # parsed here into one of them (a password never appears in the repr)
    storage: StorageTarget = None
    model_id: str = "radixcache-model"  # part of the storage fingerprint
    tp_rank: int = 0  # part of the storage fingerprint
    # True for MLA-style models whose every rank holds the same KV: the rank
    # leaves the fingerprint, so all ranks share one stored copy of a page
    # (ModelFingerprint.rank_shared). Wrong for models whose ranks hold
    # different heads: they would read each other's pages.
    kv_shared_across_ranks: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, HostPoolConfig):
            raise TypeError(f"host must be a HostPoolConfig, got {type(self.host).__name__}")
        target: StorageTarget = self.storage
        object.__setattr__(self, "storage", storage_config(target))
        self.write()
        self.prefetch()

    def write(self) -> WritePolicy:
        """The configured write policy object (validates the name)."""
        if self.write_policy == "write_through_selective":
            return make_write_policy(self.write_policy, threshold=self.write_threshold)
        return make_write_policy(self.write_policy)

    def prefetch(self) -> PrefetchPolicy:
        """The configured prefetch policy object (validates the name)."""
        if self.prefetch_policy == "timeout":
            return make_prefetch_policy(
                "timeout", base_s=self.prefetch_base_s, per_token_s=self.prefetch_per_token_s
            )
        return make_prefetch_policy(self.prefetch_policy)


@dataclass(slots=True)
class TierCounters:
    host_hit_tokens: int = 0  # prompt tokens found in host memory at admission
    storage_hit_tokens: int = 0  # prompt tokens storage served (verified, to a waiting request)
    loaded_tokens: int = 0  # of those, loaded back in time for their request
    abandoned_tokens: int = 0  # given up (not in time, or failed): recomputed
    backups_skipped: int = 0  # backups not made: no host page could be freed
    host_evicted_pages: int = 0  # host pages dropped to make room
    failed_jobs: int = 0  # copies or storage operations that failed


@dataclass(frozen=True, slots=True)
class TierStats:
    """A snapshot of the tiers below the device."""

    host_pages: int  # host pool capacity
    host_free_pages: int  # free host pages
    host_cached_pages: int  # host pages held by the tree
    host_hit_tokens: int  # prompt tokens found in host memory at admission
    storage_hit_tokens: int  # prompt tokens storage served (verified, to a waiting request)
    loaded_tokens: int  # of those, loaded back in time for their request
    abandoned_tokens: int  # given up or failed: recomputed
    backups_skipped: int  # backups not made for lack of host room
    host_evicted_pages: int  # host pages dropped to make room
    failed_jobs: int  # copies or storage operations that failed
    in_flight: int  # jobs in flight now
    pages_moved: dict[str, int]  # per direction (device_to_host, host_to_device, ...)
    bytes_moved: dict[str, int]  # per direction
    bytes_per_second: dict[str, float]  # per direction, over job latency
    storage: StorageStats | None  # the storage backend's counters, None without one
    storage_state: str  # "opened", "recovered" (damaged store moved aside) or "disabled"
    job_latency: dict[str, LatencyHistogram] = field(default_factory=dict)  # per direction


def open_storage(
    config: TierConfig,
    spec: KVSpec,
    tenant_quotas: Mapping[bytes | None, tuple[int | None, int]] | None = None,
    tenant_quota_default: tuple[int | None, int] | None = None,
    pool_quotas: tuple[Mapping[bytes | None, int | None], int | None] = ({}, None),
) -> StorageOpening:
    """The storage tier ``config`` asks for: LMDB (recovered or disabled when
    it cannot be opened, see offload/lmdb/opening.py), a Valkey pool, or
    ``NullStorage``; the cache's byte quotas are laid over the store's own
    config by ``with_quota_book``."""
    if config.storage is None:
        return StorageOpening(NullStorage(), "disabled")
    fingerprint = ModelFingerprint(
        config.model_id, spec.describe(), config.tp_rank, config.kv_shared_across_ranks
    )
    pool, pool_default = pool_quotas
    if (pool or pool_default is not None) and not isinstance(config.storage, ValkeyConfig):
        log.warning("pool_bytes quotas are set but the storage tier (%s) does not enforce "
                    "them: only a Valkey pool does", type(config.storage).__name__)
    target = with_quota_book(config.storage, tenant_quotas, tenant_quota_default, pool_quotas)
    return open_backend(target, spec, fingerprint)


def with_quota_book(
    own: _Own,
    tenant_quotas: Mapping[bytes | None, tuple[int | None, int]] | None = None,
    tenant_quota_default: tuple[int | None, int] | None = None,
    pool_quotas: tuple[Mapping[bytes | None, int | None], int | None] = ({}, None),
) -> _Own:
    """The storage config ``own`` (as the user wrote it) with the cache's
    byte quotas laid over its own: ``tenant_quotas`` / ``tenant_quota_default``
    (``TenantQuota.storage_bytes`` and ``storage_floor``) over an LMDB
    ``StorageConfig``'s, ``pool_quotas`` (per tenant, default: ``pool_bytes``)
    over a Valkey pool's. A tenant the cache lists takes the cache's quota,
    any other keeps the config's; a default the cache gives replaces the
    config's. Any other config comes back as it is. Opening a store and a
    quota change at run time both lay the book over the user's own config,
    so a quota cleared at run time gives the tenant its configured one back."""
    if isinstance(own, StorageConfig) and (tenant_quotas or tenant_quota_default):
        return dataclasses.replace(
            own,
            tenant_quotas={**own.tenant_quotas, **(tenant_quotas or {})},
            tenant_quota_default=tenant_quota_default or own.tenant_quota_default,
        )
    pool, pool_default = pool_quotas
    if isinstance(own, ValkeyConfig) and (pool or pool_default is not None):
        return dataclasses.replace(
            own,
            tenant_quotas={**own.tenant_quotas, **pool},
            tenant_quota_default=pool_default if pool_default is not None else own.tenant_quota_default,
        )
    return own

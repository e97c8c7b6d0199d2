"""Configuration of the LMDB storage tier: where the store lives, how big, how durable.

Durability (``StorageConfig.durability``), from LMDB's documented flags:

* ``"safe"``: ``sync=True, metasync=True``: each commit flushes the data and
  then the meta page. A committed transaction survives a process kill and a
  power loss; the store is never corrupted.
* ``"fast"``: ``sync=True, metasync=False``: one flush per commit instead of
  two. A process kill loses nothing committed; a system crash or power loss
  may undo the last committed transaction, but never corrupts the store
  (LMDB keeps atomicity and consistency). ``sync=False`` is not offered: LMDB
  documents that a system crash can then corrupt the store unless the file
  system preserves write order.

Encryption at rest (offload/storage/crypt/): ``key_file`` (a file of master
keys) or ``key_env`` (the name of an environment variable holding them);
neither: records in the clear.

Per-tenant byte quotas (offload/lmdb/quotas.py): ``tenant_quotas`` maps a
tenant (the ``tenant`` that ``put`` is given: a namespace's cache salt,
type-tagged; None for no salt) to ``(limit bytes or None, floor bytes)``;
``tenant_quota_default`` is the quota of every tenant not listed. A tenant
at its limit evicts its own least recently used records; capacity eviction
never takes a tenant below its floor; a put that cannot be placed either way
is dropped (counted per tenant), never an error.

Retention (offload/lmdb/retention.py): a put whose ``PutMeta.expires_at``
is set stores that deadline with its records; ``clock`` (wall-clock seconds,
``time.time`` unless a test passes a fake one) is what the store compares
deadlines with. Tags (``PutMeta.tags``) are recorded per namespace for
``LmdbStorage.invalidate_tag``; quotas can be replaced at run time
(``LmdbStorage.set_tenant_quotas``).

This module imports no LMDB: ``storage_config`` builds a config without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from radixcache.offload.storage.checks import positive_float, positive_int
from radixcache.offload.storage.contract import Clock
from radixcache.offload.lmdb.slots import slot_size
from radixcache.offload.lmdb.quotas import UNLIMITED, ByteQuota, TenantKey, check_quotas
from radixcache.offload.storage.crypt import KeySource

DURABILITY_MODES = ("safe", "fast")
OPEN_ERROR_MODES = ("recover", "strict")  # see offload/lmdb/opening.py
_MAP_HEADROOM_BYTES = 64 << 20  # LMDB map beyond 2x capacity: meta, tree, free list


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Configuration of the LMDB storage tier. Validated on construction."""

    path: str | os.PathLike[str] = "./radixcache-data"  # directory, created if missing
    capacity_bytes: int = 64 << 30  # limit on the stored values' bytes
    durability: str = "safe"  # "safe" or "fast" (see the module docstring)
    num_readers: int = 2  # reader threads (concurrent get() calls)
    max_batch_pages: int = 256  # write jobs merged into one txn up to this many pages
    max_batch_bytes: int = 256 << 20  # ... and up to this many record bytes
    map_size_bytes: int | None = None  # LMDB map size; None: 2 x capacity + 64 MiB
    # A store that cannot be opened: "recover" starts anyway (a damaged store is
    # moved aside and a fresh one opened, or the tier is disabled); "strict"
    # raises StorageOpenError instead (offload/lmdb/opening.py).
    on_open_error: str = "recover"
    # Free disk the writer leaves alone (offload/lmdb/space.py): a fixed number
    # of bytes, or None for disk_reserve_ratio of the file system, at most 64 MiB.
    disk_reserve_bytes: int | None = None
    disk_reserve_ratio: float = 0.01
    # Encryption at rest: a file of master keys, or the name of an environment
    # variable holding them (never the keys themselves); neither: in the clear.
    key_file: str | None = None
    key_env: str | None = None
    # Per-tenant byte quotas: tenant -> (limit bytes or None, floor bytes), and
    # the quota of tenants not listed (see the module docstring).
    tenant_quotas: Mapping[TenantKey, ByteQuota] = field(default_factory=dict, hash=False)
    tenant_quota_default: ByteQuota = UNLIMITED
    # What retention deadlines are compared with (wall-clock seconds, like
    # time.time()); not part of the config's identity (equality, hashing).
    clock: Clock = field(default=time.time, compare=False, hash=False, repr=False)
    # How often a timer looks for expired records to sweep when nothing is
    # written (every write sweeps anyway); None: only writes and reads sweep.
    sweep_interval_s: float | None = 5.0
    # Pages of at least this many bytes keep their KV bytes in the slot file
    # beside LMDB's (offload/lmdb/slots.py: one write from the host page, none
    # through LMDB's memory map); smaller pages, and all when None, inside LMDB.
    slot_min_page_bytes: int | None = 64 << 10

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise ValueError(f"path must be a non-empty str or path, got {self.path!r}")
        positive_int("capacity_bytes", self.capacity_bytes)
        if self.durability not in DURABILITY_MODES:
            raise ValueError(
                f"durability must be one of {DURABILITY_MODES}, got {self.durability!r}"
            )
        positive_int("num_readers", self.num_readers)
        positive_int("max_batch_pages", self.max_batch_pages)
        positive_int("max_batch_bytes", self.max_batch_bytes)
        if self.map_size_bytes is not None:
            positive_int("map_size_bytes", self.map_size_bytes)
        if self.on_open_error not in OPEN_ERROR_MODES:
            raise ValueError(
                f"on_open_error must be one of {OPEN_ERROR_MODES}, got {self.on_open_error!r}"
            )
        if self.disk_reserve_bytes is not None and (
            not isinstance(self.disk_reserve_bytes, int)
            or isinstance(self.disk_reserve_bytes, bool)
            or self.disk_reserve_bytes < 0
        ):
            raise ValueError(
                f"disk_reserve_bytes must be a non-negative int or None, "
                f"got {self.disk_reserve_bytes!r}"
            )
        if not isinstance(self.disk_reserve_ratio, (int, float)) or not (
            0 <= self.disk_reserve_ratio < 0.5
        ):
            raise ValueError(
                f"disk_reserve_ratio must lie in [0, 0.5), got {self.disk_reserve_ratio!r}"
            )
        if self.sweep_interval_s is not None:
            positive_float("sweep_interval_s", self.sweep_interval_s)
        if self.slot_min_page_bytes is not None:
            positive_int("slot_min_page_bytes", self.slot_min_page_bytes)
        if not callable(self.clock):
            raise TypeError(f"clock must be a callable returning seconds, got {self.clock!r}")
        KeySource(self.key_file, self.key_env)  # validates them
        quotas, default = check_quotas(self.tenant_quotas, self.tenant_quota_default)
        object.__setattr__(self, "tenant_quotas", quotas)  # a private, checked copy
        object.__setattr__(self, "tenant_quota_default", default)

    def tenant_quota(self, tenant: TenantKey) -> ByteQuota:
        """``(limit bytes or None, floor bytes)`` of ``tenant``."""
        return self.tenant_quotas.get(tenant, self.tenant_quota_default)

    @property
    def keys(self) -> KeySource:
        """Where the store's master keys come from (none: records in the clear)."""
        return KeySource(self.key_file, self.key_env)

    def slot_bytes(self, page_bytes: int) -> int | None:
        """The slot size for pages of ``page_bytes`` (None: stored inside LMDB)."""
        least = self.slot_min_page_bytes
        if least is None or page_bytes < least:
            return None
        return slot_size(page_bytes, sealed=self.keys.enabled)

    @property
    def map_size(self) -> int:
        """The LMDB map size, rounded up to a whole MiB."""
        size = self.map_size_bytes or 2 * self.capacity_bytes + _MAP_HEADROOM_BYTES
        return -(-size // (1 << 20)) << 20

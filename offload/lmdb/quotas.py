"""Per-tenant byte quotas of an LMDB store: their form, checks and counters.

A **tenant** here is what ``Storage.put`` is given as ``tenant``: a
namespace's cache salt, type-tagged (the engine's ``Namespace.tenant``), or
None for requests without a salt. This module knows nothing of the engine:
it takes tenants as opaque bytes.

A quota is ``(limit, floor)`` in bytes of stored record values:

* ``limit`` (None: none): the most bytes the tenant's records may take. A put
  that would take the tenant over it first evicts the tenant's *own* least
  recently used records (never another tenant's); the pages that still do
  not fit are not written (the put keeps its leading pages, as when the
  store is full), counted in ``TenantStorageStats.dropped_pages``.
* ``floor``: eviction for capacity (least recently used over every tenant,
  also the disk-room and map-full evictions) never takes the tenant below
  it; when capacity cannot be met without breaking a floor, the incoming
  pages are dropped (counted) instead. The floor holds against the tenant's
  own puts too: only its limit makes it evict below its floor.

Inside the store a tenant is known by its **tenant id**, a keyed 16-byte
BLAKE2b digest of it (``tenant_id``; None stays None), never by the tenant
itself: a salt may be a secret, and a store that encrypts at rest keeps it
out of the file. The hash key is random per store (kept in its meta
database), so ids say nothing across stores; someone who can read the store
can still confirm a guessed salt. How the store knows a record's tenant id
after a restart: offload/lmdb/txn.py.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

TenantKey = bytes | None  # the tenant a put names (a salt, type-tagged); None: no salt
ByteQuota = tuple[int | None, int]  # (limit bytes or None: no limit, floor bytes)

UNLIMITED: Final[ByteQuota] = (None, 0)
SECRET_BYTES = 32  # the per-store key of tenant ids


def tenant_id(secret: bytes, tenant: TenantKey) -> TenantKey:
    """The id the store knows ``tenant`` by (None: None); see the module docstring."""
    if tenant is None:
        return None
    return hashlib.blake2b(tenant, digest_size=16, key=secret).digest()


def check_quota(value: object, where: str) -> ByteQuota:
    """``value`` as a ``ByteQuota``: a pair (limit: non-negative int or None,
    floor: non-negative int <= limit); ValueError naming ``where`` otherwise."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{where} must be a pair (limit bytes or None, floor bytes), got {value!r}")
    limit, floor = value
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ValueError(f"{where}: the limit must be a non-negative int or None, got {limit!r}")
    if type(floor) is not int or floor < 0:
        raise ValueError(f"{where}: the floor must be a non-negative int, got {floor!r}")
    if limit is not None and floor > limit:
        raise ValueError(f"{where}: the floor {floor} B is above the limit {limit} B")
    return (limit, floor)


def check_quotas(
    quotas: object, default: object
) -> tuple[Mapping[TenantKey, ByteQuota], ByteQuota]:
    """Checked copies of ``StorageConfig.tenant_quotas`` and
    ``tenant_quota_default``; ValueError / TypeError name what is wrong
    (a tenant is shown by its length only: it may be a secret)."""
    if not isinstance(quotas, Mapping):
        raise TypeError(
            f"tenant_quotas must be a mapping of tenant -> (limit, floor), "
            f"got {type(quotas).__name__}"
        )
    checked: dict[TenantKey, ByteQuota] = {}
    for tenant, quota in quotas.items():
        if tenant is not None and not isinstance(tenant, bytes):
            raise TypeError(
                f"tenant_quotas: a tenant must be bytes or None, got {type(tenant).__name__}"
            )
        name = "None" if tenant is None else f"<{len(tenant)}-byte tenant>"
        checked[tenant] = check_quota(quota, f"tenant_quotas[{name}]")
    return checked, check_quota(default, "tenant_quota_default")


@dataclass(frozen=True, slots=True)
class TenantStorageStats:
    """One tenant's share of an LMDB store (``LmdbStorage.tenant_stats``)."""

    records: int  # records of the tenant in the store now
    stored_bytes: int  # bytes of those records' values
    limit_bytes: int | None  # its limit (None: none)
    floor_bytes: int  # its floor
    quota_evicted: int  # its records evicted to keep it within its limit
    dropped_pages: int  # its pages not written: over its limit, or no room without breaking floors


class TenantCounters:
    """Per-tenant-id counters of the writer (quota evictions, dropped pages)
    and the tenants it has seen by id; the writer thread adds, any thread
    reads a snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[TenantKey, list[int]] = {}  # id -> [quota_evicted, dropped]
        self._seen: dict[TenantKey, TenantKey] = {}  # id -> tenant, as put() named it

    def saw(self, tid: TenantKey, tenant: TenantKey) -> None:
        """Remember which tenant has id ``tid`` (for ``LmdbStorage.tenant_stats``)."""
        if tid not in self._seen:
            with self._lock:
                self._seen[tid] = tenant

    def seen(self) -> dict[TenantKey, TenantKey]:
        """id -> tenant of every tenant a put named since the store opened."""
        with self._lock:
            return dict(self._seen)

    def add(self, quota_evicted: Mapping[TenantKey, int], dropped: Mapping[TenantKey, int]) -> None:
        with self._lock:
            for tenant, n in quota_evicted.items():
                self._values.setdefault(tenant, [0, 0])[0] += n
            for tenant, n in dropped.items():
                self._values.setdefault(tenant, [0, 0])[1] += n

    def snapshot(self) -> dict[TenantKey, tuple[int, int]]:
        """id -> (quota_evicted, dropped_pages), for tenant ids with any."""
        with self._lock:
            return {t: (v[0], v[1]) for t, v in self._values.items()}

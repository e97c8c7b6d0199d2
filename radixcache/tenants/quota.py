"""Per-tenant quotas: what each tenant may hold on a tier, and what it keeps.

A **tenant** is a cache salt (``Namespace.salt``; requests without one are
the default tenant). A tenant's namespaces (LoRA adapters, extra keys) share
its quota: the salt is what vLLM's and SGLang's requests carry per tenant
(``cache_salt``), what storage derives a tenant's encryption key from, and
the unit an operator bills and isolates. Namespaces never share pages (a
namespace is part of every page's key), so every cached page counts for
exactly one tenant.

``TenantQuota`` per tier (``device``, ``host``):

* ``*_pages`` (limit, None: none): the most pages the tenant's cached
  prefixes may hold on that tier. A tenant at its limit makes room by
  evicting its *own* pages (its own policy order); what still does not fit
  is not cached (a dropped write, counted per tenant) and never raises.
* ``*_floor``: pages the tenant keeps against the others: eviction to make
  room for *another* tenant never takes the tenant below its floor (it may
  be below it anyway, from its own evictions or because it holds less).

``storage_bytes`` / ``storage_floor``: the same for the LMDB storage tier,
in bytes of stored records (offload/lmdb/quotas.py). They are handed to the
store when the cache opens it, and again at each ``set_quota`` / ``set_default``.
``pool_bytes``: a limit on the value bytes the tenant keeps in a Valkey pool
(no floor: the pool's server evicts under its own memory pressure), handed
to the pool at open and at each change.

``ttl_s`` (retention, None: none): a page lives at most ``ttl_s`` seconds
from when it was first cached (not refreshed by hits), on every tier: past
it, it is never served and is removed with its events. Storage records and
pool values carry the deadline they were written with.

``QuotaBook`` is the table one cache reads, set at open and changed at run
time (``RadixCache.set_quota``); ``parse_quotas`` reads the JSON form the CLI
and the configuration file take::

    {"*": {"device_pages": 4096},
     "tenant-a": {"device_floor": 1024, "host_pages": 8192},
     "(none)": {"device_pages": 512}}

(``"*"``: every tenant not listed; ``"(none)"``: requests without a salt.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from radixcache.namespace import Namespace

TenantKey = bytes | None  # Namespace.tenant: the salt, type-tagged; None: no salt
Salt = str | bytes | None

OTHERS: Final = "*"  # the JSON name of the quota of every tenant not listed
NO_SALT: Final = "(none)"  # the name of the tenant of requests without a salt


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """Limits and floors of one tenant, in pages of each tier (see the module)."""

    device_pages: int | None = None  # limit on cached device pages; None: no limit
    device_floor: int = 0  # device pages other tenants' pressure never takes
    host_pages: int | None = None  # limit on host-pool pages; None: no limit
    host_floor: int = 0  # host pages other tenants' pressure never takes
    storage_bytes: int | None = None  # limit on LMDB record bytes; None: no limit
    storage_floor: int = 0  # LMDB record bytes other tenants' pressure never takes
    pool_bytes: int | None = None  # limit on shared-pool value bytes; None: no limit
    ttl_s: float | None = None  # retention: seconds a page lives from when it was cached

    def __post_init__(self) -> None:
        ttl = self.ttl_s
        if ttl is not None and (type(ttl) not in (int, float) or not 0 < ttl < 1e12):
            raise ValueError(f"TenantQuota.ttl_s must be a number of seconds in (0, 1e12) "
                             f"or None, got {ttl!r}")
        for f in fields(self):
            if f.name == "ttl_s":
                continue
            value = getattr(self, f.name)
            limit_field = f.name.endswith(("_pages", "_bytes"))
            if value is None and limit_field:
                continue
            if type(value) is not int or value < 0:
                raise ValueError(f"TenantQuota.{f.name} must be a non-negative int"
                                 f"{' or None' if limit_field else ''}, got {value!r}")
        for tier, unit in (("device", "pages"), ("host", "pages"), ("storage", "bytes")):
            limit, floor = getattr(self, f"{tier}_{unit}"), getattr(self, f"{tier}_floor")
            if limit is not None and floor > limit:
                raise ValueError(
                    f"TenantQuota: {tier}_floor={floor} is above {tier}_{unit}={limit}")

    @property
    def bounded(self) -> bool:
        """True if it limits or protects anything."""
        return (self.device_pages is not None or self.host_pages is not None
                or self.device_floor > 0 or self.host_floor > 0 or self.ttl_s is not None)

    def limit(self, tier: str) -> int | None:
        return self.device_pages if tier == "device" else self.host_pages

    def floor(self, tier: str) -> int:
        return self.device_floor if tier == "device" else self.host_floor

    @classmethod
    def from_json(cls, value: object, where: str = "quota") -> TenantQuota:
        """From ``{"device_pages": N, "device_floor": N, "host_pages": N,
        "host_floor": N}`` (keys optional, null: no limit). ValueError names
        an unknown key or a bad value."""
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} must be an object of page counts, got {value!r}")
        known = {f.name for f in fields(cls)}
        for key in value:
            if key not in known:
                raise ValueError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        try:
            return cls(**dict(value))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


UNLIMITED: Final = TenantQuota()


def tenant_key(salt: Salt) -> TenantKey:
    """The tenant key of a salt (TypeError / ValueError for a salt a
    Namespace refuses)."""
    return Namespace(salt).tenant


def tenant_label(key: TenantKey) -> str:
    """How metrics and reports name a tenant: its salt as events carry it
    (``cache_salt``; a bytes salt as ``hex:...``), ``(none)`` for no salt."""
    if key is None:
        return NO_SALT
    kind, raw = key[1:2], key[6:]  # _encode_part: tag, kind, 4-byte length, raw
    return raw.decode("utf-8") if kind == b"S" else "hex:" + raw.hex()


def _salt_of(key: TenantKey) -> Salt:
    if key is None:
        return None
    raw = key[6:]
    return raw.decode("utf-8") if key[1:2] == b"S" else raw


class QuotaBook:
    """The quota of every tenant of one cache; changed at run time.

    ``get(key)`` is the tenant's own quota, else ``default``. Owner thread
    only (like the cache that reads it).
    """

    def __init__(self, quotas: Mapping[Salt, TenantQuota] | None = None,
                 default: TenantQuota = UNLIMITED) -> None:
        if not isinstance(default, TenantQuota):
            raise TypeError(f"default quota must be a TenantQuota, got {type(default).__name__}")
        self.default = default
        self._quotas: dict[TenantKey, TenantQuota] = {}
        for salt, quota in (quotas or {}).items():
            self.set(salt, quota)

    def get(self, key: TenantKey) -> TenantQuota:
        return self._quotas.get(key, self.default)

    def set(self, salt: Salt, quota: TenantQuota | None) -> None:
        """Set the quota of the tenant of ``salt``; None: back to the default."""
        if quota is not None and not isinstance(quota, TenantQuota):
            raise TypeError(f"quota must be a TenantQuota or None, got {type(quota).__name__}")
        key = tenant_key(salt)
        if quota is None:
            self._quotas.pop(key, None)
        else:
            self._quotas[key] = quota

    def items(self) -> list[tuple[TenantKey, TenantQuota]]:
        return list(self._quotas.items())

    def items_by_salt(self) -> list[tuple[Salt, TenantQuota]]:
        """The quotas set, keyed by salt again (a copy of the book starts from it)."""
        return [(_salt_of(k), q) for k, q in self._quotas.items()]


def parse_quotas(value: Any, where: str = "quotas") -> QuotaBook:
    """A ``QuotaBook`` from its JSON form (see the module): an object whose
    keys are salts (``"*"``: tenants not listed, ``"(none)"``: no salt) and whose values are
    ``TenantQuota.from_json`` objects. ValueError names what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a JSON object of tenant -> quota, got {value!r}")
    default = UNLIMITED
    quotas: dict[Salt, TenantQuota] = {}
    for name, spec in value.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: a tenant name must be a non-empty string, got {name!r}")
        quota = TenantQuota.from_json(spec, f"{where}[{name!r}]")
        if name == OTHERS:
            default = quota
        elif name == NO_SALT:
            quotas[None] = quota
        else:
            quotas[name] = quota
    return QuotaBook(quotas, default)

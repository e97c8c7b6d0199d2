"""Per-tenant quotas and retention of an engine's page store.

Both adapters take a ``quotas`` setting in their own configuration (vLLM: the
tier entry; SGLang: the extra config), in the JSON form the CLI and
``radixcache.tenants.parse_quotas`` read::

    {"*": {"ttl_s": 86400},
     "noisy": {"storage_bytes": 10737418240, "ttl_s": 3600},
     "quiet": {"storage_floor": 5368709120},
     "(none)": {"storage_bytes": 1073741824}}

A tenant is a request's ``cache_salt`` (``radixcache.integrations.tenants``);
``"*"`` is every tenant not listed, ``"(none)"`` requests without a salt. What
a page store does with each ``TenantQuota`` field:

* ``ttl_s`` (retention), every backend: each put of the tenant stamps its
  records with the deadline ``clock() + ttl_s`` (``PutMeta.expires_at``);
  a store never serves a record past it (a miss: the engine recomputes).
  A run-time change (``PageStore.set_quota``) holds for later puts.
* ``storage_bytes`` / ``storage_floor``, LMDB: handed to the store when it
  opens (``StorageConfig.tenant_quotas``, built by ``storage_quotas`` as the
  cache does); at run time only where the store takes them
  (``ByteQuotaStore``). A tenant at its limit evicts its own least recently
  used pages; capacity eviction never takes a tenant below its floor.
* ``pool_bytes``, a Valkey pool: per-tenant limits on value bytes
  (``pool_byte_limits``), handed to the pool when it opens
  (``ValkeyConfig.tenant_quotas``) and at run time (``set_tenant_quotas``);
  a tenant at its limit evicts its own oldest values (no floor: the server
  evicts on its own).
* ``device_*`` / ``host_*``: the engine's own GPU and CPU tiers, which the
  engine manages; a page store cannot enforce them, so they are refused.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Final, Protocol, runtime_checkable

from radixcache.cache_config import storage_quotas
from radixcache.config import ConfigError
from radixcache.namespace import Namespace
from radixcache.offload import PutMeta
from radixcache.offload.storage.contract import Clock
from radixcache.tenants.quota import (
    UNLIMITED,
    QuotaBook,
    Salt,
    TenantKey,
    TenantQuota,
    parse_quotas,
)

ByteQuota = tuple[int | None, int]  # (limit bytes or None: no limit, floor bytes)

# The TenantQuota fields a page store of each backend enforces (module docstring).
ENFORCED: Final[Mapping[str, frozenset[str]]] = {
    "lmdb": frozenset({"storage_bytes", "storage_floor", "ttl_s"}),
    "valkey": frozenset({"ttl_s", "pool_bytes"}),
}
RAW_ID_MASK: Final = (1 << 63) - 1


@runtime_checkable
class ByteQuotaStore(Protocol):
    """An LMDB store whose per-tenant byte quotas (limit, floor) change at
    run time. (A pool store's ``set_tenant_quotas`` takes limits alone, see
    ``pool_byte_limits``; the method's name is the same, so callers pick by
    backend, not by this check alone.)"""

    def set_tenant_quotas(
        self, quotas: Mapping[TenantKey, ByteQuota], default: ByteQuota | None = None
    ) -> object:
        """Replace the byte quotas (limit, floor) of the tenants listed and,
        unless ``default`` is None, of every tenant not listed. A tenant now
        over its limit is brought under it by evicting its own records
        (announced through ``take_removed``)."""
        ...


def check_store_quota(quota: TenantQuota, backend: str, where: str) -> None:
    """ValueError naming ``where`` and the field when ``quota`` sets a field
    that a page store of ``backend`` does not enforce (module docstring)."""
    enforced = ENFORCED[backend]
    for f in fields(TenantQuota):
        if f.name not in enforced and getattr(quota, f.name) != getattr(UNLIMITED, f.name):
            raise ValueError(
                f"{where}: `{f.name}` is not enforced by a page store on {backend} "
                f"(it enforces {', '.join(sorted(enforced))})")


def store_quotas(value: object, backend: str, where: str = "quotas") -> QuotaBook:
    """The ``QuotaBook`` of an adapter's ``quotas`` setting (the JSON form of
    ``parse_quotas``), every tenant's quota checked against what a page store
    of ``backend`` enforces. ValueError naming the tenant and the key."""
    book = parse_quotas(value, where)
    _check_book(book, backend, where)
    return book


def _check_book(book: QuotaBook, backend: str, where: str) -> None:
    """``check_store_quota`` of every quota of ``book``, named as in its JSON form."""
    check_store_quota(book.default, backend, f"{where}['*']")
    for salt, quota in book.items_by_salt():
        name = "(none)" if salt is None else salt
        check_store_quota(quota, backend, f"{where}[{name!r}]")


def pool_byte_limits(book: QuotaBook) -> tuple[dict[TenantKey, int], int | None]:
    """The per-tenant ``pool_bytes`` limits of ``book``, keyed as a store's
    ``put`` names tenants (``Namespace.tenant``), and the limit of tenants
    not listed (None: none).

    This is what a shared pool store (Valkey) takes as per-tenant value-byte
    limits: at open (``tenant_quotas``, ``tenant_quota_default`` of its
    config) and at run time (``set_tenant_quotas(limits, default)``, limits
    alone: a pool has no floors).
    """
    limits = {t: q.pool_bytes for t, q in book.items() if q.pool_bytes is not None}
    return limits, book.default.pool_bytes


class StoreQuotas:
    """The quota book of one page store: the deadline of each tenant's puts
    and the byte quotas of its store. Callers serialize access (the page
    store's lock)."""

    __slots__ = ("backend", "book", "clock")

    def __init__(self, book: QuotaBook | None, backend: str,
                 clock: Clock = time.time) -> None:
        """``book``: copied (a later ``set`` changes no one else's); None: no
        quotas. ValueError for a quota ``backend`` does not enforce."""
        if book is not None and not isinstance(book, QuotaBook):
            raise TypeError(f"quotas must be a QuotaBook or None, got {type(book).__name__}")
        self.backend = backend
        self.book = QuotaBook() if book is None else QuotaBook(dict(book.items_by_salt()),
                                                               book.default)
        self.clock = clock  # wall-clock seconds, as stores compare deadlines
        _check_book(self.book, backend, "quotas")

    def byte_quotas(self) -> tuple[dict[TenantKey, ByteQuota], ByteQuota | None]:
        """The LMDB byte quotas (limit, floor) per tenant, and of tenants not
        listed (None: the book sets none), as the cache hands them over."""
        return storage_quotas(self.book)

    def set(self, salt: Salt, quota: TenantQuota | None) -> bool:
        """Set the quota of the tenant of ``salt`` (None: no salt; None quota:
        back to the default). Returns whether its byte quota changed."""
        where = f"quota of {salt!r}"
        if quota is not None:
            if not isinstance(quota, TenantQuota):
                raise TypeError(f"quota must be a TenantQuota or None, got {type(quota).__name__}")
            check_store_quota(quota, self.backend, where)
        before = self.byte_quotas(), pool_byte_limits(self.book)
        self.book.set(salt, quota)
        return (self.byte_quotas(), pool_byte_limits(self.book)) != before

    def put_meta(self, stored_keys: Sequence[bytes], namespace: Namespace) -> PutMeta | None:
        """The ``PutMeta`` of a put of ``namespace``'s pages: its deadline
        (``clock() + ttl_s`` of its tenant's quota) and its tags; None when
        there is neither (the records then carry no meta, as before).

        A raw page has no event id, but ``PutMeta`` takes one per page: each
        gets 63 bits of a digest of its stored key (stable, unique per page;
        nothing reads a raw record's ids: restart survivors skip raw records).
        """
        ttl = self.book.get(namespace.tenant).ttl_s
        if ttl is None and not namespace.tags:
            return None
        expires_at = None if ttl is None else self.clock() + ttl
        ids = [int.from_bytes(_digest8(k), "big") & RAW_ID_MASK for k in stored_keys]
        return PutMeta(block_ids=ids, parent_block_id=None, first_depth=0,
                       expires_at=expires_at, tags=namespace.tags)


def _digest8(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=8).digest()


def config_quotas(value: object, backend: str, source: str) -> QuotaBook | None:
    """An adapter's ``quotas`` setting (None: left out) as a ``QuotaBook``
    for a page store on ``backend``; ConfigError naming ``source``, the
    tenant and the key (``secondary tier 'RadixcacheTier': quotas['noisy']:
    unknown key 'storage_byte' ...``)."""
    if value is None:
        return None
    try:
        return store_quotas(value, backend, f"{source}: quotas")
    except ValueError as err:
        raise ConfigError(str(err)) from None

"""Tenants sharing one cache: quotas, floors and per-tenant accounting.

A tenant is a cache salt (see ``radixcache.tenants.quota``).
"""

from radixcache.tenants.ledger import TenantCounters, TenantLedger, TenantStats
from radixcache.tenants.quota import (
    NO_SALT,
    OTHERS,
    QuotaBook,
    TenantQuota,
    parse_quotas,
    tenant_key,
    tenant_label,
)

__all__ = [
    "NO_SALT",
    "OTHERS",
    "QuotaBook",
    "TenantCounters",
    "TenantLedger",
    "TenantQuota",
    "TenantStats",
    "parse_quotas",
    "tenant_key",
    "tenant_label",
]

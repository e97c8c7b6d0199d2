"""radixcache: a KV-cache allocator with page-granular prefix reuse.

The public surface for a model runner::

    from radixcache import CacheConfig, KVSpec, RadixCache, Namespace

    cache = RadixCache(CacheConfig(spec=KVSpec(32, 8, 128), device_pages=4096))
    req = cache.admit(prompt_ids)
    ...

See ``radixcache.cache`` for the request lifecycle.
"""

from __future__ import annotations

from radixcache.cache import CacheConfig, RadixCache
from radixcache.errors import OutOfPagesError, RequestStateError
from radixcache.eviction import (
    EvictionPolicy,
    eviction_policy_names,
    make_eviction_policy,
    register_eviction_policy,
)
from radixcache.namespace import DEFAULT_NAMESPACE, Namespace
from radixcache.node import InsertResult, MatchResult, Node
from radixcache.request import Request
from radixcache.stats import CacheStats
from radixcache.tree import RadixTree
from transfer import DeviceKVBuffer, KVSpec

__all__ = [
    "DEFAULT_NAMESPACE",
    "CacheConfig",
    "CacheStats",
    "DeviceKVBuffer",
    "EvictionPolicy",
    "InsertResult",
    "KVSpec",
    "MatchResult",
    "Namespace",
    "Node",
    "OutOfPagesError",
    "RadixCache",
    "RadixTree",
    "Request",
    "RequestStateError",
    "eviction_policy_names",
    "make_eviction_policy",
    "register_eviction_policy",
]

__version__ = "0.1.0"

"""radixcache: a KV-cache allocator with page-granular prefix reuse.

The public surface for a model runner::

    from radixcache import CacheConfig, KVSpec, RadixCache, Namespace

    cache = RadixCache(CacheConfig(spec=KVSpec(32, 8, 128), device_pages=4096))
    req = cache.admit(prompt_ids)
    ...

See ``radixcache.cache`` for the request lifecycle. The layers install under
this one name: ``radixcache.transfer`` (byte movement), ``radixcache.offload``
(host pool and storage), ``radixcache.events`` (wire format and ZMQ). The
names below are resolved lazily, so ``import radixcache.transfer`` or
``import radixcache.events`` does not load the cache, LMDB or ZMQ.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from radixcache.cache import RadixCache
    from radixcache.cache_config import CacheConfig
    from radixcache.config import ConfigError, load_config
    from radixcache.errors import CacheClosedError, OutOfPagesError, RequestStateError
    from radixcache.tree.policies import (
        EvictionPolicy,
        eviction_policy_names,
        make_eviction_policy,
        register_eviction_policy,
    )
    from radixcache.namespace import DEFAULT_NAMESPACE, Namespace
    from radixcache.tree.node import InsertResult, MatchResult, Node
    from radixcache.request import Request
    from radixcache.stats import CacheStats
    from radixcache.tiers import TierConfig
    from radixcache.transfer import DeviceKVBuffer, KVSpec
    from radixcache.tree.radix_tree import RadixTree

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "CacheConfig": "radixcache.cache_config",
    "RadixCache": "radixcache.cache",
    "ConfigError": "radixcache.config",
    "load_config": "radixcache.config",
    "CacheClosedError": "radixcache.errors",
    "OutOfPagesError": "radixcache.errors",
    "RequestStateError": "radixcache.errors",
    "EvictionPolicy": "radixcache.tree.policies",
    "eviction_policy_names": "radixcache.tree.policies",
    "make_eviction_policy": "radixcache.tree.policies",
    "register_eviction_policy": "radixcache.tree.policies",
    "DEFAULT_NAMESPACE": "radixcache.namespace",
    "Namespace": "radixcache.namespace",
    "InsertResult": "radixcache.tree.node",
    "MatchResult": "radixcache.tree.node",
    "Node": "radixcache.tree.node",
    "Request": "radixcache.request",
    "CacheStats": "radixcache.stats",
    "TierConfig": "radixcache.tiers",
    "RadixTree": "radixcache.tree.radix_tree",
    "DeviceKVBuffer": "radixcache.transfer",
    "KVSpec": "radixcache.transfer",
}

__all__ = sorted(_LAZY)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'radixcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

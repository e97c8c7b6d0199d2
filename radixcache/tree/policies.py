"""Eviction policies: which unlocked leaf goes first.

A policy is a small strategy object that maps a node to a sort key; the tree
evicts the leaf with the smallest key first. Keys read only fields the tree
keeps up to date on every match and insert (``last_access``, ``hit_count``,
``priority``, ``uid``), all integer ticks, so eviction order is deterministic.

Add a policy by decorating a class with ``@register_eviction_policy("name")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from radixcache.tree.node import Node
from radixcache.native import compiled as native_core  # None on the pure-Python path

SortKey = tuple[int, ...]


class EvictionPolicy(Protocol):
    """Orders eviction candidates; smaller keys are evicted first."""

    name: str

    def key(self, node: Node) -> SortKey:
        """The node's sort key. Must not mutate the node."""
        ...


_REGISTRY: dict[str, Callable[[], EvictionPolicy]] = {}


def register_eviction_policy(
    name: str,
) -> Callable[[Callable[[], EvictionPolicy]], Callable[[], EvictionPolicy]]:
    """Class decorator adding a policy to the registry under ``name``."""

    def add(factory: Callable[[], EvictionPolicy]) -> Callable[[], EvictionPolicy]:
        if name in _REGISTRY:
            raise ValueError(f"eviction policy {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return add


def make_eviction_policy(name: str) -> EvictionPolicy:
    """A fresh policy object by registry name (``lru``, ``lfu``, ``fifo``, ``priority``)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {sorted(_REGISTRY)}"
        ) from None
    return factory()


def eviction_policy_names() -> list[str]:
    return sorted(_REGISTRY)


@register_eviction_policy("lru")
class LRUPolicy:
    """Least recently used first (default)."""

    name = "lru"

    def key(self, node: Node) -> SortKey:
        return (node.last_access,)


@register_eviction_policy("lfu")
class LFUPolicy:
    """Least frequently hit first; ties broken by recency."""

    name = "lfu"

    def key(self, node: Node) -> SortKey:
        return (node.hit_count, node.last_access)


@register_eviction_policy("fifo")
class FIFOPolicy:
    """Oldest node first, however often it is used."""

    name = "fifo"

    def key(self, node: Node) -> SortKey:
        return (node.uid,)


@register_eviction_policy("priority")
class PriorityPolicy:
    """Lowest request priority first; ties broken by recency."""

    name = "priority"

    def key(self, node: Node) -> SortKey:
        return (node.priority, node.last_access)


if native_core is not None:  # eviction computes these four keys in C (radixcache/native/victims.pxi)
    native_core.bind_policies(LRUPolicy, LFUPolicy, FIFOPolicy, PriorityPolicy)

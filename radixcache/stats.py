"""Counters and the stats snapshot, cheap enough to read every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class Counters:
    """Monotonic counters the cache bumps on its hot paths."""

    requests: int = 0  # requests admitted
    prompt_tokens: int = 0  # tokens of admitted prompts
    hit_tokens: int = 0  # of those, served from the device tier at admission
    hit_pages: int = 0  # pages behind ``hit_tokens``
    committed_pages: int = 0  # pages inserted into the tree by commits
    duplicate_pages: int = 0  # committed pages another request had inserted first
    evicted_pages: int = 0  # device pages evicted to make room
    out_of_pages: int = 0  # OutOfPagesError raised


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the cache; all page counts are device pages unless named."""

    requests: int  # requests admitted so far
    live_requests: int  # requests admitted and not yet released
    prompt_tokens: int  # tokens of admitted prompts
    hit_tokens: int  # of those, found on the device at admission
    hit_pages: int  # pages behind ``hit_tokens``
    committed_pages: int  # pages inserted by commits
    duplicate_pages: int  # committed pages that were already cached (freed)
    evicted_pages: int  # pages evicted to make room
    out_of_pages: int  # allocations that failed after eviction
    pool_pages: int  # device pool capacity
    free_pages: int  # free in the pool
    cached_pages: int  # held by the tree
    evictable_pages: int  # cached and unlocked
    protected_pages: int  # cached and locked by live requests
    private_pages: int  # held by live requests outside the tree
    nodes: int  # tree nodes

    @property
    def hit_ratio(self) -> float:
        """Share of prompt tokens served from the cache."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PoolView(Protocol):
    """What a snapshot reads of the device pool."""

    @property
    def capacity(self) -> int: ...
    @property
    def free_count(self) -> int: ...
    @property
    def used_count(self) -> int: ...


class TreeView(Protocol):
    """What a snapshot reads of the tree."""

    device_pages: int
    evictable_pages: int
    node_count: int

    @property
    def protected_pages(self) -> int: ...


def snapshot(c: Counters, live_requests: int, pool: PoolView, tree: TreeView) -> CacheStats:
    """The ``CacheStats`` of a cache with counters ``c``, its device pool and tree."""
    return CacheStats(
        requests=c.requests,
        live_requests=live_requests,
        prompt_tokens=c.prompt_tokens,
        hit_tokens=c.hit_tokens,
        hit_pages=c.hit_pages,
        committed_pages=c.committed_pages,
        duplicate_pages=c.duplicate_pages,
        evicted_pages=c.evicted_pages,
        out_of_pages=c.out_of_pages,
        pool_pages=pool.capacity,
        free_pages=pool.free_count,
        cached_pages=tree.device_pages,
        evictable_pages=tree.evictable_pages,
        protected_pages=tree.protected_pages,
        private_pages=pool.used_count - tree.device_pages,
        nodes=tree.node_count,
    )

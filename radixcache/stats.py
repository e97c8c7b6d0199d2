"""Counters and the stats snapshot, cheap enough to read every step."""

from __future__ import annotations

from dataclasses import dataclass


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

"""Exceptions a model runner is expected to catch."""

from __future__ import annotations


class OutOfPagesError(RuntimeError):
    """Not enough device pages even after evicting every unlocked page.

    The runner should preempt a request (release it) and retry.
    """

    def __init__(self, requested: int, free: int, evictable: int, tier: str = "device") -> None:
        self.requested = requested  # pages asked for
        self.free = free  # pages free after eviction
        self.evictable = evictable  # pages still evictable (0 unless eviction was blocked)
        self.tier = tier
        super().__init__(
            f"out of {tier} pages: asked for {requested}, {free} free, {evictable} evictable; "
            f"release or preempt a request"
        )


class RequestStateError(RuntimeError):
    """An operation on a request handle that its lifecycle does not allow."""


class CacheClosedError(RuntimeError):
    """A call on a cache after ``close()``, or in a process forked from the
    one that built it (its copy and storage threads, its store lock and its
    event sockets stay with that process). The call changed nothing; build
    a new cache (in the child: after the fork)."""

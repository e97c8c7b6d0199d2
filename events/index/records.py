"""What a router's index is told and what it answers: its config and typed results.

``IndexConfig`` holds the query defaults and the routing cost's weights;
``TierOverlap`` (leading blocks per tier), ``RoutingDecision`` (the chosen
worker and what it saw) and ``IndexStats`` (events it could not apply as
such) are its answers. ``KvIndex`` (``events.index.kv_index``) uses them all.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

WorkerId = Hashable  # whatever the router names its workers by
# (tokens, block_size, lora_id, lora_name, cache_salt, extra_keys) -> leading
# blocks a shared pool holds under that namespace; None: unknown
PoolLookupFn = Callable[
    [Sequence[int], int, "int | None", "str | None", "str | None", "tuple[Any, ...] | None"],
    "int | None",
]
W = TypeVar("W", bound=Hashable)  # the caller's own worker-id type, kept in answers


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Query defaults and the routing cost's weights.

    ``cost = request_blocks - (w_gpu * gpu + w_host * (host - gpu)
    + w_disk * (disk - host)) + w_load * load``; lower is better. A block is
    worth more the faster its tier, so ``w_gpu >= w_host >= w_disk >= 0``.
    With a shared pool (``KvIndex(pool_lookup=...)``), the pool's leading
    blocks past a worker's host overlap are worth ``w_pool`` each (the
    larger of ``w_pool`` and ``w_disk`` where the worker's disk has them too):
    Dynamo's ``hits_beyond(overlap) * shared_cache_multiplier``.
    """

    block_size: int = 16  # tokens per block when a query names none
    w_gpu: float = 1.0  # value of a leading block already on the device
    w_host: float = 0.75  # ... one that must be loaded back from host memory
    w_disk: float = 0.4  # ... one that must be read from disk first
    w_load: float = 1.0  # cost of one unit of the caller's load figure
    w_pool: float = 0.5  # value of a leading block any worker can fetch from a shared pool

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if not self.w_gpu >= self.w_host >= self.w_disk >= 0 or self.w_load < 0:
            raise ValueError(
                f"weights must satisfy w_gpu >= w_host >= w_disk >= 0 and w_load >= 0, got "
                f"{self.w_gpu}, {self.w_host}, {self.w_disk}, {self.w_load}"
            )
        if not 0 <= self.w_pool <= self.w_gpu:
            raise ValueError(f"w_pool must lie in [0, w_gpu={self.w_gpu}], got {self.w_pool}")


@dataclass(frozen=True, slots=True)
class TierOverlap:
    """How many leading blocks of a request a worker holds, per tier.

    ``gpu``: longest prefix whose every block is on GPU. ``host``: longest
    prefix whose every block is on GPU or CPU_PINNED. ``disk``: longest prefix
    whose every block is on some medium (DISK or EXTERNAL included). Hence
    ``gpu <= host <= disk``.
    """

    gpu: int
    host: int
    disk: int


@dataclass(frozen=True, slots=True)
class RoutingDecision(Generic[W]):
    """The worker ``choose`` picked, and what it saw."""

    worker: W  # lowest cost (first in the loads' order on a tie)
    cost: float  # that worker's cost
    request_blocks: int  # full blocks in the request
    overlaps: dict[W, TierOverlap]  # every candidate's overlap
    costs: dict[W, float]  # every candidate's cost
    pool_blocks: int | None = None  # leading blocks the shared pool holds (None: not asked / failed)


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Events the index could not apply as such (counted, never raised)."""

    orphan_blocks: int  # stored blocks whose parent was unknown (held until it returns)
    unknown_removals: int  # removals of blocks not resident on that medium
    conflicts: int  # an engine hash re-stored with other tokens (old one dropped)

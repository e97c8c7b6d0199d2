"""The router-side index: which worker holds which prefix, on which medium.

``KvIndex`` is what a router keeps: it applies every worker's event stream
(the ``BatchSink`` contract of ``EventSubscriber``) and answers, per worker,
how many leading blocks of a request sit on GPU, on host and anywhere at all,
and which worker a request should go to. Its parts:

* ``events.block_index`` -- per worker and medium, which blocks are resident
  (reference counts, orphans whose parent is unknown, the cross-worker
  ``holders`` map);
* ``events.local_hash`` -- the router's own chained block hash, the same for
  stores and queries (engine hashes cannot be reproduced by a router);
* this module -- the queries: ``overlap`` walks a request's blocks through
  ``holders`` and stops as soon as no worker holds the next one; ``choose``
  scores the candidates with ``cost`` (tier weights, load, and optionally the
  leading blocks a shared pool holds, asked through ``pool_lookup``);
* ``events.index_records`` -- the config and the typed answers.

Not thread safe: see ``EventSubscriber.lock`` for the threaded subscriber.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

from radixcache.events.index.block_index import GPU_BIT, UP_TO_HOST, BlockIndex
from radixcache.events.index.records import (
    IndexConfig,
    IndexStats,
    PoolLookupFn,
    RoutingDecision,
    TierOverlap,
    W,
    WorkerId,
)
from radixcache.events.index.local_hash import ROOT, block_extra, digest, token_bytes
from radixcache.events.types import EventBatch, KvEvent, Medium

__all__ = [
    "IndexConfig", "IndexStats", "KvIndex", "PoolLookupFn", "RoutingDecision", "TierOverlap", "WorkerId",
]

log = logging.getLogger(__name__)


class KvIndex:
    """Per worker and medium, which blocks are resident; answers prefix queries.

    Owns its ``BlockIndex``; ``pool_lookup`` (optional) is asked by
    ``choose`` only, and may fail: routing then uses the index alone.
    """

    def __init__(
        self, config: IndexConfig | None = None, pool_lookup: PoolLookupFn | None = None
    ) -> None:
        self.config = config or IndexConfig()
        self._pool_lookup = pool_lookup  # asked by choose(); see _pool_blocks
        self._blocks = BlockIndex()

    # ------------------------------------------------------------------ updates (see BlockIndex)

    def apply_batch(self, worker: WorkerId, batch: EventBatch) -> None:
        """Apply a batch's events in order (the ``BatchSink`` contract).

        An event the index refuses is skipped, the rest still apply, and then
        the first refusal (ValueError) is raised.
        """
        self._blocks.apply_batch(worker, batch)

    def apply_event(self, worker: WorkerId, event: KvEvent) -> None:
        """Apply one event. Raises ValueError (before any change) for token
        ids that do not fit int64; unknown parents and removals are counted."""
        self._blocks.apply_event(worker, event)

    def clear_worker(self, worker: WorkerId) -> None:
        """Forget every block of ``worker`` on every medium (it stays known)."""
        self._blocks.clear_worker(worker)

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget ``worker`` altogether (its blocks and its name)."""
        self._blocks.remove_worker(worker)

    # ------------------------------------------------------------------ queries

    @overload
    def overlap(
        self, tokens: Sequence[int], *, block_size: int | None = None, lora_id: int | None = None,
        lora_name: str | None = None, cache_salt: str | None = None,
        extra_keys: tuple[Any, ...] | None = None, workers: None = None,
    ) -> dict[WorkerId, TierOverlap]: ...

    @overload
    def overlap(
        self, tokens: Sequence[int], *, block_size: int | None = None, lora_id: int | None = None,
        lora_name: str | None = None, cache_salt: str | None = None,
        extra_keys: tuple[Any, ...] | None = None, workers: Iterable[W],
    ) -> dict[W, TierOverlap]: ...

    def overlap(
        self,
        tokens: Sequence[int],
        *,
        block_size: int | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        extra_keys: tuple[Any, ...] | None = None,
        workers: Iterable[Any] | None = None,
    ) -> dict[Any, TierOverlap]:
        """Leading blocks of ``tokens`` each worker holds, per tier.

        Only full blocks count. The namespace (``lora_id``, ``lora_name``,
        ``cache_salt``, ``extra_keys``) must be the one the blocks were
        stored under. Answers for ``workers`` (default: every worker the
        index knows), zeros for a worker holding nothing.
        """
        bs = block_size or self.config.block_size
        blocks = len(tokens) // bs
        data = token_bytes(tokens[: blocks * bs])
        ns = self._blocks.namespaces.key(lora_id, lora_name, cache_salt)
        tail = block_extra(cache_salt, extra_keys)
        width = 8 * bs
        holders = self._blocks.holders
        runs: dict[WorkerId, list[int]] = {}  # worker -> [gpu, host, disk, tiers still running]
        alive: list[tuple[WorkerId, list[int]]] = []
        parent = ROOT
        for i in range(blocks):
            local = digest(parent + ns + data[i * width : (i + 1) * width] + tail)
            held = holders.get(local)
            if i == 0:
                if not held:
                    break
                runs = {w: [0, 0, 0, 7] for w in held}
                alive = list(runs.items())
            elif not held:
                break
            still = []
            for w, run in alive:
                media = held.get(w, 0)
                if not media:
                    continue
                run[2] += 1
                if run[3] & 2 and media & UP_TO_HOST:
                    run[1] += 1
                else:
                    run[3] &= ~2
                if run[3] & 1 and media & GPU_BIT:
                    run[0] += 1
                else:
                    run[3] &= ~1
                still.append((w, run))
            if not still:
                break
            alive = still
            parent = local
        names = self._blocks.workers() if workers is None else workers
        zero = TierOverlap(0, 0, 0)
        return {w: TierOverlap(*runs[w][:3]) if w in runs else zero for w in names}

    def choose(
        self,
        tokens: Sequence[int],
        loads: Mapping[W, float],
        *,
        block_size: int | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        extra_keys: tuple[Any, ...] | None = None,
    ) -> RoutingDecision[W]:
        """The candidate (a key of ``loads``) with the lowest routing cost.

        ``loads`` gives each candidate's load in the same unit as blocks (for
        example its queued prefill blocks plus active decode blocks), scaled by
        ``w_load``. Raises ValueError when there is no candidate.
        """
        if not loads:
            raise ValueError("choose() needs at least one candidate worker in loads")
        cfg = self.config
        bs = block_size or cfg.block_size
        request_blocks = len(tokens) // bs
        overlaps = self.overlap(
            tokens, block_size=bs, lora_id=lora_id, lora_name=lora_name,
            cache_salt=cache_salt, extra_keys=extra_keys, workers=loads,
        )
        pool = self._pool_blocks(tokens, bs, lora_id, lora_name, cache_salt, extra_keys)
        costs = {w: self.cost(request_blocks, o, loads[w], pool) for w, o in overlaps.items()}
        best = min(costs, key=costs.__getitem__)  # first minimum: ties keep the loads' order
        return RoutingDecision(best, costs[best], request_blocks, overlaps, costs, pool)

    def _pool_blocks(
        self,
        tokens: Sequence[int],
        bs: int,
        lora_id: int | None,
        lora_name: str | None,
        cache_salt: str | None,
        extra_keys: tuple[Any, ...] | None,
    ) -> int | None:
        """Leading blocks the shared pool holds under the request's namespace
        (any worker can fetch them); None without a pool lookup or when it
        fails (index-only scoring)."""
        if self._pool_lookup is None:
            return None
        try:
            hits = self._pool_lookup(tokens, bs, lora_id, lora_name, cache_salt, extra_keys)
        except Exception as exc:  # the pool is advisory: never fail a routing decision
            log.warning("shared pool query failed (%r); routing on the index alone", exc)
            return None
        return None if hits is None else min(max(int(hits), 0), len(tokens) // bs)

    def cost(
        self, request_blocks: int, overlap: TierOverlap, load: float, pool: int | None = None
    ) -> float:
        """The routing cost of one candidate (lower is better); see ``IndexConfig``.

        ``pool``: leading blocks a shared pool holds for every worker (None:
        no pool, or its query failed). The one place the cost is computed.
        """
        cfg = self.config
        o = overlap
        cached = cfg.w_gpu * o.gpu + cfg.w_host * (o.host - o.gpu) + cfg.w_disk * (o.disk - o.host)
        if pool:  # blocks past the worker's host overlap: each worth its best tier
            both = max(0, min(pool, o.disk) - o.host)  # on its disk and in the pool
            cached += max(0.0, cfg.w_pool - cfg.w_disk) * both
            cached += cfg.w_pool * max(0, pool - max(o.disk, o.host))  # only in the pool
        return request_blocks - cached + cfg.w_load * load

    @staticmethod
    def block_extra(cache_salt: str | None, extra_keys: tuple[Any, ...] | None) -> bytes:
        """The bytes a query mixes into every block's local hash for a namespace
        (see ``events.local_hash.block_extra``)."""
        return block_extra(cache_salt, extra_keys)

    # ------------------------------------------------------------------ inspection (see BlockIndex)

    def workers(self) -> list[WorkerId]:
        """Every worker the index knows, in the order it first heard of them."""
        return self._blocks.workers()

    def resident(self, worker: WorkerId, medium: Medium) -> set[int]:
        """Engine hashes of ``worker``'s blocks on ``medium`` (a new set)."""
        return self._blocks.resident(worker, medium)

    def stats(self) -> IndexStats:
        """A snapshot of the counters."""
        return self._blocks.stats()

    def check_integrity(self) -> None:
        """Assert that refcounts and holders agree with the per-worker maps."""
        self._blocks.check_integrity()

"""The router-side index: which worker holds which prefix, on which medium.

A router cannot reproduce an engine's block hashes (they may be salted per
tenant, seeded per process, computed over extra keys the wire doesn't show).
So the index rehashes the token ids of every stored block with its own chained
hash and answers queries in that "local" hash space::

    local(block) = blake2b_8(local(parent) | ns | token_ids as int64)
    local(parent of a first block) = 8 zero bytes
    ns = blake2b_8(lora_id, lora_name)       (the namespace the wire shows)

Per worker it keeps ``engine hash -> local hash`` (removals arrive by engine
hash) and ``engine hash -> media`` (a bit per medium). Two engine hashes can
carry the same tokens (two tenants' salted namespaces look alike on the
wire), so each (worker, medium, local hash) carries a reference count: the
block stays visible until the last engine hash behind it is removed.

Across workers, ``holders[local] = {worker: media bits}`` lets a query walk
the request's blocks once and stop as soon as no worker holds the next one.
Not thread safe: see ``EventSubscriber.lock`` for the threaded subscriber.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from radixcache.events.types import (
    CPU_PINNED,
    DISK,
    EXTERNAL,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    Medium,
)

log = logging.getLogger(__name__)

WorkerId = Hashable  # whatever the router names its workers by
# (tokens, block_size, lora_id, lora_name) -> leading blocks a shared pool holds; None: unknown
PoolLookupFn = Callable[[Sequence[int], int, "int | None", "str | None"], "int | None"]
W = TypeVar("W", bound=Hashable)  # the caller's own worker-id type, kept in answers

_BIT: dict[str | None, int] = {GPU: 1, CPU_PINNED: 2, DISK: 4, EXTERNAL: 8, None: 1}  # None: GPU
_SLOT: dict[int, int] = {1: 0, 2: 1, 4: 2}  # media bit -> index into per-medium refs
_UP_TO_HOST = 1 | 2  # resident on GPU or CPU_PINNED
_ROOT = bytes(8)  # local hash "before" a sequence's first block


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


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
    whose every block is on some medium. Hence ``gpu <= host <= disk``.
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

    orphan_blocks: int  # stored blocks whose parent was unknown (not indexed)
    unknown_removals: int  # removals of blocks not resident on that medium
    conflicts: int  # an engine hash re-stored with other tokens (old one dropped)


class _Worker:
    __slots__ = ("local_of", "media_of", "refs")

    def __init__(self) -> None:
        self.local_of: dict[int, bytes] = {}  # engine hash -> local hash
        self.media_of: dict[int, int] = {}  # engine hash -> media bits (never 0)
        # per medium (GPU, CPU_PINNED, DISK): local hash -> engine hashes behind it
        self.refs: tuple[dict[bytes, int], ...] = ({}, {}, {})


class KvIndex:
    """Per worker and medium, which blocks are resident; answers prefix queries."""

    def __init__(
        self, config: IndexConfig | None = None, pool_lookup: PoolLookupFn | None = None
    ) -> None:
        self.config = config or IndexConfig()
        self._pool_lookup = pool_lookup  # asked by choose(); see _pool_blocks
        self._workers: dict[WorkerId, _Worker] = {}
        self._holders: dict[bytes, dict[WorkerId, int]] = {}  # local -> {worker: media bits}
        self._ns_cache: dict[tuple[int | None, str | None], bytes] = {}
        self._orphans = 0
        self._unknown_removals = 0
        self._conflicts = 0

    # ------------------------------------------------------------------ updates

    def apply_batch(self, worker: WorkerId, batch: EventBatch) -> None:
        """Apply a batch's events in order (the ``BatchSink`` contract).

        An event the index refuses is skipped, the rest still apply, and then
        the first refusal (ValueError) is raised.
        """
        refused: ValueError | None = None
        for event in batch.events:
            try:
                self.apply_event(worker, event)
            except ValueError as exc:
                refused = refused or exc
        if refused is not None:
            raise refused

    def apply_event(self, worker: WorkerId, event: KvEvent) -> None:
        """Apply one event. Raises ValueError (before any change) for token
        ids that do not fit int64; unknown parents and removals are counted."""
        if type(event) is BlockStored:
            self._store(worker, event)
        elif type(event) is BlockRemoved:
            state = self._workers.get(worker)
            bit = _BIT[event.medium]
            for engine_hash in event.block_hashes:
                if state is None or not self._drop(worker, state, engine_hash, bit):
                    self._unknown_removals += 1
        elif type(event) is AllBlocksCleared:
            self.clear_worker(worker)
        else:
            raise TypeError(f"not an event record: {type(event).__name__}")

    def clear_worker(self, worker: WorkerId) -> None:
        """Forget every block of ``worker`` on every medium (it stays known)."""
        state = self._workers.get(worker)
        if state is None:
            self._workers[worker] = _Worker()
            return
        for refs in state.refs:
            for local in refs:
                held = self._holders.get(local)
                if held is not None and held.pop(worker, None) is not None and not held:
                    del self._holders[local]
        self._workers[worker] = _Worker()

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget ``worker`` altogether (its blocks and its name)."""
        self.clear_worker(worker)
        del self._workers[worker]

    def _ns(self, lora_id: int | None, lora_name: str | None) -> bytes:
        key = (lora_id, lora_name)
        ns = self._ns_cache.get(key)
        if ns is None:
            ns = _digest(repr(key).encode())
            self._ns_cache[key] = ns
        return ns

    def _store(self, worker: WorkerId, event: BlockStored) -> None:
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _Worker()
        bs = event.block_size
        try:
            data = array("q", event.token_ids).tobytes()
        except (OverflowError, TypeError) as exc:
            raise ValueError(f"token ids of a BlockStored do not fit int64: {exc}") from None
        ns = self._ns(event.lora_id, event.lora_name)
        if event.parent_block_hash is None:
            parent: bytes | None = _ROOT
        else:
            parent = state.local_of.get(event.parent_block_hash)
        bit = _BIT[event.medium]
        width = 8 * bs
        for i, engine_hash in enumerate(event.block_hashes):
            known = state.local_of.get(engine_hash)
            if parent is None:  # chain broken: only already-known blocks can be placed
                local = known
            else:
                local = _digest(parent + ns + data[i * width : (i + 1) * width])
            if local is None:
                self._orphans += 1
                continue
            if known is not None and known != local:
                self._conflicts += 1
                for b in (1, 2, 4):
                    self._drop(worker, state, engine_hash, b)
            self._add(worker, state, engine_hash, local, bit)
            parent = local

    def _add(self, worker: WorkerId, state: _Worker, engine_hash: int, local: bytes, bit: int) -> None:
        media = state.media_of.get(engine_hash, 0)
        if media & bit:
            return  # stored twice on the same medium: still one reference
        state.local_of[engine_hash] = local
        state.media_of[engine_hash] = media | bit
        refs = state.refs[_SLOT[bit]]
        count = refs.get(local, 0)
        refs[local] = count + 1
        if count == 0:
            held = self._holders.get(local)
            if held is None:
                held = self._holders[local] = {}
            held[worker] = held.get(worker, 0) | bit

    def _drop(self, worker: WorkerId, state: _Worker, engine_hash: int, bit: int) -> bool:
        media = state.media_of.get(engine_hash, 0)
        if not media & bit:
            return False
        local = state.local_of[engine_hash]
        media &= ~bit
        if media:
            state.media_of[engine_hash] = media
        else:
            del state.media_of[engine_hash]
            del state.local_of[engine_hash]
        refs = state.refs[_SLOT[bit]]
        count = refs[local] - 1
        if count:
            refs[local] = count
            return True
        del refs[local]
        held = self._holders[local]
        left = held[worker] & ~bit
        if left:
            held[worker] = left
        else:
            del held[worker]
            if not held:
                del self._holders[local]
        return True

    # ------------------------------------------------------------------ queries

    @overload
    def overlap(
        self, tokens: Sequence[int], *, block_size: int | None = None, lora_id: int | None = None,
        lora_name: str | None = None, workers: None = None,
    ) -> dict[WorkerId, TierOverlap]: ...

    @overload
    def overlap(
        self, tokens: Sequence[int], *, block_size: int | None = None, lora_id: int | None = None,
        lora_name: str | None = None, workers: Iterable[W],
    ) -> dict[W, TierOverlap]: ...

    def overlap(
        self,
        tokens: Sequence[int],
        *,
        block_size: int | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        workers: Iterable[Any] | None = None,
    ) -> dict[Any, TierOverlap]:
        """Leading blocks of ``tokens`` each worker holds, per tier.

        Only full blocks count. Answers for ``workers`` (default: every
        worker the index knows), zeros for a worker holding nothing.
        """
        bs = block_size or self.config.block_size
        blocks = len(tokens) // bs
        data = array("q", tokens[: blocks * bs]).tobytes()
        ns = self._ns(lora_id, lora_name)
        width = 8 * bs
        runs: dict[WorkerId, list[int]] = {}  # worker -> [gpu, host, disk, tiers still running]
        alive: list[tuple[WorkerId, list[int]]] = []
        parent = _ROOT
        for i in range(blocks):
            local = _digest(parent + ns + data[i * width : (i + 1) * width])
            held = self._holders.get(local)
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
                if run[3] & 2 and media & _UP_TO_HOST:
                    run[1] += 1
                else:
                    run[3] &= ~2
                if run[3] & 1 and media & 1:
                    run[0] += 1
                else:
                    run[3] &= ~1
                still.append((w, run))
            if not still:
                break
            alive = still
            parent = local
        names = self._workers.keys() if workers is None else workers
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
        overlaps = self.overlap(tokens, block_size=bs, lora_id=lora_id, lora_name=lora_name, workers=loads)
        pool = self._pool_blocks(tokens, bs, lora_id, lora_name)
        costs: dict[W, float] = {}
        for w, o in overlaps.items():
            cached = cfg.w_gpu * o.gpu + cfg.w_host * (o.host - o.gpu) + cfg.w_disk * (o.disk - o.host)
            if pool:  # blocks past the worker's host overlap: each worth its best tier
                both = max(0, min(pool, o.disk) - o.host)  # on its disk and in the pool
                cached += max(0.0, cfg.w_pool - cfg.w_disk) * both
                cached += cfg.w_pool * max(0, pool - max(o.disk, o.host))  # only in the pool
            costs[w] = request_blocks - cached + cfg.w_load * loads[w]
        best = min(costs, key=costs.__getitem__)  # first minimum: ties keep the loads' order
        return RoutingDecision(best, costs[best], request_blocks, overlaps, costs, pool)

    def _pool_blocks(
        self, tokens: Sequence[int], bs: int, lora_id: int | None, lora_name: str | None
    ) -> int | None:
        """Leading blocks the shared pool holds (any worker can fetch them);
        None without a pool lookup or when it fails (index-only scoring)."""
        if self._pool_lookup is None:
            return None
        try:
            hits = self._pool_lookup(tokens, bs, lora_id, lora_name)
        except Exception as exc:  # the pool is advisory: never fail a routing decision
            log.warning("shared pool query failed (%r); routing on the index alone", exc)
            return None
        return None if hits is None else min(max(int(hits), 0), len(tokens) // bs)

    # ------------------------------------------------------------------ inspection

    def workers(self) -> list[WorkerId]:
        """Every worker the index knows, in the order it first heard of them."""
        return list(self._workers)

    def resident(self, worker: WorkerId, medium: Medium) -> set[int]:
        """Engine hashes of ``worker``'s blocks on ``medium`` (a new set)."""
        state = self._workers.get(worker)
        if state is None:
            return set()
        bit = _BIT[medium]
        return {h for h, media in state.media_of.items() if media & bit}

    def stats(self) -> IndexStats:
        """A snapshot of the counters."""
        return IndexStats(self._orphans, self._unknown_removals, self._conflicts)

    def check_integrity(self) -> None:
        """Assert that refcounts and holders agree with the per-worker maps."""
        expected: dict[bytes, dict[WorkerId, int]] = {}
        for w, state in self._workers.items():
            assert state.local_of.keys() == state.media_of.keys(), f"{w}: maps disagree"
            counts: tuple[dict[bytes, int], ...] = ({}, {}, {})
            for h, media in state.media_of.items():
                assert media and not media & ~15, f"{w}: bad media bits {media} for {h}"
                for bit, slot in _SLOT.items():
                    if media & bit:
                        local = state.local_of[h]
                        counts[slot][local] = counts[slot].get(local, 0) + 1
                        expected.setdefault(local, {})
                        expected[local][w] = expected[local].get(w, 0) | bit
            assert counts == state.refs, f"{w}: reference counts drifted"
        assert expected == self._holders, "holders drifted from the workers' maps"

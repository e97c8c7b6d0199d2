"""The router-side index: which worker holds which prefix, on which medium.

A router cannot reproduce an engine's block hashes (they may be salted per
tenant, seeded per process, computed over extra keys the wire doesn't show).
So the index rehashes the token ids of every stored block with its own chained
hash and answers queries in that "local" hash space::

    local(block) = blake2b_8(local(parent) | ns | token_ids as int64 | extra)
    local(parent of a first block) = 8 zero bytes
    ns = blake2b_8(lora_id, lora_name, cache_salt)   (the namespace the wire shows)
    extra = repr(the block's extra_keys entry), or nothing when it is nil

Salted tenants therefore never share a local hash, even over the same system
prompt. A query names the namespace the same way (``lora_id``, ``lora_name``,
``cache_salt``, ``extra_keys``); a radixcache engine publishes, for every
block of a namespace with a salt or extra keys, the entry
``(cache_salt, *extra_keys)`` (the salt left out when there is none), and a
query builds the same entry from its arguments.

A block whose parent the index does not know (an orphan: its parent left
every medium first, as a storage tier that evicts a prefix before its suffix
does) is kept by engine hash, counted in ``resident``, and placed as soon as
its parent is stored again; a prefix query cannot reach it before that.

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
_SLOT: dict[int, int] = {1: 0, 2: 1, 4: 2, 8: 3}  # media bit -> index into per-medium refs
_ALL_BITS = 15
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


class _Orphan:
    """A stored block whose parent is unknown: what placing it later needs."""

    __slots__ = ("data", "media", "ns", "parent")

    def __init__(self, parent: int, ns: bytes, data: bytes) -> None:
        self.parent = parent  # engine hash of the parent it waits for
        self.ns = ns  # namespace key
        self.data = data  # token ids as int64 bytes + extra-key bytes
        self.media = 0  # media bits it was stored on


class _Worker:
    __slots__ = ("local_of", "media_of", "orphans", "refs", "waiting")

    def __init__(self) -> None:
        self.local_of: dict[int, bytes] = {}  # engine hash -> local hash
        self.media_of: dict[int, int] = {}  # engine hash -> media bits (never 0)
        # per medium (GPU, CPU_PINNED, DISK, EXTERNAL): local hash -> engine hashes behind it
        self.refs: tuple[dict[bytes, int], ...] = ({}, {}, {}, {})
        self.orphans: dict[int, _Orphan] = {}  # engine hash -> orphan (not in local_of)
        self.waiting: dict[int, list[int]] = {}  # parent engine hash -> orphans' hashes


class KvIndex:
    """Per worker and medium, which blocks are resident; answers prefix queries."""

    def __init__(
        self, config: IndexConfig | None = None, pool_lookup: PoolLookupFn | None = None
    ) -> None:
        self.config = config or IndexConfig()
        self._pool_lookup = pool_lookup  # asked by choose(); see _pool_blocks
        self._workers: dict[WorkerId, _Worker] = {}
        self._holders: dict[bytes, dict[WorkerId, int]] = {}  # local -> {worker: media bits}
        self._ns_cache: dict[tuple[int | None, str | None, str | None], bytes] = {}
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
                if state is None or not (
                    self._drop(worker, state, engine_hash, bit) or self._drop_orphan(state, engine_hash, bit)
                ):
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

    def _ns(self, lora_id: int | None, lora_name: str | None, cache_salt: str | None = None) -> bytes:
        key = (lora_id, lora_name, cache_salt)
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
        ns = self._ns(event.lora_id, event.lora_name, event.cache_salt)
        extra = event.extra_keys
        parent_hash = event.parent_block_hash
        if parent_hash is None:
            parent: bytes | None = _ROOT
        else:
            parent = state.local_of.get(parent_hash)
        bit = _BIT[event.medium]
        width = 8 * bs
        for i, engine_hash in enumerate(event.block_hashes):
            block = data[i * width : (i + 1) * width]
            entry = None if extra is None else extra[i]
            if entry is not None:
                block += repr(tuple(entry)).encode()
            known = state.local_of.get(engine_hash)
            local = known if parent is None else _digest(parent + ns + block)
            if local is None:  # parent unknown: keep it until the parent returns
                assert parent_hash is not None
                self._hold_orphan(state, engine_hash, parent_hash, ns, block, bit)
            else:
                if known is not None and known != local:
                    self._conflicts += 1
                    for b in _SLOT:
                        self._drop(worker, state, engine_hash, b)
                self._add(worker, state, engine_hash, local, bit)
            parent = local
            parent_hash = engine_hash

    def _hold_orphan(
        self, state: _Worker, engine_hash: int, parent_hash: int, ns: bytes, data: bytes, bit: int
    ) -> None:
        orphan = state.orphans.get(engine_hash)
        if orphan is None or orphan.parent != parent_hash or orphan.data != data or orphan.ns != ns:
            if orphan is not None:
                self._forget_orphan(state, engine_hash)
            orphan = state.orphans[engine_hash] = _Orphan(parent_hash, ns, data)
            state.waiting.setdefault(parent_hash, []).append(engine_hash)
        if not orphan.media & bit:
            self._orphans += 1
        orphan.media |= bit

    def _forget_orphan(self, state: _Worker, engine_hash: int) -> None:
        orphan = state.orphans.pop(engine_hash)
        waiters = state.waiting[orphan.parent]
        waiters.remove(engine_hash)
        if not waiters:
            del state.waiting[orphan.parent]

    def _drop_orphan(self, state: _Worker, engine_hash: int, bit: int) -> bool:
        orphan = state.orphans.get(engine_hash)
        if orphan is None or not orphan.media & bit:
            return False
        orphan.media &= ~bit
        if not orphan.media:
            self._forget_orphan(state, engine_hash)
        return True

    def _adopt(self, worker: WorkerId, state: _Worker, parent_hash: int) -> None:
        """Place the orphans waiting for ``parent_hash`` (now known), and theirs."""
        todo = [parent_hash]
        while todo:
            p = todo.pop()
            parent_local = state.local_of.get(p)
            if parent_local is None:
                continue
            for h in list(state.waiting.get(p, ())):
                orphan = state.orphans[h]
                self._forget_orphan(state, h)
                if h in state.local_of:
                    continue  # placed meanwhile under its own parent chain
                local = _digest(parent_local + orphan.ns + orphan.data)
                for b in _SLOT:
                    if orphan.media & b:
                        self._add(worker, state, h, local, b, adopt=False)
                todo.append(h)

    def _add(
        self, worker: WorkerId, state: _Worker, engine_hash: int, local: bytes, bit: int, adopt: bool = True
    ) -> None:
        media = state.media_of.get(engine_hash, 0)
        if media & bit:
            return  # stored twice on the same medium: still one reference
        if engine_hash in state.orphans:  # placed now: its orphan record is stale
            orphan = state.orphans[engine_hash]
            self._forget_orphan(state, engine_hash)
            for b in _SLOT:  # it keeps what it was stored on meanwhile
                if orphan.media & b and not (media | bit) & b:
                    media |= b
                    self._ref(worker, state, local, b)
        state.local_of[engine_hash] = local
        state.media_of[engine_hash] = media | bit
        self._ref(worker, state, local, bit)
        if adopt and engine_hash in state.waiting:
            self._adopt(worker, state, engine_hash)

    def _ref(self, worker: WorkerId, state: _Worker, local: bytes, bit: int) -> None:
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
        data = array("q", tokens[: blocks * bs]).tobytes()
        ns = self._ns(lora_id, lora_name, cache_salt)
        tail = self.block_extra(cache_salt, extra_keys)
        width = 8 * bs
        runs: dict[WorkerId, list[int]] = {}  # worker -> [gpu, host, disk, tiers still running]
        alive: list[tuple[WorkerId, list[int]]] = []
        parent = _ROOT
        for i in range(blocks):
            local = _digest(parent + ns + data[i * width : (i + 1) * width] + tail)
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
        pool = self._pool_blocks(tokens, bs, lora_id, lora_name)
        costs = {w: self.cost(request_blocks, o, loads[w], pool) for w, o in overlaps.items()}
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
        """The bytes a query mixes into every block's local hash for a namespace.

        Matches what a radixcache engine publishes per block: the entry
        ``(cache_salt, *extra_keys)`` (salt left out when None), nothing when
        both are empty.
        """
        entry = ((cache_salt,) if cache_salt is not None else ()) + tuple(extra_keys or ())
        return repr(entry).encode() if entry else b""

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
        held = {h for h, media in state.media_of.items() if media & bit}
        held.update(h for h, orphan in state.orphans.items() if orphan.media & bit)
        return held

    def stats(self) -> IndexStats:
        """A snapshot of the counters."""
        return IndexStats(self._orphans, self._unknown_removals, self._conflicts)

    def check_integrity(self) -> None:
        """Assert that refcounts and holders agree with the per-worker maps."""
        expected: dict[bytes, dict[WorkerId, int]] = {}
        for w, state in self._workers.items():
            assert state.local_of.keys() == state.media_of.keys(), f"{w}: maps disagree"
            counts: tuple[dict[bytes, int], ...] = ({}, {}, {}, {})
            assert not state.orphans.keys() & state.local_of.keys(), f"{w}: placed orphans"
            for h, orphan in state.orphans.items():
                assert orphan.media and h in state.waiting[orphan.parent], f"{w}: orphan {h} lost"
            assert sum(map(len, state.waiting.values())) == len(state.orphans), f"{w}: waiting drifted"
            for h, media in state.media_of.items():
                assert media and not media & ~_ALL_BITS, f"{w}: bad media bits {media} for {h}"
                for bit, slot in _SLOT.items():
                    if media & bit:
                        local = state.local_of[h]
                        counts[slot][local] = counts[slot].get(local, 0) + 1
                        expected.setdefault(local, {})
                        expected[local][w] = expected[local].get(w, 0) | bit
            assert counts == state.refs, f"{w}: reference counts drifted"
        assert expected == self._holders, "holders drifted from the workers' maps"

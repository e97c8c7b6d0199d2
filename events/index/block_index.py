"""Per worker and medium, which blocks are resident: the index's state.

``BlockIndex`` applies a worker's events in stream order and keeps, in the
router's own hash space (``events.index.local_hash``):

    per worker
      local_of[engine hash] = local hash      removals arrive by engine hash
      media_of[engine hash] = media bits      a bit per medium, never 0
      refs[medium][local]   = engine hashes behind that local hash
      orphans, waiting                        blocks whose parent is unknown
    across workers
      holders[local] = {worker: media bits}   what prefix queries walk

Two engine hashes can carry the same tokens (two tenants' salted namespaces
look alike on the wire), so each (worker, medium, local hash) carries a
reference count: the block stays visible until the last engine hash behind
it is removed.

A block whose parent the index does not know (an orphan: its parent left
every medium first, as a storage tier that evicts a prefix before its suffix
does) is kept by engine hash, counted in ``resident``, and placed as soon as
its parent is stored again; a prefix query cannot reach it before that.

Not thread safe: see ``EventSubscriber.lock`` for the threaded subscriber.
"""

from __future__ import annotations

from collections.abc import Mapping

from radixcache.events.index.records import IndexStats, WorkerId
from radixcache.events.index.local_hash import ROOT, NamespaceKeys, digest, entry_bytes, token_bytes
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

MEDIUM_BIT: dict[str | None, int] = {GPU: 1, CPU_PINNED: 2, DISK: 4, EXTERNAL: 8, None: 1}  # None: GPU
GPU_BIT = 1
UP_TO_HOST = 1 | 2  # resident on GPU or CPU_PINNED
_SLOT: dict[int, int] = {1: 0, 2: 1, 4: 2, 8: 3}  # media bit -> index into per-medium refs
_ALL_BITS = 15


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


class BlockIndex:
    """Applies workers' events; holds which local hashes each worker has where.

    Owns all of its state; ``holders`` is handed out for reading only.
    """

    def __init__(self, namespaces: NamespaceKeys | None = None) -> None:
        self.namespaces = namespaces or NamespaceKeys()  # shared with the queries
        self._workers: dict[WorkerId, _Worker] = {}
        self._holders: dict[bytes, dict[WorkerId, int]] = {}  # local -> {worker: media bits}
        self._orphans = 0
        self._unknown_removals = 0
        self._conflicts = 0

    @property
    def holders(self) -> Mapping[bytes, Mapping[WorkerId, int]]:
        """local hash -> {worker: media bits} (read only; changes with every event)."""
        return self._holders

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
            bit = MEDIUM_BIT[event.medium]
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

    def _store(self, worker: WorkerId, event: BlockStored) -> None:
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _Worker()
        data = token_bytes(event.token_ids)  # raises ValueError before any change
        ns = self.namespaces.key(event.lora_id, event.lora_name, event.cache_salt)
        extra = event.extra_keys
        parent_hash = event.parent_block_hash
        parent: bytes | None = ROOT if parent_hash is None else state.local_of.get(parent_hash)
        bit = MEDIUM_BIT[event.medium]
        width = 8 * event.block_size
        for i, engine_hash in enumerate(event.block_hashes):
            block = data[i * width : (i + 1) * width]
            if extra is not None:
                block += entry_bytes(extra[i])
            known = state.local_of.get(engine_hash)
            local = known if parent is None else digest(parent + ns + block)
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
                local = digest(parent_local + orphan.ns + orphan.data)
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

    # ------------------------------------------------------------------ inspection

    def workers(self) -> list[WorkerId]:
        """Every worker the index knows, in the order it first heard of them."""
        return list(self._workers)

    def resident(self, worker: WorkerId, medium: Medium) -> set[int]:
        """Engine hashes of ``worker``'s blocks on ``medium`` (a new set)."""
        state = self._workers.get(worker)
        if state is None:
            return set()
        bit = MEDIUM_BIT[medium]
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

"""Storage key -> event id of the pages this engine announced on a storage medium.

Storage reports removals by page key (``Storage.take_removed``: LRU
eviction, a pool's removals, ``forget_namespace``, corrupt records), but
events name pages by their fast block id, which cannot be derived from a
key. ``StorageIds`` remembers, for every page this engine announced as
stored on its storage medium (a store that landed, a page read back, a
survivor announced at start), the id it was announced with, so its removal
carries the same id; ``pop`` forgets it again.

Layout: one open-addressing hash table in three parallel numpy arrays, with
linear probing; a storage key is a blake2b output, so its first 8 bytes are
already a uniform hash and pick the home slot (their value modulo the
capacity)::

    slot:   0      1      2      3     ...   capacity - 1
    lo:     k0.lo  -      k1.lo  k2.lo       uint64: key bytes 0..7
    hi:     k0.hi  -      k1.hi  k2.hi       uint64: key bytes 8..15
    val:    id0    EMPTY  id1    TOMB        int64: the event id, or a marker

The whole 16-byte key is compared, so a lookup never returns another key's
id. A removed entry becomes a tombstone (probe chains stay intact); the
table is rebuilt, with three slots per live key, when live entries and
tombstones pass half its slots (so a probe is a few slots long), or when
removals leave fewer than an eighth of its slots live. 24 bytes a slot and,
while pages are added, between a third and a half of them live: 48 to 72
bytes per remembered page. Every operation works on a whole batch of keys
with numpy: no Python object per page.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from radixcache.keys.hashing import KEY_BYTES, BlockIds

_EMPTY = -1  # a slot never used since the last rebuild (ends a probe)
_TOMB = -2  # a slot whose entry was removed (a probe goes on past it)
_MIN_CAPACITY = 64

U64s = npt.NDArray[np.uint64]
Slots = npt.NDArray[np.int64]


def key_halves(keys: Sequence[bytes]) -> tuple[U64s, U64s]:
    """The two 8-byte halves of 16-byte storage keys, as uint64 arrays.

    Raises ValueError when a key is not 16 bytes long (a raw page's key:
    raw pages carry no event id)."""
    joined = b"".join(keys)
    if len(joined) != KEY_BYTES * len(keys) or any(len(k) != KEY_BYTES for k in keys):
        bad = next((len(k) for k in keys if len(k) != KEY_BYTES), len(joined))
        raise ValueError(f"storage keys must be {KEY_BYTES} bytes, got one of {bad}")
    words = np.frombuffer(joined, dtype="<u8").reshape(-1, 2)
    return words[:, 0].copy(), words[:, 1].copy()


class StorageIds:
    """The event id of each storage key this engine announced. Owner thread only.

    Mutates only itself. ``add`` replaces the id of a key it holds already.
    """

    def __init__(self) -> None:
        self._alloc(_MIN_CAPACITY)
        self._live = 0  # keys held
        self._tombs = 0  # tombstone slots

    def _alloc(self, capacity: int) -> None:
        self._lo: U64s = np.zeros(capacity, dtype=np.uint64)
        self._hi: U64s = np.zeros(capacity, dtype=np.uint64)
        self._val: npt.NDArray[np.int64] = np.full(capacity, _EMPTY, dtype=np.int64)
        self._cap = np.uint64(capacity)

    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of the table's arrays (what it costs beyond a few objects)."""
        return int(self._lo.nbytes + self._hi.nbytes + self._val.nbytes)

    # ------------------------------------------------------------------ lookup
    def _find(self, lo: U64s, hi: U64s) -> Slots:
        """The slot of each key, -1 where it is not held."""
        out = np.full(lo.size, -1, dtype=np.int64)
        active = np.arange(lo.size)
        slot = (lo % self._cap).astype(np.int64)
        cap = int(self._cap)
        while active.size:
            val = self._val[slot]
            hit = (val >= 0) & (self._lo[slot] == lo[active]) & (self._hi[slot] == hi[active])
            out[active[hit]] = slot[hit]
            more = ~hit & (val != _EMPTY)
            active = active[more]
            slot = (slot[more] + 1) % cap
        return out

    def get(self, keys: Sequence[bytes]) -> BlockIds:
        """The id of each key, -1 where it is not held. Mutates nothing."""
        if not keys:
            return np.empty(0, dtype=np.int64)
        slots = self._find(*key_halves(keys))
        return np.where(slots >= 0, self._val[np.maximum(slots, 0)], -1)

    # ------------------------------------------------------------------ add / pop
    def add(self, keys: bytes, ids: BlockIds) -> BlockIds:
        """Remember ``ids[i]`` for the i-th 16-byte key of the concatenated
        ``keys``; returns the ids it replaced that differ from the new ones
        (a page announced before under another id)."""
        n = len(keys) // KEY_BYTES
        if len(keys) != n * KEY_BYTES or ids.shape != (n,):
            raise ValueError(f"{len(keys)} key bytes for {ids.shape} ids: want {KEY_BYTES} bytes per id")
        if not n:
            return np.empty(0, dtype=np.int64)
        words = np.frombuffer(keys, dtype="<u8").reshape(-1, 2)
        lo, hi, vals = words[:, 0], words[:, 1], ids.astype(np.int64)
        if np.any(vals < 0):
            raise ValueError("event ids are non-negative")
        # A key twice in one batch: its last id counts.
        _, last = np.unique(np.stack([lo, hi], axis=1)[::-1], axis=0, return_index=True)
        keep = np.sort(n - 1 - last)
        lo, hi, vals = lo[keep], hi[keep], vals[keep]
        slots = self._find(lo, hi)
        held = slots >= 0
        old = self._val[slots[held]]
        replaced = old[old != vals[held]]
        self._val[slots[held]] = vals[held]
        fresh = ~held
        if np.any(fresh):
            self._reserve(int(fresh.sum()))
            self._place(lo[fresh], hi[fresh], vals[fresh])
        return replaced

    def pop(self, keys: Sequence[bytes]) -> BlockIds:
        """Forget ``keys``; returns the id each had, -1 for a key not held
        (or listed twice: its second time)."""
        if not keys:
            return np.empty(0, dtype=np.int64)
        slots = self._find(*key_halves(keys))
        found = np.flatnonzero(slots >= 0)
        _, first = np.unique(slots[found], return_index=True)
        found = found[first]
        out = np.full(len(keys), -1, dtype=np.int64)
        out[found] = self._val[slots[found]]
        self._val[slots[found]] = _TOMB
        self._live -= found.size
        self._tombs += found.size
        if 8 * self._live < self._val.size and self._val.size > _MIN_CAPACITY:
            self._rebuild(0)  # give back the room of what left
        return out

    def clear(self) -> None:
        """Forget every key (the engine announced everything gone)."""
        self._alloc(_MIN_CAPACITY)
        self._live = self._tombs = 0

    # ------------------------------------------------------------------ table
    def _reserve(self, more: int) -> None:
        """Rebuild when ``more`` new keys would fill over half the slots."""
        if 2 * (self._live + self._tombs + more) > self._val.size:
            self._rebuild(more)

    def _rebuild(self, more: int) -> None:
        """A fresh table of three slots per key, for the live keys and ``more``."""
        live = np.flatnonzero(self._val >= 0)
        lo, hi, vals = self._lo[live], self._hi[live], self._val[live]
        self._alloc(max(_MIN_CAPACITY, 3 * (self._live + more)))
        self._live = self._tombs = 0
        self._place(lo, hi, vals)

    def _place(self, lo: U64s, hi: U64s, vals: BlockIds) -> None:
        """Put keys that are not held (distinct, room reserved) into free slots."""
        cap = int(self._cap)
        slot = (lo % self._cap).astype(np.int64)
        todo = np.arange(lo.size)
        while todo.size:
            free = self._val[slot] < 0
            # of the keys that found a free slot, one per slot takes it
            cand = np.flatnonzero(free)
            _, first = np.unique(slot[cand], return_index=True)
            win = cand[first]
            s = slot[win]
            self._tombs -= int(np.count_nonzero(self._val[s] == _TOMB))
            self._lo[s], self._hi[s], self._val[s] = lo[todo[win]], hi[todo[win]], vals[todo[win]]
            self._live += win.size
            lose = np.ones(todo.size, dtype=bool)
            lose[win] = False
            todo = todo[lose]
            slot = (slot[lose] + 1) % cap

    def check_integrity(self) -> None:
        """Counts match the table; every held key is reachable from its home slot."""
        live = np.flatnonzero(self._val >= 0)
        assert live.size == self._live, f"{live.size} live slots, count says {self._live}"
        tombs = int(np.count_nonzero(self._val == _TOMB))
        assert tombs == self._tombs, f"{tombs} tombstones, count says {self._tombs}"
        assert 2 * (self._live + self._tombs) <= self._val.size, "table over half full"
        found = self._find(self._lo[live], self._hi[live])
        assert np.array_equal(found, live), "a held key is not found in its own slot"

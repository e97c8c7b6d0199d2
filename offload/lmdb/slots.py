"""The slot file: the KV bytes of an LMDB store's records, outside LMDB's map.

A put into LMDB's shared memory map faults in (and zeroes) every 4 KiB page
of the file before it copies the record there; the kernel's ``write()`` does
not. So a record of a page of at least ``StorageConfig.slot_min_page_bytes``
keeps its body (the KV bytes; sealed: their ciphertext and its tag) in one
fixed-size slot of ``kv.slots`` in the store directory, written with one
``pwrite`` straight from the host page, and LMDB holds the rest (the
record's lead: header, key, info, token ids) in an envelope naming the slot::

    offset  size  field
    0       4     magic b"RXSL"
    4       4     tail bytes: how many bytes of the record lie in the slot
    8       8     slot number (the slot starts at slot x slot bytes)
    16      ...   the record's lead (every byte before the tail)

The record itself is the same bytes either way (offload/storage/record.py):
a reader copies the tail out of the file, mapped read-only, into the host
page, summing it in the same pass (sealed: decrypting it where it lies;
``Framing.read_split_into``), and checks it with the lead, so a slot
holding anything but this record's bytes (reused, torn, flipped) fails its
checksum or its authentication tag: a miss, never a hit. The map is made
again, larger, when the file grew; a view of the old one stays valid while
a read holds it. Records of the inline form (what LMDB held before, and
pages below the size) stay as they are, and are read as before.

Crash order and reuse, the rules this file keeps:

* a slot's bytes are written and synced (``fdatasync``) before the commit of
  the index entry that names it: a crash in between leaves a slot no entry
  names, which is free at the next open;
* the free slots are derived, at open, from the entries: the slots of the
  file that no envelope names;
* a slot freed by a commit (its record removed) is written again only after
  that commit, and after every read that began before that commit ended
  (``reading``: reads register the commit count they began under), so a read
  of a snapshot that still names the slot never sees it rewritten;
* a slot taken by a transaction that did not commit goes back at once.

The slot size is fixed when the file is created (``slot_size`` of the page
size of the store that made it, kept in the ``meta`` database); a record
whose body does not fit (a sealed one in a file made for records in the
clear, say) is stored inline. One process owns the store (the directory
lock), so this object's free list is the whole truth. Writer thread: ``take``,
``give_back``, ``write``, ``sync``, ``committed``, ``growth``; reader
threads: ``reading``, ``view``.
"""

from __future__ import annotations

import ctypes
import heapq
import mmap
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import PutJob
from radixcache.offload.storage.contract import StorageError

SLOT_FILE = "kv.slots"
MAGIC = b"RXSL"
ENVELOPE = struct.Struct("<4sIQ")  # magic, tail bytes, slot number
META_KEY = b"slot-bytes"  # the meta database's record of the slot size
SEAL_TAG_BYTES = 16  # a sealed body is the KV ciphertext and this tag


def _writeback_starter() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range`` (not in ``os``), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


# Starting a slot's writeback as soon as it is written, rather than leaving
# all of it to the sync before the commit, overlaps the disk's work with the
# writer's: measured here, LMDB puts of 256 KiB pages at 0.90x the rate of an
# fsync'd sequential write of the same bytes with it, 0.80x without (README,
# "LMDB writes, this round").
_start_writeback = _writeback_starter()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the range's dirty pages; do not wait


def slot_body(job: PutJob) -> int:
    """Bytes of the body of each of ``job``'s records (what a slot holds):
    the KV bytes; sealed, their ciphertext and its tag."""
    return job.host.page_bytes + (SEAL_TAG_BYTES if job.framing.sealed else 0)


def slot_size(page_bytes: int, sealed: bool) -> int:
    """The slot size of a new slot file for pages of ``page_bytes``: the
    page; sealed, the page and its tag, in whole 4 KiB pages from 4 KiB on."""
    if not sealed:
        return page_bytes
    need = page_bytes + SEAL_TAG_BYTES
    return need if need < 4096 else -(-need // 4096) * 4096


def wrap(slot: int, tail_bytes: int, lead: bytes | memoryview) -> bytes:
    """The LMDB value of a record whose last ``tail_bytes`` bytes lie in ``slot``."""
    return ENVELOPE.pack(MAGIC, tail_bytes, slot) + bytes(lead)


def unwrap(value: bytes | memoryview) -> tuple[memoryview, int, int] | None:
    """(lead, slot, tail bytes) of an envelope; None for a value of the inline form."""
    if len(value) < ENVELOPE.size or bytes(value[:4]) != MAGIC:
        return None
    _magic, tail, slot = ENVELOPE.unpack_from(value, 0)
    return memoryview(value)[ENVELOPE.size :], slot, tail


def stored_size(value: bytes | memoryview) -> int:
    """Bytes of the record an LMDB value holds or names (what capacity counts)."""
    parts = unwrap(value)
    return len(value) if parts is None else len(parts[0]) + parts[2]


def record_parts(value: bytes | memoryview) -> tuple[memoryview, int]:
    """(the record's bytes in ``value``, bytes of it kept in a slot)."""
    parts = unwrap(value)
    return (memoryview(value), 0) if parts is None else (parts[0], parts[2])


class SlotFile:
    """``kv.slots`` of one store directory (see the module docstring)."""

    def __init__(self, directory: str, slot_bytes: int) -> None:
        if slot_bytes <= 0:
            raise ValueError(f"slot_bytes must be positive, got {slot_bytes}")
        self.path = os.path.join(directory, SLOT_FILE)
        self.slot_bytes = slot_bytes
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._count = 0  # slots the file spans (the next new slot's number)
        self._free: list[int] = []  # a heap: the lowest free slot is taken first
        self._idle: set[int] = set()  # slots free or pending (a slot is listed once)
        self._shared: set[int] = set()  # slots two envelopes named at open: kept, never reused
        self._pending: deque[tuple[int, list[int]]] = deque()  # (commit, slots it freed)
        self._commits = 0  # commits published so far
        self._active: dict[int, int] = {}  # commit count a read began under -> reads
        self._lock = threading.Lock()  # _commits, _active, _pending (readers vs. the writer)
        self.dirty = False  # a slot was written since the last sync
        self._map: mmap.mmap | None = None  # the file, mapped read-only (remapped as it grows)

    def load(self, used: Iterable[int]) -> None:
        """Derive the free slots at open: the file's slots no envelope names."""
        named: set[int] = set()
        for slot in used:  # a slot named twice (a damaged envelope) is never freed
            (self._shared if slot in named else named).add(slot)
        size = os.fstat(self._fd).st_size
        self._count = -(-size // self.slot_bytes)  # (a slot named past the end: a bad record)
        self._free = [s for s in range(self._count) if s not in named]
        heapq.heapify(self._free)
        self._idle = set(self._free)

    def close(self) -> None:
        self._map = None  # unmapped once no view of it is held
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- the writer -----------------------------------------------------------
    def take(self) -> int:
        """A slot nobody reads or will read: a free one, or a new one at the end."""
        self._reclaim()
        if self._free:
            slot = heapq.heappop(self._free)
            self._idle.discard(slot)
            return slot
        self._count += 1
        return self._count - 1

    def give_back(self, slots: Iterable[int]) -> None:
        """Slots taken by a transaction that did not commit: free at once."""
        for slot in self._fresh(slots):
            heapq.heappush(self._free, slot)

    def growth(self, n: int) -> int:
        """Bytes the file grows by to hold ``n`` more slots (beyond the free ones)."""
        self._reclaim()
        return max(0, n - len(self._free)) * self.slot_bytes

    def committed(self, freed: list[int]) -> None:
        """A commit was published; ``freed``: the slots its removals freed,
        reusable once every read begun before now ended."""
        fresh = self._fresh(freed)
        with self._lock:
            if fresh:
                self._pending.append((self._commits, fresh))
            self._commits += 1

    def _fresh(self, slots: Iterable[int]) -> list[int]:
        """The slots of ``slots`` this file holds and has not listed idle yet,
        and that no other record names (a damaged envelope may name another
        record's slot, or one past the end: freeing it would hand out a slot
        in use)."""
        out = []
        for slot in slots:
            if 0 <= slot < self._count and slot not in self._idle and slot not in self._shared:
                self._idle.add(slot)
                out.append(slot)
        return out

    def write(self, slot: int, parts: list[memoryview]) -> None:
        """Write one record's tail (``parts``, in order) at ``slot``, and start
        its writeback to the disk at once (``sync_file_range``, where there
        is one), so the sync before the commit finds most of it done."""
        want = sum(len(p) for p in parts)
        assert want <= self.slot_bytes, f"a tail of {want} B in slots of {self.slot_bytes} B"
        at = slot * self.slot_bytes
        try:
            done = os.pwritev(self._fd, parts, at)
        except OSError as exc:
            raise StorageError(f"cannot write slot {slot} of {self.path!r}: {exc}") from exc
        if done != want:  # a full disk part-way
            raise StorageError(f"short write into {self.path!r}: {done} of {want} B (disk full?)")
        self.dirty = True
        if _start_writeback is not None:
            _start_writeback(self._fd, at, want, _SYNC_FILE_RANGE_WRITE)  # a hint: result unused

    def sync(self) -> None:
        """Make every slot written so far durable (before the commit naming them)."""
        if self.dirty:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                raise StorageError(f"cannot sync {self.path!r}: {exc}") from exc
            self.dirty = False

    def _reclaim(self) -> None:
        """Free the pending slots no read in progress may still name."""
        with self._lock:
            oldest = min(self._active, default=self._commits)
            while self._pending and self._pending[0][0] < oldest:
                for slot in self._pending.popleft()[1]:
                    heapq.heappush(self._free, slot)

    # -- readers --------------------------------------------------------------
    @contextmanager
    def reading(self) -> Iterator[None]:
        """Held around a read transaction that reads slots (see the module docstring)."""
        with self._lock:
            began = self._commits
            self._active[began] = self._active.get(began, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._active[began] - 1
                if left:
                    self._active[began] = left
                else:
                    del self._active[began]

    def view(self, slot: int, nbytes: int) -> memoryview | None:
        """The first ``nbytes`` of ``slot``, a read-only view of the mapped
        file (the page cache itself: no copy); None when the file ends
        first (a truncated file: the record is corrupt). The view stays
        valid while held, even after the file grew and was mapped again."""
        start = slot * self.slot_bytes
        end = start + nbytes
        if nbytes > self.slot_bytes:
            return None
        mapped = self._map
        if mapped is None or len(mapped) < end:
            with self._lock:
                size = os.fstat(self._fd).st_size
                if size < end:
                    return None
                mapped = self._map = mmap.mmap(self._fd, size, prot=mmap.PROT_READ)
        return memoryview(mapped)[start:end]

    # -- numbers --------------------------------------------------------------
    def idle(self) -> set[int]:
        """The slots free or waiting for reads to end (a copy; for checks,
        while the writer is at rest: the free list is the writer thread's)."""
        return set(self._idle)

    def idle_bytes(self) -> int:
        """Bytes of the slots free or waiting for reads to end: the file's
        room for records before it grows (it never shrinks)."""
        counts = self.stats()
        return (counts["free"] + counts["pending"]) * self.slot_bytes

    def stats(self) -> dict[str, int]:
        """Slots in the file, free, and freed but waiting for reads to end."""
        with self._lock:
            pending = sum(len(s) for _c, s in self._pending)
        return {"slots": self._count, "free": len(self._free), "pending": pending}

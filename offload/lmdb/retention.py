"""Retention deadlines and tags of an LMDB store, and the store's own write jobs.

Two named databases, written in the same transactions as the records they
describe (offload/lmdb/txn.py), so they survive a restart exactly as the
records do::

    expiry : record key -> deadline   (8 B, big-endian IEEE double: wall-clock seconds)
    tags   : tag id (16 B) -> namespace tags (16 B each; dupsort)

**Deadlines.** A put whose ``PutMeta.expires_at`` is set gives each record it
writes that deadline (a record a put finds already stored keeps its own: a
page lives from when it was first stored). A record whose deadline is at or
before the store's clock (``StorageConfig.clock``) is expired: never served
(``get`` stops there, a miss; ``longest_prefix`` does not count it; ``scan``
does not list it) and removed by the **sweep**, which every write step of the
writer thread runs first, in the same transaction: it takes the due records
from a heap ordered by deadline (``Deadlines.due``), so it costs
O(expired x log n) and never walks the records that are not due. A read that
meets an expired record asks for a sweep (``SweepJob``), and so does the
``SweepTimer`` (every ``StorageConfig.sweep_interval_s``) once the earliest
deadline has passed: expired records go even when nothing is written.
Expiry removals are removals like evictions: announced through
``take_removed``, counted (``StorageStats.expired``), and gone from the
recency index and the tenants' byte totals (a tenant's expired bytes do not
count toward its floor in the step that sweeps them).

In memory, ``Deadlines`` maps record key -> deadline (readers and the owner
look a key up without a lock: one dict lookup) and keeps the heap; it is
loaded at open from ``expiry`` and changed by the writer after each commit.
A reader looks its keys' deadlines up *before* it begins its read
transaction: a record the writer swept (and whose deadline it forgot) after
the lookup is still caught by the deadline looked up, and one swept before
it is not in the transaction's snapshot.

**Tags.** A put with ``PutMeta.tags`` records (tag, namespace tag) pairs;
``TagBook`` is the committed set, namespace -> tag ids, kept by the writer.
The store knows a tag by its **tag id**, a keyed 16-byte BLAKE2b digest
(``tag_key``, under the store's secret, like tenant ids: offload/lmdb/quotas.py),
so a tag's text is never written to disk.
``invalidate_tag`` (a ``TagJob``) forgets every namespace listed under the
tag, in one transaction, and deletes the tag's entries; a forgotten
namespace's pairs all go with it (no tag keeps naming it).

**Jobs.** The store's own jobs ride the shared writer queue as the shared
jobs they extend: a ``TagJob`` is a forget (of the namespaces under a tag);
a ``QuotaJob`` (new tenant quotas) and a ``SweepJob`` (expire what is due)
are deletes whose records the writer finds itself.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from radixcache.offload.lmdb.quotas import UNLIMITED, ByteQuota, TenantKey
from radixcache.offload.storage import DeleteJob, ForgetJob
from radixcache.offload.storage.contract import Clock

log = logging.getLogger(__name__)

_DEADLINE = struct.Struct(">d")
TagPair = tuple[bytes, bytes]  # (tag id, namespace tag)


def encode_deadline(deadline: float) -> bytes:
    """A deadline as the ``expiry`` database holds it."""
    return _DEADLINE.pack(deadline)


def decode_deadline(value: bytes | memoryview) -> float | None:
    """The deadline ``encode_deadline`` wrote (None: not one it wrote)."""
    if len(value) != _DEADLINE.size:
        return None
    (deadline,) = _DEADLINE.unpack(bytes(value))
    return deadline if math.isfinite(deadline) else None


def tag_key(secret: bytes, tag: str) -> bytes:
    """The ``tags`` database key of a (checked) tag: its id in this store."""
    return hashlib.blake2b(b"tag\x00" + tag.encode("ascii"), digest_size=16, key=secret).digest()


class Deadlines:
    """Record key -> retention deadline, and the sweep's heap (see the module docstring).

    ``at``/``expired`` are read on any thread without a lock; ``load``,
    ``apply`` and ``due`` run on the writer thread (``load`` before it starts).
    """

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._at: dict[bytes, float] = {}  # record key -> deadline (records that have one)
        self._heap: list[tuple[float, bytes]] = []  # (deadline, key); stale entries allowed

    def __len__(self) -> int:
        return len(self._at)

    def at(self, rkey: bytes) -> float | None:
        """The deadline of a stored record (None: none, or not stored)."""
        return self._at.get(rkey)

    def expired(self, rkey: bytes, now: float) -> bool:
        """True if the record of ``rkey`` has a deadline at or before ``now``."""
        deadline = self._at.get(rkey)
        return deadline is not None and deadline <= now

    def load(self, entries: Iterable[tuple[bytes, float]]) -> None:
        """Replace the contents with ``(record key, deadline)`` entries."""
        self._at = dict(entries)
        self._heap = [(d, k) for k, d in self._at.items()]
        heapq.heapify(self._heap)

    def apply(self, added: Mapping[bytes, float], removed: Iterable[bytes]) -> None:
        """Record a committed transaction: ``removed`` records first, then
        the deadlines of ``added`` ones."""
        at = self._at
        for key in removed:
            at.pop(key, None)
        for key, deadline in added.items():
            at[key] = deadline
            heapq.heappush(self._heap, (deadline, key))
        if len(self._heap) > 2 * len(at) + 1024:  # mostly stale: records removed before their time
            self.load(list(at.items()))

    def snapshot(self) -> dict[bytes, float]:
        """record key -> deadline, a copy (for checks)."""
        return dict(self._at)

    def due(self, now: float, limit: int) -> list[bytes]:
        """Up to ``limit`` record keys whose deadline is at or before ``now``,
        earliest first. They stay listed until a commit removes them
        (``apply``), so a step that fails finds them again."""
        heap, at = self._heap, self._at
        out: list[tuple[float, bytes]] = []
        while heap and heap[0][0] <= now and len(out) < limit:
            deadline, key = heapq.heappop(heap)
            if at.get(key) == deadline:  # else stale: the record went, or has another deadline
                out.append((deadline, key))
        for entry in out:
            heapq.heappush(heap, entry)
        return [key for _d, key in out]

    def next_due(self) -> float | None:
        """The earliest deadline in the heap (maybe stale), None if empty. Any thread."""
        try:
            return self._heap[0][0]
        except IndexError:  # empty (or emptied by the writer meanwhile)
            return None


class SweepTimer:
    """Every ``interval_s`` seconds, on its own daemon thread: if the earliest
    deadline has passed, ``ask()`` for a sweep (the writer runs it)."""

    def __init__(
        self, deadlines: Deadlines, clock: Clock, ask: Callable[[], None], interval_s: float
    ) -> None:
        self._deadlines = deadlines
        self._clock = clock
        self._ask = ask
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixcache-lmdb-sweep", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(self._interval):
            try:
                due = self._deadlines.next_due()
                if due is not None and due <= self._clock():
                    self._ask()
            except Exception:  # a broken clock must not end the thread silently
                if not failed:
                    log.exception("the retention sweep timer failed (it keeps trying)")
                failed = True

    def close(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class TagBook:
    """namespace tag -> its tag ids, as committed. Writer thread only."""

    __slots__ = ("_of",)

    def __init__(self) -> None:
        self._of: dict[bytes, set[bytes]] = {}

    def has(self, pair: TagPair) -> bool:
        """True if the committed store lists namespace ``pair[1]`` under tag ``pair[0]``."""
        return pair[0] in self._of.get(pair[1], ())

    def tags_of(self, ns_tag: bytes) -> set[bytes]:
        """The tags the committed store lists namespace ``ns_tag`` under (a copy)."""
        return set(self._of.get(ns_tag, ()))

    def apply(self, changes: Mapping[TagPair, bool]) -> None:
        """Record a committed transaction's pairs: True added, False removed."""
        for (tag, ns_tag), present in changes.items():
            tags = self._of.get(ns_tag)
            if present:
                if tags is None:
                    tags = self._of[ns_tag] = set()
                tags.add(tag)
            elif tags is not None:
                tags.discard(tag)
                if not tags:
                    del self._of[ns_tag]

    def pairs(self) -> list[TagPair]:
        """Every committed (tag, namespace tag) pair (for checks)."""
        return [(tag, ns) for ns, tags in self._of.items() for tag in tags]


@dataclass(slots=True)
class TagJob(ForgetJob):
    """Forget every namespace listed under ``tag`` (``ns_tag`` is unused)."""

    tag: bytes = b""  # the tag's id (``tag_key``)


@dataclass(slots=True)
class QuotaJob(DeleteJob):
    """Replace the tenant quotas (tenant -> quota, and the default), then
    evict each tenant's own oldest records down to its new limit (``keys``
    is unused: the writer finds them)."""

    quotas: Mapping[TenantKey, ByteQuota] = field(default_factory=dict)  # tenant -> quota, checked
    default: ByteQuota | None = None  # the quota of tenants not listed; None: unchanged


@dataclass(slots=True)
class SweepJob(DeleteJob):
    """Remove the records past their deadline (every step sweeps first;
    this job only makes a step happen). Result: the records expired."""

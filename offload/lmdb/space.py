"""Room in an LMDB store: growing its memory map, and the disk under it.

The environment is opened with ``writemap=True`` (see offload/lmdb/storage.py):
LMDB writes pages straight into a shared memory map of the data file, which
it creates sparse, at the map's full size. Two limits follow:

* the map: a transaction that needs more pages than the map has fails with
  ``MapFullError``; the writer then evicts, or grows the map with
  ``grow_map``, which must not run while any read transaction is open (the
  map is replaced under it). ``MapGate`` keeps readers out meanwhile.
* the disk: writing into a page of the map that has no disk block yet, on a
  full disk, raises SIGBUS in the writing thread, which kills the process.
  ``disk_room`` says how much a transaction may write without that risk:
  the disk's free space plus the pages LMDB will reuse from its free list
  (those already have blocks), less a reserve of free disk (``DiskReserve``)
  left for LMDB's own B-tree and free-list pages and for other writers.
  ``preallocate`` then gives the file's next pages their blocks up front
  (``posix_fallocate``): a full disk fails there, cleanly, with ENOSPC, and
  LMDB's page faults on those pages find blocks ready (about 30% faster
  than faulting into holes, measured here).

The functions at the end size one write batch before its step runs: the
records it adds per tenant, the keys to keep from eviction, the bytes that go
into the map and the slots the slot file must grow by (offload/lmdb/slots.py).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager

import lmdb

from radixcache.offload.lmdb.quotas import TenantKey
from radixcache.offload.lmdb.slots import ENVELOPE, slot_body
from radixcache.offload.storage import PutJob, WriteJob

log = logging.getLogger(__name__)

DISK_RESERVE_MAX_BYTES = 64 << 20  # the proportional reserve's ceiling
_META_PAGES = 2  # LMDB's two meta pages


class DiskReserve:
    """Free disk a store leaves alone (``StorageConfig.disk_reserve_bytes``
    and ``disk_reserve_ratio``).

    By default it is proportional: ``ratio`` of the file system's size, at
    most 64 MiB (1% of a 100 MiB file system is 1 MiB; a large disk keeps
    64 MiB). ``fixed`` bytes replace that when given. Re-read from the file
    system on every call, so it follows a resized volume.
    """

    def __init__(self, fixed: int | None = None, ratio: float = 0.01) -> None:
        self.fixed = fixed
        self.ratio = ratio

    def bytes(self, path: str) -> int:
        """The reserve, in bytes, on the file system holding ``path``."""
        if self.fixed is not None:
            return self.fixed
        st = os.statvfs(path)
        return min(DISK_RESERVE_MAX_BYTES, int(st.f_blocks * st.f_frsize * self.ratio))

    def describe(self) -> str:
        if self.fixed is not None:
            return f"disk_reserve_bytes={self.fixed}"
        return f"disk_reserve_ratio={self.ratio:g} of the file system, at most 64 MiB"


class MapGate:
    """Read transactions share the gate; growing the LMDB map takes it alone.

    ``Environment.set_mapsize`` replaces the memory map under every open
    transaction, so no reader may be inside one (or copying from its buffers).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0  # read transactions in progress
        self._closed = False  # a resize waits for, or holds, the gate

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._closed = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


def grow_map(env: lmdb.Environment, gate: MapGate) -> int:
    """Grow the map by half (at least 1 MiB), with no reader inside; returns the new size.

    Call from the writer thread, with no write transaction open.
    """
    old = env.info()["map_size"]
    new = -(-(old + max(old // 2, 1 << 20)) // (1 << 20)) << 20
    with gate.exclusive():
        env.set_mapsize(new)
    log.warning("LMDB map of %d B is full; grew it to %d B", old, new)
    return new


def disk_room(
    env: lmdb.Environment, path: str, dbs: Sequence[lmdb._Database], reserve: int
) -> int:
    """Bytes the next write transaction may add without touching a page that
    has no disk block, on the disk as it is now, keeping ``reserve`` bytes of
    it free (may be negative)."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    main = env.stat()
    used = _META_PAGES + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
    with env.begin() as txn:
        for db in dbs:
            st_db = txn.stat(db)
            used += st_db["branch_pages"] + st_db["leaf_pages"] + st_db["overflow_pages"]
    # pages below the high-water mark that no database uses: LMDB's free list
    reusable = max(0, env.info()["last_pgno"] + 1 - used) * main["psize"]
    return free + reusable - reserve


def preallocate(fd: int, env: lmdb.Environment, nbytes: int) -> None:
    """Give disk blocks to the ``nbytes`` (plus slack) of the data file past
    LMDB's last used page, where a transaction that cannot reuse free pages
    will write. Raises OSError (ENOSPC) when the disk cannot hold them."""
    info = env.info()
    psize = env.stat()["psize"]
    start = (info["last_pgno"] + 1) * psize
    length = min(nbytes + nbytes // 64 + (1 << 20), info["map_size"] - start)
    if length > 0:
        os.posix_fallocate(fd, start, length)


# -- what one write batch adds (the writer sizes a step with these) ------------------
def lapsed(job: PutJob, now: float) -> bool:
    """True if the put's retention deadline is already past: it writes nothing."""
    return job.meta is not None and job.meta.expires_at is not None and job.meta.expires_at <= now


def put_bytes(batch: Iterable[WriteJob]) -> int:
    """Bytes of every record the batch's puts name (stored or not)."""
    return sum(
        job.record_bytes(i) for job in batch if isinstance(job, PutJob) for i in range(len(job.keys))
    )


def put_keys(batch: Iterable[WriteJob]) -> set[bytes]:
    """The record keys the batch's puts name."""
    return {rkey for job in batch if isinstance(job, PutJob) for rkey in job.keys}


def incoming_by_tenant(
    batch: Iterable[WriteJob],
    stored: Container[bytes],
    tenant_of: Callable[[PutJob], TenantKey],
    gone: Collection[bytes] = (),
) -> dict[TenantKey, int]:
    """Bytes of the records a batch would add (keys not in ``stored``, or in
    ``gone``: removed first), per tenant (``tenant_of`` a put job)."""
    seen: set[bytes] = set()
    totals: dict[TenantKey, int] = {}
    for job in batch:
        if isinstance(job, PutJob):
            tenant = tenant_of(job)
            for i, rkey in enumerate(job.keys):
                if (rkey not in stored or rkey in gone) and rkey not in seen:
                    seen.add(rkey)
                    totals[tenant] = totals.get(tenant, 0) + job.record_bytes(i)
    return totals


def slot_demand(
    batch: Iterable[WriteJob], stored: Container[bytes], slot_bytes: int
) -> tuple[int, int]:
    """(bytes kept out of LMDB's map, records) for the new records of
    ``batch`` (keys not in ``stored``) whose KV bytes go into slots of
    ``slot_bytes``: each puts only its lead and an envelope into the map
    (offload/lmdb/slots.py)."""
    seen: set[bytes] = set()
    kept_out = 0
    for job in batch:
        if isinstance(job, PutJob) and slot_body(job) <= slot_bytes:
            new = {k for k in job.keys if k not in stored and k not in seen}
            seen |= new
            kept_out += len(new) * (slot_body(job) - ENVELOPE.size)
    return kept_out, len(seen)

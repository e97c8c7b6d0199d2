"""LmdbStorage: the storage tier as one LMDB environment on local disk.

Layout of the environment (one directory, three named databases)::

    pages : record key (8 B fingerprint + page key) -> record value   (format: offload/record.py)
    ns    : namespace tag (16 B) -> record keys  (dupsort: the namespace index)
    meta  : b"fingerprint" -> fingerprint text   (of the last process to open it)
            b"tick" -> counter                   (commits that only advance the txn id)

plus ``radixcache.lock``, an advisory lock held by the one process that has
the store open: the index and the capacity accounting live in that process.

Threads::

    owner thread  --get-->  reader pool (num_readers)  read txn, verify, copy
                  --put/delete/forget-->  queue  -->  writer thread
                                                       batches jobs into one
                                                       write txn per batch

LMDB allows one writer at a time, so a single writer thread drains the queue
and merges whatever is waiting (up to the batch limits) into one transaction:
one commit, one sync, for many pages. Readers never wait for it (MVCC).

Capacity: the values' bytes are kept at or below ``capacity_bytes`` by evicting
least recently used records in the same transaction that adds new ones (see
offload/lmdb_index.py for how recency is tracked). The LMDB map is larger than
that (B-tree pages, copy-on-write and free-list headroom); if it still fills
up (``MapFullError``), the writer evicts more and retries, and grows the map
(50%) when the map is too full even to delete.

Write path: the environment is opened with ``writemap=True``, so a put copies
the record once, straight into the memory map, and a commit flushes the map
(msync) rather than writing malloc'd copies of every page (measured here at
2 MiB pages: 0.21 s instead of 0.31 s for 256 MiB, against 0.135 s for an
fsync'd sequential file). The data file then has the map's size as its
apparent size (a sparse file; ``du`` shows the real use), and the writer gives
the pages it is about to fill their disk blocks first, so that a full disk is
an error on the ticket rather than a SIGBUS (offload/lmdb_space.py). Every
process that opens the store must use the same setting (LMDB's rule), which
this class does.

Durability (``StorageConfig.durability``), from LMDB's documented flags:

* ``"safe"``: ``sync=True, metasync=True``: each commit flushes the data and
  then the meta page. A committed transaction survives a process kill and a
  power loss; the store is never corrupted.
* ``"fast"``: ``sync=True, metasync=False``: one flush per commit instead of
  two. A process kill loses nothing committed; a system crash or power loss
  may undo the last committed transaction, but never corrupts the store
  (LMDB keeps atomicity and consistency). ``sync=False`` is not offered: LMDB
  documents that a system crash can then corrupt the store unless the file
  system preserves write order.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import lmdb
import numpy as np

from radixcache.events.types import DISK, Medium
from radixcache.offload import record as rec
from radixcache.offload.lmdb_index import RecencyIndex
from radixcache.offload.lmdb_reader import LmdbReader
from radixcache.offload.lmdb_space import DiskReserve, MapGate, grow_map
from radixcache.offload.lmdb_writer import DeleteJob, ForgetJob, LmdbWriter, PutJob
from radixcache.offload.record import RecordMeta
from radixcache.offload.storage import (
    MAX_KEY_BYTES,
    Counters,
    HostPages,
    ModelFingerprint,
    PageBuffer,
    PutMeta,
    StorageOpenError,
    StorageStats,
    TokenPages,
    check_pages,
)
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.ticket import FutureTicket, Ticket

log = logging.getLogger(__name__)

DURABILITY_MODES = ("safe", "fast")
OPEN_ERROR_MODES = ("recover", "strict")  # see offload/lmdb_open.py
_MAP_HEADROOM_BYTES = 64 << 20  # LMDB map beyond 2x capacity: meta, tree, free list


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Configuration of the LMDB storage tier. Validated on construction."""

    path: str | os.PathLike[str] = "./radixcache-data"  # directory, created if missing
    capacity_bytes: int = 64 << 30  # limit on the stored values' bytes
    durability: str = "safe"  # "safe" or "fast" (see the module docstring)
    num_readers: int = 2  # reader threads (concurrent get() calls)
    max_batch_pages: int = 256  # write jobs merged into one txn up to this many pages
    max_batch_bytes: int = 256 << 20  # ... and up to this many record bytes
    map_size_bytes: int | None = None  # LMDB map size; None: 2 x capacity + 64 MiB
    # A store that cannot be opened: "recover" starts anyway (a damaged store is
    # moved aside and a fresh one opened, or the tier is disabled); "strict"
    # raises StorageOpenError instead (offload/lmdb_open.py).
    on_open_error: str = "recover"
    # Free disk the writer leaves alone (offload/lmdb_space.py): a fixed number
    # of bytes, or None for disk_reserve_ratio of the file system, at most 64 MiB.
    disk_reserve_bytes: int | None = None
    disk_reserve_ratio: float = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise ValueError(f"path must be a non-empty str or path, got {self.path!r}")
        _positive("capacity_bytes", self.capacity_bytes)
        if self.durability not in DURABILITY_MODES:
            raise ValueError(
                f"durability must be one of {DURABILITY_MODES}, got {self.durability!r}"
            )
        _positive("num_readers", self.num_readers)
        _positive("max_batch_pages", self.max_batch_pages)
        _positive("max_batch_bytes", self.max_batch_bytes)
        if self.map_size_bytes is not None:
            _positive("map_size_bytes", self.map_size_bytes)
        if self.on_open_error not in OPEN_ERROR_MODES:
            raise ValueError(
                f"on_open_error must be one of {OPEN_ERROR_MODES}, got {self.on_open_error!r}"
            )
        if self.disk_reserve_bytes is not None and (
            not isinstance(self.disk_reserve_bytes, int)
            or isinstance(self.disk_reserve_bytes, bool)
            or self.disk_reserve_bytes < 0
        ):
            raise ValueError(
                f"disk_reserve_bytes must be a non-negative int or None, "
                f"got {self.disk_reserve_bytes!r}"
            )
        if not isinstance(self.disk_reserve_ratio, (int, float)) or not (
            0 <= self.disk_reserve_ratio < 0.5
        ):
            raise ValueError(
                f"disk_reserve_ratio must lie in [0, 0.5), got {self.disk_reserve_ratio!r}"
            )

    @property
    def map_size(self) -> int:
        """The LMDB map size, rounded up to a whole MiB."""
        size = self.map_size_bytes or 2 * self.capacity_bytes + _MAP_HEADROOM_BYTES
        return -(-size // (1 << 20)) << 20


class LmdbStorage:
    """The ``Storage`` protocol on one LMDB environment (see the module docstring).

    Public methods are called by the owner thread. One process owns a store
    directory at a time (a second one gets ``StorageOpenError``): the index and
    the capacity accounting live in this object. Another process may open the
    store once this one closed it, or died. Tensor-parallel ranks use one
    directory each.
    """

    medium: Medium = DISK  # this engine's own store: it announces what it stores and reads

    def __init__(self, config: StorageConfig, spec: KVSpec, fingerprint: ModelFingerprint) -> None:
        if fingerprint.spec != spec.describe():
            raise ValueError(
                f"fingerprint spec {fingerprint.spec!r} does not describe the KV spec "
                f"{spec.describe()!r}"
            )
        self.config = config
        self.spec = spec
        self.fingerprint = fingerprint
        self.path = os.path.abspath(os.fspath(config.path))
        self._prefix = fingerprint.digest()  # record-key prefix (invariant 8)
        self._record_size = rec.page_record_size(spec.page_size, spec.page_bytes)
        self._lock_fd = self._lock_directory()
        try:
            self._env = self._open_env()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._index = RecencyIndex()
        self._counters = Counters()
        self._gate = MapGate()  # read txns vs. the writer growing the map
        try:
            self._pages = self._env.open_db(b"pages")
            self._ns = self._env.open_db(b"ns", dupsort=True)
            self._meta = self._env.open_db(b"meta")
            try:
                next_seq = self._load()
            except lmdb.MapFullError:  # reopened with a smaller map than the data needs
                grow_map(self._env, self._gate)
                next_seq = self._load()
        except lmdb.Error as exc:
            self._env.close()
            os.close(self._lock_fd)
            raise StorageOpenError(f"cannot open the LMDB store in {self.path!r}: {exc}") from exc
        except BaseException:
            self._env.close()
            os.close(self._lock_fd)
            raise
        self._writer = LmdbWriter(
            env=self._env,
            path=self.path,
            pages=self._pages,
            ns=self._ns,
            meta=self._meta,
            gate=self._gate,
            index=self._index,
            counters=self._counters,
            prefix=self._prefix,
            capacity_bytes=config.capacity_bytes,
            batch_pages=max(
                1, min(config.max_batch_pages, config.max_batch_bytes // self._record_size)
            ),
            next_seq=next_seq,
            disk_reserve=DiskReserve(config.disk_reserve_bytes, config.disk_reserve_ratio),
        )
        self._reader = LmdbReader(
            env=self._env,
            path=self.path,
            pages=self._pages,
            gate=self._gate,
            index=self._index,
            counters=self._counters,
            writer=self._writer,
            num_readers=config.num_readers,
        )
        self._closed = False

    # -- open ---------------------------------------------------------------
    def _lock_directory(self) -> int:
        """Create the directory if needed and take its owner lock; returns the lock's fd."""
        path = self.path
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass  # a directory LMDB cannot create its files in fails here, by name
            fd = os.open(os.path.join(path, "radixcache.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageOpenError(
                exc.errno, f"storage directory {path!r} is not writable: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StorageOpenError(
                exc.errno,
                f"storage directory {path!r} is already open (in this or another process)",
            ) from exc
        return fd

    def _open_env(self) -> lmdb.Environment:
        path = self.path
        try:
            return lmdb.open(
                path,
                map_size=self.config.map_size,
                max_dbs=3,
                sync=True,
                metasync=self.config.durability == "safe",
                writemap=True,  # see "Write path" above
                max_spare_txns=self.config.num_readers,
            )
        except lmdb.Error as exc:
            raise StorageOpenError(f"cannot open the LMDB store in {path!r}: {exc}") from exc

    def _load(self) -> int:
        """Check the fingerprint and rebuild the index; returns the next write seq."""
        mine = self.fingerprint.describe().encode()
        entries: list[tuple[int, bytes, int]] = []
        foreign = 0
        with self._env.begin(write=True, buffers=True) as txn:
            seen = txn.get(b"fingerprint", db=self._meta)
            if seen is not None and bytes(seen) != mine:
                log.warning(
                    "storage %s was last written for %s; this process is %s: "
                    "records of another fingerprint never hit and age out",
                    self.path,
                    bytes(seen).decode(errors="replace"),
                    mine.decode(),
                )
            txn.put(b"fingerprint", mine, db=self._meta)
            for key, value in txn.cursor(db=self._pages):
                seq = rec.read_seq(value)
                entries.append((-1 if seq is None else seq, bytes(key), len(value)))
                foreign += not bytes(key).startswith(self._prefix)
        self._index.load(entries)
        if foreign:
            log.info(
                "storage %s: %d of %d records belong to another fingerprint",
                self.path,
                foreign,
                len(entries),
            )
        return max((seq for seq, _k, _s in entries), default=-1) + 1

    # -- Storage protocol ---------------------------------------------------
    def stored_keys(self) -> list[bytes]:
        """Page keys of every committed record of this fingerprint (a snapshot;
        O(records), for checks and tools)."""
        n = len(self._prefix)
        return [k[n:] for k in self._index.keys() if k[:n] == self._prefix]

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        prefix, index = self._prefix, self._index
        for i, key in enumerate(keys):
            if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
                raise ValueError(f"page keys are 1 to {MAX_KEY_BYTES} bytes; key {i} is {key!r}")
            if prefix + key not in index:
                return i
        return len(keys)

    def get(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes | None = None,
    ) -> Ticket:
        self._check_open()
        rkeys, toks, pages = self._checked(keys, tokens, host, host_pages)
        tag = None if namespace is None else self._tag(namespace)
        ticket = FutureTicket()
        if not rkeys:
            ticket.finish(0)
            return ticket
        self._reader.submit(rkeys, toks, host, pages, tag, ticket)
        return ticket

    def put(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes,
        meta: PutMeta | None = None,
    ) -> Ticket:
        self._check_open()
        tag = self._tag(namespace)
        rkeys, toks, pages = self._checked(keys, tokens, host, host_pages)
        if meta is not None and len(meta.block_ids) != len(rkeys):
            raise ValueError(f"meta has {len(meta.block_ids)} block ids for {len(rkeys)} keys")
        ticket = FutureTicket()
        self._writer.submit(PutJob(rkeys, toks, host, pages, tag, ticket, meta))
        return ticket

    def scan(self) -> Iterator[RecordMeta]:
        self._check_open()
        cut = len(self._prefix)
        with self._gate.reading(), self._env.begin(db=self._pages, buffers=True) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(self._prefix):
                return
            for key, value in cursor:
                if bytes(key[:cut]) != self._prefix:
                    return
                meta = rec.read_meta(value)
                if meta is not None and meta.key == bytes(key):
                    yield dataclasses.replace(meta, key=meta.key[cut:])

    def read_tokens(self, keys: Sequence[bytes]) -> list[np.ndarray | None]:
        """The token ids stored with each page key (None: not stored, raw or
        not a v2 record); for events about survivors. Owner thread."""
        self._check_open()
        out: list[np.ndarray | None] = []
        with self._gate.reading(), self._env.begin(db=self._pages, buffers=True) as txn:
            for full in self._record_keys(keys):
                value = txn.get(full)
                meta = None if value is None else rec.read_meta(value)
                ok = meta is not None and meta.key == full and not meta.raw
                out.append(rec.read_tokens(value) if ok and value is not None else None)
        return out

    def _tag(self, namespace: bytes) -> bytes:
        if not isinstance(namespace, bytes):
            raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
        return rec.namespace_tag(self._prefix, namespace)

    def delete(self, keys: Sequence[bytes]) -> Ticket:
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(DeleteJob(self._record_keys(keys), ticket))
        return ticket

    def forget_namespace(self, namespace: bytes) -> Ticket:
        self._check_open()
        if not isinstance(namespace, bytes):
            raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
        ticket = FutureTicket()
        self._writer.submit(ForgetJob(rec.namespace_tag(self._prefix, namespace), ticket))
        return ticket

    def take_removed(self) -> list[bytes]:
        return self._writer.take_removed()

    def take_written(self) -> list[bytes]:
        return []  # DISK: the engine announces its pages from the put tickets

    def stats(self) -> StorageStats:
        return self._counters.snapshot(
            records=len(self._index),
            stored_bytes=self._index.nbytes,
            capacity_bytes=self.config.capacity_bytes,
            queued_writes=self._writer.queued,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader.close()  # first: a read may still queue a corrupt record's deletion
        self._writer.close()  # commits everything queued, then stops
        self._env.close()
        os.close(self._lock_fd)  # releases the owner lock

    def __enter__(self) -> LmdbStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_integrity(self) -> None:
        """Verify the index against the store (O(records); for tests)."""
        self._index.check_integrity()
        with self._env.begin(buffers=True) as txn:
            stored = {bytes(k): len(v) for k, v in txn.cursor(db=self._pages)}
        assert len(stored) == len(self._index), (
            f"{len(stored)} records, index has {len(self._index)}"
        )
        total = sum(stored.values())
        assert total == self._index.nbytes, (
            f"records hold {total} B, index says {self._index.nbytes}"
        )
        assert all(k in self._index for k in stored), "a stored record is missing from the index"

    # -- helpers --------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"storage {self.path!r} is closed")

    def _record_keys(self, keys: Sequence[bytes]) -> list[bytes]:
        prefix = self._prefix
        out = []
        for i, key in enumerate(keys):
            if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
                raise ValueError(f"page keys are 1 to {MAX_KEY_BYTES} bytes; key {i} is {key!r}")
            out.append(prefix + key)
        return out

    def _checked(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
    ) -> tuple[list[bytes], TokenPages | None, HostPages]:
        """Validate a get/put call; returns record keys and private copies."""
        rkeys = self._record_keys(keys)
        toks, pages = check_pages(len(rkeys), tokens, host, host_pages, self.spec, "storage")
        return rkeys, toks, pages

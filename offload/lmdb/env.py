"""An open LMDB store directory: its owner lock, environment, databases and index.

``LmdbEnv`` opens what ``LmdbStorage`` stands on, in order: it creates the
directory if missing and takes its owner lock (``radixcache.lock``: one
process has a store open at a time), opens the environment (``writemap``,
durability flags from the config) and its six named databases, checks the
fingerprint the store was last written for (records of another one never hit
and age out), loads the namespace tag -> tenant map (offload/lmdb/txn.py)
(tenant ids: offload/lmdb/quotas.py) and rebuilds the recency index from the records' write sequence numbers,
each record under its tenant, and loads the records' retention deadlines and
the namespaces' tags (offload/lmdb/retention.py), and opens the slot file
(offload/lmdb/slots.py) with its free slots derived from the records. The
reader, the writer and the storage share it; ``close`` gives the environment,
the slot file and the lock back (after they stopped).

The owner lock is an ``flock`` on ``radixcache.lock``, which belongs to the
open file description: a child that ``fork()`` made shares it, and the lock
would outlive the parent's ``close`` for as long as the child keeps its copy
of the descriptor, so the parent could not reopen its own store. The
descriptor is close-on-exec (an exec'd child never has it), and a forked
child closes its copy at once (``radixcache.transfer.forks``), never
unlocking it: the lock stays the parent's, and goes with the parent's
``close``.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import tempfile
import time

import lmdb

from radixcache.offload.lmdb.config import StorageConfig
from radixcache.offload.lmdb.index import RecencyIndex
from radixcache.offload.lmdb.quotas import SECRET_BYTES, TenantKey
from radixcache.offload.lmdb.retention import Deadlines, TagBook, decode_deadline
from radixcache.offload.lmdb.slots import META_KEY, SlotFile, unwrap
from radixcache.offload.lmdb.space import MapGate, grow_map
from radixcache.offload.storage import ModelFingerprint, StorageOpenError
from radixcache.offload.storage import record as rec
from radixcache.transfer.forks import on_fork_in_child

LOCK_WAIT_S = 1.0  # how long an open waits for a lock a just-forked child still shares

log = logging.getLogger(__name__)


class LmdbEnv:
    """One store directory, opened (see the module docstring). Raises
    ``StorageOpenError`` when it cannot be opened, holding nothing then."""

    def __init__(
        self, config: StorageConfig, fingerprint: ModelFingerprint, slot_bytes: int | None = None
    ) -> None:
        """``slot_bytes``: the slot size a new slot file gets (None: this run
        writes no record into slots; an existing slot file is still read)."""
        self.path = os.path.abspath(os.fspath(config.path))
        self.lock_fd = self._lock_directory()
        on_fork_in_child(self, _drop_lock_in_child)
        try:
            self.env = self._open_env(config)
        except BaseException:
            os.close(self.lock_fd)
            raise
        self.index = RecencyIndex()  # record keys, sizes, least recently used first
        self.gate = MapGate()  # read txns vs. the writer growing the map
        self.tag_tenant: dict[bytes, TenantKey] = {}  # namespace tag -> tenant id (tenants db)
        self.tenant_secret = b""  # the key of tenant ids (offload/lmdb/quotas.py), from meta
        self.deadlines = Deadlines()  # record key -> retention deadline (expiry db)
        self.tag_book = TagBook()  # namespace tag -> its tags (tags db)
        self.slots: SlotFile | None = None  # the records' KV bytes outside the map
        self._slot_bytes = slot_bytes
        self._used_slots: list[int] = []  # slots the records name (at open)
        try:
            self.pages = self.env.open_db(b"pages")  # record key -> record
            self.ns = self.env.open_db(b"ns", dupsort=True)  # namespace tag -> record keys
            self.meta = self.env.open_db(b"meta")  # fingerprint, tick
            self.tenants = self.env.open_db(b"tenants")  # namespace tag -> tenant id
            self.expiry = self.env.open_db(b"expiry")  # record key -> retention deadline
            self.tags = self.env.open_db(b"tags", dupsort=True)  # tag -> namespace tags
            try:
                self.next_seq = self._load(fingerprint)  # write seq of the next record
            except lmdb.MapFullError:  # reopened with a smaller map than the data needs
                grow_map(self.env, self.gate)
                self.next_seq = self._load(fingerprint)
            self._open_slots()
        except lmdb.Error as exc:
            self.close()
            raise StorageOpenError(f"cannot open the LMDB store in {self.path!r}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    @property
    def dbs(self) -> tuple[lmdb._Database, ...]:
        """Every named database (for page accounting)."""
        return (self.pages, self.ns, self.meta, self.tenants, self.expiry, self.tags)

    @property
    def writes_slots(self) -> bool:
        """New records keep their KV bytes in the slot file (when they fit)."""
        return self.slots is not None and self._slot_bytes is not None

    def disk_bytes(self) -> int:
        """Bytes the store's files take on disk: the allocated blocks of
        every file in its directory (LMDB's map and lock files, the slot
        file); a file that vanishes meanwhile counts nothing, and a
        directory that is gone (removed while open) counts 0."""
        total = 0
        try:
            with os.scandir(self.path) as entries:
                for entry in entries:
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        pass
        except OSError:
            return 0
        return total

    def close(self) -> None:
        """Close the environment and give the owner lock back (in a forked
        child: nothing, both are the parent's)."""
        if self.lock_fd < 0:
            return
        if self.slots is not None:
            self.slots.close()
        self.env.close()
        os.close(self.lock_fd)
        self.lock_fd = -1

    def _lock_directory(self) -> int:
        """Create the directory if needed and take its owner lock; returns the lock's fd."""
        path = self.path
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass  # a directory LMDB cannot create its files in fails here, by name
            lock = os.path.join(path, "radixcache.lock")
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageOpenError(
                exc.errno, f"storage directory {path!r} is not writable: {exc.strerror or exc}"
            ) from exc
        # A child forked a moment ago shares the lock until its fork handler
        # (``_drop_lock_in_child``) closes its copy: a close-and-reopen in the
        # parent right after a fork waits that long, not longer.
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as failed:
                if failed.errno == errno.EWOULDBLOCK and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                os.close(fd)
                raise StorageOpenError(
                    failed.errno,
                    f"storage directory {path!r} is already open (in this or another process)",
                ) from failed

    def _open_env(self, config: StorageConfig) -> lmdb.Environment:
        path = self.path
        try:
            return lmdb.open(
                path,
                map_size=config.map_size,
                max_dbs=8,
                sync=True,
                metasync=config.durability == "safe",
                writemap=True,  # see "Write path" in offload/lmdb/storage.py
                max_spare_txns=config.num_readers,
            )
        except lmdb.Error as exc:
            raise StorageOpenError(f"cannot open the LMDB store in {path!r}: {exc}") from exc

    def _load(self, fingerprint: ModelFingerprint) -> int:
        """Check the fingerprint, load the tenant map, rebuild the index, load
        the deadlines and tags; returns the next write seq."""
        mine = fingerprint.describe().encode()
        prefix = fingerprint.digest()
        entries: list[tuple[int, bytes, int, TenantKey]] = []
        foreign = 0
        with self.env.begin(write=True, buffers=True) as txn:
            seen = txn.get(b"fingerprint", db=self.meta)
            if seen is not None and bytes(seen) != mine:
                log.warning(
                    "storage %s was last written for %s; this process is %s: "
                    "records of another fingerprint never hit and age out",
                    self.path,
                    bytes(seen).decode(errors="replace"),
                    mine.decode(),
                )
            txn.put(b"fingerprint", mine, db=self.meta)
            stored = txn.get(b"tenant-secret", db=self.meta)
            secret = b"" if stored is None else bytes(stored)
            if len(secret) != SECRET_BYTES:
                secret = os.urandom(SECRET_BYTES)  # a new store (or one from before ids)
                txn.put(b"tenant-secret", secret, db=self.meta)
            self.tenant_secret = secret
            tags = self.tag_tenant
            for tag_key, tid in txn.cursor(db=self.tenants):
                tags[bytes(tag_key)] = decode_tenant(tid)
            used = self._used_slots
            for key, value in txn.cursor(db=self.pages):
                parts = unwrap(value)  # None: the record inline; else its lead, slot, tail
                head, size = value, len(value)
                if parts is not None:
                    head, size = parts[0], len(parts[0]) + parts[2]
                    used.append(parts[1])
                seq = rec.read_seq(head)
                ns_tag = rec.read_namespace_tag(head)
                owner = None if ns_tag is None else tags.get(ns_tag)
                entries.append((-1 if seq is None else seq, bytes(key), size, owner))
                foreign += not bytes(key).startswith(prefix)
            self._load_retention(txn, {key for _seq, key, _size, _t in entries})
        self.index.load(entries)
        if foreign:
            log.info(
                "storage %s: %d of %d records belong to another fingerprint",
                self.path,
                foreign,
                len(entries),
            )
        return max((seq for seq, _k, _s, _t in entries), default=-1) + 1

    def _open_slots(self) -> None:
        """Open the slot file when this run writes slots or records name
        some; its slot size is the one it was created with (meta)."""
        with self.env.begin(write=True, db=self.meta) as txn:
            kept = txn.get(META_KEY)
            if kept is None and self._slot_bytes is None and not self._used_slots:
                return
            size = self._slot_bytes if kept is None else int.from_bytes(kept, "little")
            if size is None or size <= 0:
                raise StorageOpenError(f"the slot size kept in {self.path!r} is not valid: {size}")
            if kept is None:
                txn.put(META_KEY, size.to_bytes(8, "little"))
        try:
            self.slots = SlotFile(self.path, size)
        except OSError as exc:
            raise StorageOpenError(
                exc.errno, f"cannot open the slot file of {self.path!r}: {exc.strerror or exc}"
            ) from exc
        self.slots.load(self._used_slots)
        self._used_slots = []

    def _load_retention(self, txn: lmdb.Transaction, stored: set[bytes]) -> None:
        """Load the records' deadlines and the namespaces' tags. A deadline
        of a record not stored, or one this code did not write, is deleted
        (a put of that key must not inherit it)."""
        deadlines: list[tuple[bytes, float]] = []
        stale: list[bytes] = []
        for key, value in txn.cursor(db=self.expiry):
            rkey, deadline = bytes(key), decode_deadline(value)
            if rkey in stored and deadline is not None:
                deadlines.append((rkey, deadline))
            else:
                stale.append(rkey)
        for rkey in stale:
            txn.delete(rkey, db=self.expiry)
        self.deadlines.load(deadlines)
        self.tag_book.apply({(bytes(t), bytes(ns)): True for t, ns in txn.cursor(db=self.tags)})


def encode_tenant(tenant: TenantKey) -> bytes:
    """A tenant id as the ``tenants`` database holds it (None and b"" differ)."""
    return b"\x00" if tenant is None else b"\x01" + tenant


def decode_tenant(value: memoryview | bytes) -> TenantKey:
    """The tenant ``encode_tenant`` wrote (a value it did not write: None)."""
    raw = bytes(value)
    return raw[1:] if raw[:1] == b"\x01" else None


def _drop_lock_in_child(store: LmdbEnv) -> None:
    """In a forked child: close the child's copy of the lock descriptor, so
    that the lock goes when the parent closes (never ``LOCK_UN``: that would
    unlock the parent's store)."""
    if store.lock_fd >= 0:
        os.close(store.lock_fd)
        store.lock_fd = -1

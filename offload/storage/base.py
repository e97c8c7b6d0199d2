"""``StorageBase``: the front of the ``Storage`` contract, the same for every backend.

The owner thread calls it; it validates every call (``checks.py``), binds
page keys to the fingerprint (record keys: digest + page key, invariant 8)
and namespaces to it (namespace tags), turns each call into a job
(``jobs.py``) with a ticket, and hands the job to the backend's reader pool
(``reader.py``) or writer thread (``writer.py``). It owns nothing that
runs: the reader and the writer own their threads, the ``RemovalLog`` the
removal order (``removals.py``)::

    get     --> ReadJob   --> PageReader (the backend's: _values)
    put     --> PutJob    --+
    delete  --> DeleteJob --+--> JobWriter (the backend's: _run_batch)
    forget  --> ForgetJob --+
    take_removed / take_written --> RemovalLog
    close: readers first (a read may still queue a corrupt record's
           deletion), then the writer (runs what is queued), then the
           backend's own resources (_release)

In a child forked from the process that opened it, the reader and writer
threads do not exist: every call that would hand them work (or read the
store) raises RuntimeError naming the store and the processes, instead of
returning a ticket nothing finishes; ``close`` there does nothing (the
threads, the environment and the lock are the parent's).

What a backend supplies (its transport): in ``__init__``, after
``super().__init__``, its ``_reader``, ``_writer`` and ``_removals``; then
``longest_prefix``, ``scan``, ``_sizes`` (for ``stats``), ``_release`` and
``where`` (how messages name the store).

Encryption at rest (offload/storage/crypt/): a backend passes its config's
key settings (``KeySource``) to ``super().__init__``, which loads the keys
and opens the store's ``RecordCodec``; ``get`` and ``put`` hand each job the
framing of its tenant (``tenant``: the namespace's cache salt, None for the
default tenant). Records are framed and verified through the job's framing,
so a backend reads and writes sealed records without knowing it; ``scan``
reads headers through ``self.codec`` (``read_meta``, ``read_tokens``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from radixcache.events.types import Medium
from radixcache.offload.storage import record
from radixcache.offload.storage.checks import (
    check_namespace,
    check_pages,
    check_retention,
    check_tenant,
    record_keys,
)
from radixcache.offload.storage.contract import (
    HostPages,
    ModelFingerprint,
    PageBuffer,
    PutMeta,
    TokenPages,
)
from radixcache.offload.storage.crypt import NO_KEYS, KeySource, RecordCodec, open_codec
from radixcache.offload.storage.jobs import DeleteJob, ForgetJob, PutJob, ReadJob
from radixcache.offload.storage.reader import PageReader
from radixcache.offload.storage.record import RecordMeta
from radixcache.offload.storage.removals import RemovalLog
from radixcache.offload.storage.stats import Counters, StorageStats
from radixcache.offload.storage.writer import JobWriter
from radixcache.transfer.forks import forked_message, on_fork_in_child
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.ticket import FutureTicket, Ticket

_S = TypeVar("_S", bound="StorageBase")


@dataclass(frozen=True, slots=True)
class StoreSizes:
    """What a backend alone knows of its size, for ``stats()``."""

    records: int  # records in the store now
    stored_bytes: int  # bytes they take
    capacity_bytes: int  # the limit on stored_bytes (0: none or unknown)
    disk_bytes: int = 0  # bytes the store's local files take on disk (0: not a local store)
    free_disk_bytes: int = 0  # of disk_bytes, bytes no record holds, kept for reuse


class StorageBase:
    """The ``Storage`` protocol's calls, shared by every backend (see the module docstring).

    Public methods are called by the owner thread.
    """

    medium: Medium  # the event medium of its pages (a backend's class attribute)
    pages_name = "storage"  # what messages call its pages ("storage", "pool")
    _reader: PageReader  # set by the backend
    _writer: JobWriter  # set by the backend
    _removals: RemovalLog  # set by the backend

    def __init__(
        self, spec: KVSpec, fingerprint: ModelFingerprint, keys: KeySource = NO_KEYS
    ) -> None:
        """``keys``: where the master keys come from (none: records in the
        clear). Raises ``KeyLoadError`` (a ValueError) when they cannot be
        loaded: a store asked to encrypt never runs without its keys."""
        if fingerprint.spec != spec.describe():
            raise ValueError(
                f"fingerprint spec {fingerprint.spec!r} does not describe the KV spec "
                f"{spec.describe()!r}"
            )
        self.spec = spec
        self.fingerprint = fingerprint
        self._digest = fingerprint.digest()  # record-key prefix (invariant 8)
        self.codec: RecordCodec = open_codec(keys, fingerprint)  # clear or sealed records
        self._counters = Counters()
        self._closed = False
        self._close_lock = threading.Lock()
        self._pid = os.getpid()  # the process whose threads do the work
        self._forked = False  # set in a forked child
        on_fork_in_child(self, _forked)

    # -- what a backend supplies ------------------------------------------------
    @property
    def where(self) -> str:
        """The store, as messages name it (e.g. ``storage '/var/cache/rx'``)."""
        raise NotImplementedError

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        raise NotImplementedError

    def scan(self) -> Iterator[RecordMeta]:
        raise NotImplementedError

    def _sizes(self) -> StoreSizes:
        """The store's size figures now (records, bytes, capacity)."""
        raise NotImplementedError

    def _release(self) -> None:
        """Release the backend's own resources; the reader and writer are closed."""

    # -- keys ---------------------------------------------------------------------
    def record_keys(self, keys: Sequence[bytes]) -> list[bytes]:
        """The record keys of page keys (validated: bytes of 1 to 256)."""
        return record_keys(self._digest, keys)

    def _checked(
        self, keys: Sequence[bytes], tokens: TokenPages | None, host: PageBuffer, pages: HostPages
    ) -> tuple[list[bytes], TokenPages | None, HostPages]:
        """Validate a get/put call; returns its record keys and private copies."""
        rkeys = self.record_keys(keys)
        toks, pages = check_pages(len(rkeys), tokens, host, pages, self.spec, self.pages_name)
        return rkeys, toks, pages

    def _tag(self, namespace: bytes) -> bytes:
        """The namespace tag of ``namespace`` (bound to the fingerprint)."""
        return record.namespace_tag(self._digest, check_namespace(namespace))

    # -- Storage protocol -----------------------------------------------------------
    def get(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes | None = None,
        tenant: bytes | None = None,
    ) -> Ticket:
        self._check_open()
        rkeys, toks, pages = self._checked(keys, tokens, host, host_pages)
        tag = None if namespace is None else self._tag(namespace)
        framing = self.codec.framing(check_tenant(tenant))
        ticket = self._reader.ticket()
        if not rkeys:
            ticket.finish(0)
            return ticket
        self._reader.submit(ReadJob(rkeys, toks, host, pages, tag, ticket, framing=framing))
        return ticket

    def put(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes,
        meta: PutMeta | None = None,
        tenant: bytes | None = None,
    ) -> Ticket:
        self._check_open()
        check_retention(meta)  # a bad deadline or tag is refused here, not on the writer
        tag = self._tag(namespace)
        rkeys, toks, pages = self._checked(keys, tokens, host, host_pages)
        if meta is not None and len(meta.block_ids) != len(rkeys):
            raise ValueError(f"meta has {len(meta.block_ids)} block ids for {len(rkeys)} keys")
        tenant = check_tenant(tenant)
        framing = self.codec.framing(tenant)
        ticket = FutureTicket()
        if not rkeys:
            ticket.finish(0)
            return ticket
        self._writer.submit(
            PutJob(rkeys, toks, host, pages, tag, ticket, meta, framing=framing, tenant=tenant)
        )
        return ticket

    def delete(self, keys: Sequence[bytes]) -> Ticket:
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(DeleteJob(self.record_keys(keys), ticket))
        return ticket

    def forget_namespace(self, namespace: bytes) -> Ticket:
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(ForgetJob(self._tag(namespace), ticket))
        return ticket

    def take_removed(self) -> list[bytes]:
        return self._removals.take()

    def take_written(self) -> list[bytes]:
        return self._removals.take_written()

    def stats(self) -> StorageStats:
        sizes = self._sizes()
        return self._counters.snapshot(
            records=sizes.records,
            stored_bytes=sizes.stored_bytes,
            capacity_bytes=sizes.capacity_bytes,
            queued_writes=self._writer.queued,
            disk_bytes=sizes.disk_bytes,
            free_disk_bytes=sizes.free_disk_bytes,
        )

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._forked:
            return  # the threads, the store and its lock are the parent's
        self._reader.close()  # first: a read may still queue a corrupt record's deletion
        self._writer.close()  # runs everything queued, then stops
        self._release()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._forked:
            raise RuntimeError(forked_message(self.where, self._pid))
        if self._closed:
            raise RuntimeError(f"{self.where} is closed")


def _forked(storage: StorageBase) -> None:
    storage._forked = True
    storage._close_lock = threading.Lock()  # the parent's thread may have held it at the fork

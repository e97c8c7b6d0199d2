"""The storage tier's contract: a persistent page store below the host pool.

A storage backend keeps whole pages (page-first bytes, as in the host pool)
under their page keys. Keys come from the radix tree (16 bytes: a chained
hash that already binds the namespace and the whole parent prefix, so a key
names one page of one prefix) or, for raw pages, from a serving engine that
keys its pages itself (any length from 1 to ``MAX_KEY_BYTES``; see
``radixcache.integrations``). Every record is self-checking
(``radixcache.offload.storage.record``): the full key, the namespace tag, the
token ids and a checksum are verified on every read. The backend additionally
binds every key to the ``ModelFingerprint`` it was opened with (invariant 8),
so pages written for another model, KV layout or tensor-parallel rank are
never hits.

Threads and ownership
---------------------
Every method is called by the owner thread (the model runner's scheduler
loop). ``longest_prefix`` and ``stats`` answer at once; ``get``, ``put``,
``delete`` and ``forget_namespace`` hand the work to the backend's own threads
and return a ``Ticket``. The owner harvests tickets in one place (its poll);
nothing here ever calls back into the tree.

Ordering of stores and removals
-------------------------------
A key appears in ``take_removed()`` only after every put ticket that stored
it has finished. An owner that, in each poll, first calls ``take_removed()``
and then harvests its finished tickets, applying stores before those
removals, therefore sees every key's stores and removals in their real order
(``store(DISK)`` is published before ``remove(DISK)``, invariant 5).

Writing a backend
-----------------
A backend is its transport. It subclasses the shared base
(``radixcache.offload.storage``: ``StorageBase``, ``PageReader``,
``JobWriter``; see those modules) and supplies only what depends on where
the bytes live:

* ``longest_prefix``: which leading keys the store holds (an index lookup,
  a pipelined EXISTS, a batch existence call);
* the read transport (``PageReader._values``): the stored values of a read's
  record keys, in order, lazily, as a generator (stopping it releases what
  it holds); raising ``StorageUnavailable`` when the store is lost;
* the write transport (``JobWriter._run_batch``): running put, delete and
  forget jobs against the store and finishing their tickets;
* ``scan``, the sizes behind ``stats``, and releasing its resources on close.

The base does the rest, the same way for every backend: validating calls,
record keys and namespace tags, record framing and verification
(``record``; sealed with the tenant's key where the store encrypts at rest:
``crypt``), copying verified pages into the destination pages, counting,
deleting records that fail verification, the writer thread, and removal
accounting (``removals``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from radixcache.events.types import DISK, Medium
from radixcache.offload.storage.record import RecordMeta
from radixcache.offload.storage.stats import Counters, StorageStats
from radixcache.transfer.ticket import FutureTicket, Ticket

KEY_BYTES = 16  # length of a page key from the radix tree
MAX_KEY_BYTES = 256  # longest page key a backend accepts (raw pages)

TokenPages = npt.NDArray[np.int32]  # [n, P] token ids, one row per page
HostPages = npt.NDArray[np.int32]  # [n] host page ids, one per key
Clock = Callable[[], float]  # wall-clock seconds (time.time): retention deadlines are compared with it


@runtime_checkable
class PageBuffer(Protocol):
    """Fixed-size pages a backend reads from and writes into: the host pool's
    ``HostKVBuffer``, or an engine's own buffer (raw pages)."""

    num_pages: int  # pages in the buffer

    @property
    def page_bytes(self) -> int:
        """Bytes of one page."""
        ...

    def as_bytes(self) -> npt.NDArray[np.uint8]:
        """The whole buffer as ``uint8[num_pages, page_bytes]``, sharing memory."""
        ...


@dataclass(frozen=True, slots=True)
class PutMeta:
    """What a put records about its pages besides bytes and tokens, so a
    router can be told of them again after a restart (survivors) and DISK
    events carry the same block ids as device ones."""

    block_ids: Sequence[int]  # one event id per page, each in [0, 2**63)
    parent_block_id: int | None  # the event id of the page before the first; None: none
    first_depth: int  # page index of the first page within its prefix
    info: bytes = b""  # engine bytes describing the namespace (same for every page)
    expires_at: float | None = None  # retention deadline (wall clock, time.time()); None: none
    tags: tuple[str, ...] = ()  # the namespace's tags (``invalidate_tag`` finds the records by them)

    def __post_init__(self) -> None:
        if self.first_depth < 0:
            raise ValueError(f"first_depth must be >= 0, got {self.first_depth}")


class StorageError(RuntimeError):
    """A storage operation failed (LMDB error, store full); tickets carry it."""


class StorageUnavailable(StorageError):
    """The store cannot be reached now (down, timing out, refusing the
    credentials). A backend raises it from its transport; the shared reader
    turns it into a short read (the pages served so far, a miss for the
    rest), never into an error on the ticket."""


class StorageOpenError(OSError):
    """The store could not be opened (e.g. its directory is not writable)."""


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What a stored page's KV depends on besides its tokens (invariant 8)."""

    model_id: str  # model name or path, as the runner loaded it
    spec: str  # KVSpec.describe(): layers, heads, head dim, dtype, page size
    tp_rank: int  # tensor-parallel rank: each rank holds other heads
    # True where every rank holds the same KV (MLA-style latent caches, as in
    # DeepSeek models): the rank is then left out of the fingerprint, so all
    # ranks name a page by one key and a store keeps one copy of it. Wrong
    # for models whose ranks hold different heads: they would read each
    # other's KV (the spec cannot tell them apart).
    rank_shared: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ValueError(f"model_id must be a non-empty str, got {self.model_id!r}")
        if not isinstance(self.spec, str) or not self.spec:
            raise ValueError(f"spec must be a non-empty str (KVSpec.describe()), got {self.spec!r}")
        if not isinstance(self.tp_rank, int) or isinstance(self.tp_rank, bool) or self.tp_rank < 0:
            raise ValueError(f"tp_rank must be a non-negative int, got {self.tp_rank!r}")
        if not isinstance(self.rank_shared, bool):
            raise TypeError(f"rank_shared must be a bool, got {type(self.rank_shared).__name__}")

    def describe(self) -> str:
        """A stable one-line text form (stored in the store's meta record)."""
        rank = "shared" if self.rank_shared else str(self.tp_rank)
        return f"model={self.model_id};{self.spec};tp_rank={rank}"

    def digest(self) -> bytes:
        """8 bytes that change whenever any field changes."""
        return hashlib.blake2b(self.describe().encode(), digest_size=8).digest()


@runtime_checkable
class Storage(Protocol):
    """A persistent page store, keyed by page key, bound to one fingerprint."""

    medium: Medium
    """The event medium of its pages, which also says who announces them:
    ``"DISK"``, a store of this engine's own: the engine announces every page
    it stores or reads back; ``"EXTERNAL"``, a pool shared by engines: a page
    is announced once, by the engine that wrote it (``take_written``), and
    pages read back from it are not announced again."""

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are committed to the store.

        Synchronous and cheap (no page bytes are read, nothing is verified):
        a later ``get`` may still find fewer pages, e.g. a corrupt record.
        Mutates nothing.
        """
        ...

    def get(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes | None = None,
        tenant: bytes | None = None,
    ) -> Ticket:
        """Read the pages of ``keys`` into ``host`` pages ``host_pages``.

        ``tokens[i]`` are the token ids the page of ``keys[i]`` must hold
        (None: raw pages, which hold none). Every page read is verified (its
        record was written under exactly this key, for ``namespace`` when
        given, holds ``tokens[i]``, and the checksum of its bytes matches); a
        page that fails is a miss, its record is deleted and counted as
        corrupt. Reading stops at the first miss.

        ``tenant`` (the namespace's cache salt, encoded; None: the default
        tenant) picks the key of a store that encrypts at rest
        (offload/storage/crypt): a record that cannot be authenticated with
        it (another tenant's, tampered, another key's) is a miss counted as
        ``decrypt_failures``, never an error. A store in the clear ignores it.

        The ticket's result is the number ``n`` of LEADING pages read and
        verified: host pages ``host_pages[:n]`` hold them bit-exactly; the
        later host pages are unspecified (they may have been written). The
        caller owns ``host_pages`` and must not touch them until the ticket
        is done. A storage error fails the ticket.
        """
        ...

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
        """Write the host pages ``host_pages`` as the pages of ``keys``.

        ``tokens`` None writes raw pages. ``namespace`` tags the records for
        ``forget_namespace`` (and is checked by ``get``); ``meta`` records
        the pages' event ids, parents and depths for ``scan``; ``tenant``
        (as in ``get``) picks the key their KV bytes are sealed with where
        the store encrypts at rest. A key that
        is already stored is left as it is (not rewritten). The writer reads
        the host pages later, on its own thread: the caller must leave them
        untouched until the ticket is done.

        The ticket's result is the number ``n`` of LEADING keys that are in
        the store once the write transaction committed (written now or found
        there); fewer than ``len(keys)`` only when the store cannot make room.
        A storage error fails the ticket (nothing of it is committed).
        """
        ...

    def delete(self, keys: Sequence[bytes]) -> Ticket:
        """Remove the records of ``keys``; result: how many existed."""
        ...

    def forget_namespace(self, namespace: bytes) -> Ticket:
        """Remove every record put under ``namespace``; result: how many."""
        ...

    def invalidate_tag(self, tag: str) -> Ticket:
        """Remove every record of every namespace a put tagged with ``tag``
        (``PutMeta.tags``), this process's puts and earlier ones alike; result:
        how many. Durable once the ticket is done: a store reopened after it
        never serves those records."""
        ...

    def scan(self) -> Iterator[RecordMeta]:
        """The header of every record this fingerprint holds (no KV bytes
        read), in no particular order; for announcing what storage holds when
        an engine starts. ``RecordMeta.key`` is the page key (without the
        fingerprint prefix). Reads a snapshot; called by the owner thread."""
        ...

    def take_removed(self) -> list[bytes]:
        """Page keys removed since the last call (eviction, corruption,
        ``delete``, ``forget_namespace``), in removal order. Keys that were
        never stored do not appear. Hands the list over and clears it."""
        ...

    def take_written(self) -> list[bytes]:
        """Page keys this process wrote (not those a put found stored already)
        since the last call, in order; a page is listed by the time its put
        ticket finishes. Hands the list over and clears it. A ``DISK`` store
        returns [] (the engine announces its pages from the put tickets)."""
        ...

    def stats(self) -> StorageStats:
        """A snapshot of the counters."""
        ...

    def close(self) -> None:
        """Commit every queued write, finish every ticket, stop the threads.

        Idempotent. After it, every other method raises RuntimeError.
        """
        ...


class NullStorage:
    """The storage tier when it is disabled: stores nothing, finds nothing."""

    medium: Medium = DISK

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        return 0

    def get(
        self,
        keys: Sequence[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        namespace: bytes | None = None,
        tenant: bytes | None = None,
    ) -> Ticket:
        return FutureTicket.completed(0)

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
        return FutureTicket.completed(0)

    def scan(self) -> Iterator[RecordMeta]:
        return iter(())

    def delete(self, keys: Sequence[bytes]) -> Ticket:
        return FutureTicket.completed(0)

    def forget_namespace(self, namespace: bytes) -> Ticket:
        return FutureTicket.completed(0)

    def invalidate_tag(self, tag: str) -> Ticket:
        return FutureTicket.completed(0)

    def take_removed(self) -> list[bytes]:
        return []

    def take_written(self) -> list[bytes]:
        return []

    def stats(self) -> StorageStats:
        return Counters().snapshot(records=0, stored_bytes=0, capacity_bytes=0, queued_writes=0)

    def close(self) -> None:
        return None


STATES = ("opened", "recovered", "disabled")


@dataclass(frozen=True, slots=True)
class StorageOpening:
    """How the storage tier came up (what ``open_backend`` returns)."""

    storage: Storage  # the store, or NullStorage when disabled
    state: str  # "opened", "recovered" (a fresh store; the damaged one moved) or "disabled"
    moved_to: str | None = None  # where a damaged store went
    error: str | None = None  # why it could not be opened as it was

    @property
    def state_code(self) -> int:
        """0 opened, 1 recovered, 2 disabled (for a gauge)."""
        return STATES.index(self.state)

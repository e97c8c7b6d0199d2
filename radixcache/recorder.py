"""Recording page events on the owner thread, cheaply, for ``take_events()``.

The tree and the tiers report every residency change of every page here, at
the moment it happens (a node may be split or removed before the owner drains
the events, so each record is taken at once from the node: a store's ids, or
a removal's tokens and the id its pages chain from). Serialization and transport live in ``events/``; this module only
builds its records. Ordering follows invariant 5 of ARCHITECTURE.md because
the callers report in the order things happen: a page's store on a new medium
is recorded before its removal from the old one.

Events name a page by its fast block id (``radixcache.keys.event_ids``), the same
on every medium: GPU, CPU_PINNED and DISK events of one page carry one id,
and the store jobs write it into the page's storage record, so survivors
announced after a restart carry it too. Storage reports removals by page key
only; the recorder remembers the id of every page it announced on a storage
medium (``StorageIds``) and announces the removal under that id. A removed
key it never announced (a record of another writer, one written before the
last ``cleared``, a raw page) is not announced at all, never under a guessed
id: no router was told of it by this engine. ``unknown_removals`` counts them.
No blake2b runs for a page that is not on storage: a stored page's keys are
those its store job cached on the node.

Recording is cheap on purpose: a store's record is its ``BlockStored``,
built at once with the page ids as one int64 array (computed in one pass
over the tokens, no Python int per page) and a read-only view of the
tokens; ``take`` hands both over as arrays, and the publisher's thread
builds their Python ints when it encodes them (``events.types``: a
record's ``block_hashes`` is made a list when first read). A removed node's ids are not computed on the owner thread
at all: the removal keeps the node's tokens and the id they chain from, and
its record's ids are ``DeferredIds``, computed by whoever reads them first.
Consecutive removals on one medium become one record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from radixcache.keys.event_ids import EventIds
from radixcache.events.types import (
    DISK, EXTERNAL, AllBlocksCleared, BlockHashes, BlockRemoved, BlockStored, DeferredIds, KvEvent, Medium,
)
from radixcache.keys.hashing import KEY_BYTES, BlockIds, block_ids
from radixcache.namespace import Namespace
from radixcache.tree.node import Node
from radixcache.tree.recording import NullRecorder, Recorder
from radixcache.keys.page_keys import PageKeys
from radixcache.keys.storage_ids import StorageIds
from radixcache.native import compiled as native_core  # None on the pure-Python path

STORAGE_MEDIA: frozenset[str] = frozenset((DISK, EXTERNAL))  # media whose removals come by key


def _ns_fields(ns: Namespace) -> tuple[str | None, tuple[Any, ...] | None]:
    """``cache_salt`` and the per-block ``extra_keys`` entry of a namespace."""
    return ns.wire_salt(), ns.event_extra()


@dataclass(slots=True)
class _Removal:
    """Consecutive recorded removals on one medium, one ``BlockRemoved``."""

    parts: list[BlockIds | _Pending]  # the pages removed, in order
    medium: str


# A removed node's pages whose ids are not computed yet: its tokens (read-only,
# never changed) and the id their chain starts from.
_Pending = tuple[npt.NDArray[np.int32], int]


def _removed_ids(parts: list[BlockIds | _Pending], page_size: int) -> BlockIds:
    """The ids of a removal's parts, in order (``DeferredIds.build``)."""
    arrays = [x if isinstance(x, np.ndarray) else block_ids(x[0], page_size, x[1], 0) for x in parts]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class EventSink(Recorder, Protocol):
    """A recorder whose records the cache drains (``take_events``)."""

    def take(self) -> list[KvEvent]:
        """Hand over the events recorded since the last call, in order."""
        ...


class NoEvents(NullRecorder):
    """Events disabled: every report is dropped, nothing is ever taken."""

    def take(self) -> list[KvEvent]:
        return []


class PageSized(Protocol):
    """What the recorder needs of its tree: the page size (a ``RadixTree``,
    a ``PageKeys``)."""

    page_size: int


class EventRecorder:
    """Builds ``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` records.

    Consecutive removals on the same medium are merged into one record.
    Stores carry the node's namespace: ``lora_id``/``lora_name``, and for a
    namespace with a salt or extra keys ``cache_salt`` and one ``extra_keys``
    entry per block (see ``Namespace.event_extra``). Mutates the kept event
    ids of the nodes it reports (and, for a page stored on a storage medium
    whose key was not cached yet, the ``keys`` cache).
    """

    def __init__(self, tree: PageSized) -> None:
        self.page_size = tree.page_size
        self.ids = EventIds(tree.page_size)
        self._keys = PageKeys(tree.page_size)
        self.storage_ids = StorageIds()  # storage key -> id, for removals known by key
        self.unknown_removals = 0  # removed storage keys never announced here: not announced
        self._records: list[BlockStored | _Removal | AllBlocksCleared] = []  # since the last take
        self._ns: dict[Namespace, tuple[str | None, tuple[Any, ...] | None]] = {}

    def stored(self, node: Node, start: int, count: int, medium: str) -> None:
        if count <= 0 or node.forgotten:
            return
        parent, run = self.ids.run_ids(node, start, count)
        p = self.page_size
        key = node.key
        tokens = key if start == 0 and count * p == key.size else key[start * p : (start + count) * p]
        self._append(run, parent, tokens, node.namespace, medium)
        if medium in STORAGE_MEDIA:
            # (cached on the node by the store job; for a page read back from
            # storage they are computed here once: the read costs far more)
            keys = self._keys.page_keys(node)[start * KEY_BYTES : (start + count) * KEY_BYTES]
            self._remember(keys, run, medium)

    def stored_ids(
        self,
        block_ids: list[int],
        parent_id: int | None,
        tokens: npt.NDArray[np.int32],
        namespace: Namespace,
        medium: str,
        keys: bytes = b"",
    ) -> None:
        if not block_ids:
            return
        self._append(np.array(block_ids, dtype=np.int64), parent_id, tokens, namespace, medium)
        if keys and medium in STORAGE_MEDIA:
            self._remember(keys, np.array(block_ids, dtype=np.int64), medium)

    def _remember(self, keys: bytes, ids: BlockIds, medium: str) -> None:
        """Keep the ids of pages announced on a storage medium for their
        removal. A page announced before under another id (a record written
        by older code, announced at start with the id it holds, then read
        back under its current id) is announced gone under the old one."""
        replaced = self.storage_ids.add(keys, ids)
        if replaced.size:
            self._remove(replaced, medium)

    def _append(
        self, ids: BlockIds, parent: int | None, tokens: npt.NDArray[np.int32], ns: Namespace, medium: str
    ) -> None:
        # The tokens go out as a read-only int32 view (no Python int per token
        # on the owner thread; the encoder writes them as a list): of a node's
        # key, which the tree never changes in place, or of the fresh array a
        # survivors' announcement builds.
        # A store's record is its event, built here (a removal's waits for
        # ``take``: it may join the next ones). The ids stay an int64 array
        # until the event is read (``BlockStored``).
        view = tokens.view()
        view.flags.writeable = False
        salt, extra = self.event_fields(ns)
        self._records.append(BlockStored(
            ids, parent, view, self.page_size, ns.lora_id, cast(Medium, medium), ns.lora_name,
            salt, None if extra is None else [extra] * len(ids),
        ))

    def event_fields(self, ns: Namespace) -> tuple[str | None, tuple[Any, ...] | None]:
        """``cache_salt`` and the per-block ``extra_keys`` entry of ``ns``'s
        stores (computed once per namespace)."""
        fields = self._ns.get(ns)
        if fields is None:
            fields = self._ns[ns] = _ns_fields(ns)
        return fields

    def removed(self, node: Node, medium: str) -> None:
        if node.forgotten:
            return
        self._remove((node.key, self.ids.chain_start(node)), medium)

    def removed_keys(self, keys: Sequence[bytes], medium: str) -> None:
        if not keys:
            return
        try:
            ids = self.storage_ids.pop(keys)
        except ValueError:  # a raw page's key among them: raw pages carry no event id
            ids = self.storage_ids.pop([k for k in keys if len(k) == KEY_BYTES])
            self.unknown_removals += len(keys) - ids.size
        known = ids[ids >= 0]
        self.unknown_removals += ids.size - known.size
        if known.size:
            self._remove(known, medium)

    def _remove(self, ids: BlockIds | _Pending, medium: str) -> None:
        records = self._records
        last = records[-1] if records else None
        if type(last) is _Removal and last.medium == medium:
            last.parts.append(ids)
        else:
            records.append(_Removal([ids], medium))

    def cleared(self) -> None:
        self.storage_ids.clear()  # every page was announced gone: none is known any more
        self._records.append(AllBlocksCleared())

    def take(self) -> list[KvEvent]:
        """The records of every report since the last call, in order."""
        if not self._records:
            return []
        records, self._records = self._records, []
        out: list[KvEvent] = []
        for r in records:
            if type(r) is BlockStored:
                out.append(r)
            elif type(r) is _Removal:
                parts = r.parts
                arrays = [x for x in parts if isinstance(x, np.ndarray)]
                hashes: BlockHashes
                if len(arrays) == len(parts):  # (removals known by storage key)
                    hashes = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
                else:
                    p = self.page_size
                    count = sum(x.size if isinstance(x, np.ndarray) else x[0].size // p for x in parts)
                    hashes = DeferredIds(count, partial(_removed_ids, parts, p))
                out.append(BlockRemoved(block_hashes=hashes, medium=cast(Medium, r.medium)))
            elif isinstance(r, AllBlocksCleared):
                out.append(r)
        return out


if native_core is not None:  # eviction's removals and an insert's stores are recorded in C (native/victims.pxi)
    native_core.bind_recorder(EventRecorder, _Removal, BlockStored)

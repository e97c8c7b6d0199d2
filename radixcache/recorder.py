"""Recording page events on the owner thread, cheaply, for ``take_events()``.

The tree and the tiers report every residency change of every page here, at
the moment it happens (a node may be split or removed before the owner drains
the events, so each record is built at once from the node's cached page
keys). Serialization and transport live in ``events/``; this module only
builds its records. Ordering follows invariant 5 of ARCHITECTURE.md because
the callers report in the order things happen: a page's store on a new medium
is recorded before its removal from the old one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from radixcache.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, Medium
from radixcache.hashing import KEY_BYTES, block_hashes
from radixcache.namespace import Namespace
from radixcache.node import Node


def event_ids(keys: bytes) -> list[int]:
    """Event block ids (ints in [0, 2**63)) of concatenated page keys.

    The one place the engine turns page keys into the ids its events (and
    its storage records) carry: swapping the id function is a change here.
    """
    return block_hashes(keys)


def _ns_fields(ns: Namespace) -> tuple[str | None, tuple[Any, ...] | None]:
    """``cache_salt`` and the per-block ``extra_keys`` entry of a namespace."""
    return ns.wire_salt(), ns.event_extra()


class Recorder(Protocol):
    """What the tree and the tiers report. Owner thread only.

    A ``forgotten`` node (left under a forgotten namespace's detached root
    because something still holds it) was reported removed from every medium
    when its namespace was forgotten: reports about it are dropped.
    """

    def stored(self, node: Node, start: int, count: int, medium: Medium) -> None:
        """Pages ``[start, start+count)`` of ``node`` became resident on ``medium``."""
        ...

    def removed(self, node: Node, medium: Medium) -> None:
        """Every page of ``node`` left ``medium``."""
        ...

    def removed_keys(self, keys: Sequence[bytes], medium: Medium) -> None:
        """Pages known only by their 16-byte keys left ``medium``."""
        ...

    def cleared(self) -> None:
        """Everything is gone, on every medium."""
        ...

    def stored_ids(
        self,
        block_ids: list[int],
        parent_id: int | None,
        tokens: npt.NDArray[np.int32],
        namespace: Namespace,
        medium: Medium,
    ) -> None:
        """Pages known by their event ids (not by a node) became resident on
        ``medium``: consecutive pages chaining from ``parent_id``, ``tokens``
        all their token ids (storage survivors announced at start)."""
        ...

    def take(self) -> list[KvEvent]:
        """Hand over the events recorded since the last call, in order."""
        ...


class NullRecorder:
    """Events disabled: every report is dropped."""

    def stored(self, node: Node, start: int, count: int, medium: Medium) -> None:
        pass

    def removed(self, node: Node, medium: Medium) -> None:
        pass

    def removed_keys(self, keys: Sequence[bytes], medium: Medium) -> None:
        pass

    def cleared(self) -> None:
        pass

    def stored_ids(
        self,
        block_ids: list[int],
        parent_id: int | None,
        tokens: npt.NDArray[np.int32],
        namespace: Namespace,
        medium: Medium,
    ) -> None:
        pass

    def take(self) -> list[KvEvent]:
        return []


class KeySource(Protocol):
    """The part of the tree the recorder needs: chained page keys."""

    page_size: int

    def page_keys(self, node: Node) -> bytes: ...

    def parent_key(self, node: Node) -> bytes | None: ...


class EventRecorder:
    """Builds ``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` records.

    Consecutive removals on the same medium are merged into one record.
    Stores carry the node's namespace: ``lora_id``/``lora_name``, and for a
    namespace with a salt or extra keys ``cache_salt`` and one ``extra_keys``
    entry per block (see ``Namespace.event_extra``).
    """

    def __init__(self, keys: KeySource) -> None:
        self._keys = keys
        self._events: list[KvEvent] = []
        self._ns: dict[Namespace, tuple[str | None, tuple[Any, ...] | None]] = {}

    def stored(self, node: Node, start: int, count: int, medium: Medium) -> None:
        if count <= 0 or node.forgotten:
            return
        keys = self._keys.page_keys(node)
        p = self._keys.page_size
        if start > 0:
            parent: bytes | None = keys[(start - 1) * KEY_BYTES : start * KEY_BYTES]
        else:
            parent = self._keys.parent_key(node)
        self._append(
            event_ids(keys[start * KEY_BYTES : (start + count) * KEY_BYTES]),
            None if parent is None else event_ids(parent)[0],
            node.key[start * p : (start + count) * p],
            node.namespace,
            medium,
        )

    def stored_ids(
        self,
        block_ids: list[int],
        parent_id: int | None,
        tokens: npt.NDArray[np.int32],
        namespace: Namespace,
        medium: Medium,
    ) -> None:
        if block_ids:
            self._append(block_ids, parent_id, tokens, namespace, medium)

    def _append(
        self, ids: list[int], parent: int | None, tokens: npt.NDArray[np.int32], ns: Namespace, medium: Medium
    ) -> None:
        fields = self._ns.get(ns)
        if fields is None:
            fields = self._ns[ns] = _ns_fields(ns)
        salt, extra = fields
        self._events.append(
            BlockStored(
                ids, parent, tokens.tolist(), self._keys.page_size, ns.lora_id, medium, ns.lora_name,
                salt, None if extra is None else [extra] * len(ids),
            )
        )

    def removed(self, node: Node, medium: Medium) -> None:
        if node.forgotten:
            return
        self._remove(event_ids(self._keys.page_keys(node)), medium)

    def removed_keys(self, keys: Sequence[bytes], medium: Medium) -> None:
        if keys:
            self._remove(event_ids(b"".join(keys)), medium)

    def _remove(self, hashes: list[int], medium: Medium) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved) and last.medium == medium:
            last.block_hashes.extend(hashes)
        else:
            self._events.append(BlockRemoved(block_hashes=hashes, medium=medium))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KvEvent]:
        out, self._events = self._events, []
        return out

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
from typing import Protocol

from radixcache.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, Medium
from radixcache.hashing import KEY_BYTES, block_hash, block_hashes
from radixcache.node import Node


class Recorder(Protocol):
    """What the tree and the tiers report. Owner thread only."""

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
    """

    def __init__(self, keys: KeySource) -> None:
        self._keys = keys
        self._events: list[KvEvent] = []

    def stored(self, node: Node, start: int, count: int, medium: Medium) -> None:
        if count <= 0:
            return
        keys = self._keys.page_keys(node)
        p = self._keys.page_size
        if start > 0:
            parent: bytes | None = keys[(start - 1) * KEY_BYTES : start * KEY_BYTES]
        else:
            parent = self._keys.parent_key(node)
        ns = node.namespace
        self._events.append(
            BlockStored(
                block_hashes=block_hashes(keys[start * KEY_BYTES : (start + count) * KEY_BYTES]),
                parent_block_hash=None if parent is None else block_hash(parent),
                token_ids=node.key[start * p : (start + count) * p].tolist(),
                block_size=p,
                lora_id=ns.lora_id,
                medium=medium,
                lora_name=ns.lora_name,
            )
        )

    def removed(self, node: Node, medium: Medium) -> None:
        self._remove(block_hashes(self._keys.page_keys(node)), medium)

    def removed_keys(self, keys: Sequence[bytes], medium: Medium) -> None:
        if keys:
            self._remove(block_hashes(b"".join(keys)), medium)

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

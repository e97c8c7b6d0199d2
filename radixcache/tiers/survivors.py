"""Storage survivors: what the engine tells routers about storage at start.

Pages found in storage when an engine starts (written by its previous
incarnation) are announced once, right after the publisher's
``AllBlocksCleared``, as ``BlockStored(medium=DISK)`` events that carry the
same block ids, parents and token ids as the events of the pages' first life.
Routers then know the disk tier of a restarted engine before any traffic.

What makes that possible is written on every put: ``put_meta`` gives the
storage, for a run of pages, their event ids (the fast block ids of
``radixcache.keys.event_ids``, the ids their GPU and CPU events carry), the id of
the page before the first, the first page's depth in its prefix and the
namespace's ``info`` bytes (``Namespace.to_info``). A survivor is announced
with the ids its record holds, and the recorder keeps them (by storage key)
for the page's later removal. Records written before events used fast ids
hold ids derived from their storage keys: they are announced, and later
removed, under those; should such a page be read back, the recorder
announces it under its fast id and the old id gone. ``announce_survivors`` reads them back
(``scan``, header reads only), orders pages parents first, and records, per
chain, one ``BlockStored`` of at most ``max_pages`` pages::

    scan -> {id: record}          records without an id (raw pages, another
                                  writer's) are not announceable: counted
    roots = records whose parent is None
    walk from the roots; a chain of single children is one event
    records not reached (their parent left storage first) are orphans:
    announced after the rest, with their parent's id, so a router's DISK
    set equals what storage holds (``KvIndex`` keeps them by id and places
    them once the parent is stored again, as the engine can only match them
    once it recomputed the parent)

Owner thread only; reading the token ids of the announced pages is one read
transaction per event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from radixcache.events.types import DISK, Medium
from radixcache.keys.event_ids import EventIds
from radixcache.namespace import Namespace
from radixcache.tree.node import Node
from radixcache.offload import PutMeta, RecordMeta
from radixcache.tree.recording import Recorder


@runtime_checkable
class SurvivorSource(Protocol):
    """What announcing survivors needs from a storage backend."""

    def scan(self) -> Iterator[RecordMeta]:
        """Every record's header (``key`` without the fingerprint prefix)."""
        ...

    def read_tokens(self, keys: Sequence[bytes]) -> list[npt.NDArray[np.int32] | None]:
        """The token ids stored under each key (None when not readable)."""
        ...


@dataclass(frozen=True, slots=True)
class SurvivorReport:
    """What ``announce_survivors`` found and recorded."""

    announced: int  # pages recorded as BlockStored(DISK)
    events: int  # BlockStored records they took
    orphans: int  # of those, pages below a parent that is not in storage
    unannounceable: int  # records without an event id, raw, or unreadable


# The retention deadline and the tags of a run of nodes a store job writes
# (the cache's ``Retention.deadline`` and ``TagBook.tags_of``).
PutExtras = Callable[[Sequence[Node]], tuple["float | None", tuple[str, ...]]]
DateFetched = Callable[[Node, list[bytes]], None]  # pages read back for a node, by their keys


def put_meta(ids: EventIds, nodes: Sequence[Node], extras: PutExtras | None = None) -> PutMeta:
    """The ``PutMeta`` of a store job writing every page of ``nodes`` (one
    run, path order): event ids (computed from the nodes, as their events
    carry them), the parent's id, the first page's depth and the namespace's info
    bytes; with ``extras``, the run's retention deadline and its namespace's tags."""
    first = nodes[0]
    parts = [ids.node_ids(n) for n in nodes]
    block_ids = (parts[0] if len(parts) == 1 else np.concatenate(parts)).tolist()
    depth = 0
    n = first.parent
    while n is not None and n.parent is not None:
        depth += int(n.key.size)
        n = n.parent
    expires_at, tags = extras(nodes) if extras is not None else (None, ())
    return PutMeta(
        block_ids=block_ids,
        parent_block_id=ids.parent_id(first),
        first_depth=depth // ids.page_size,
        info=first.namespace.to_info(),
        expires_at=expires_at,
        tags=tags,
    )


def announce_survivors(
    storage: object,
    recorder: Recorder,
    page_size: int,
    *,
    medium: Medium = DISK,
    max_pages: int = 64,
) -> SurvivorReport:
    """Record a ``BlockStored(medium)`` for every stored page, parents first
    (orphans' subtrees last), at most ``max_pages`` pages per event. A
    storage that cannot list its records with their tokens (no storage, a
    pool without ``read_tokens``) announces nothing."""
    if max_pages <= 0:
        raise ValueError(f"max_pages must be positive, got {max_pages}")
    if not isinstance(storage, SurvivorSource):
        return SurvivorReport(0, 0, 0, 0)
    by_id: dict[int, RecordMeta] = {}
    unannounceable = 0
    for meta in storage.scan():
        if meta.block_id is None or meta.raw or meta.num_tokens != page_size:
            unannounceable += 1
            continue
        by_id[meta.block_id] = meta
    children: dict[int | None, list[int]] = {}
    for bid, meta in by_id.items():
        children.setdefault(meta.parent_block_id, []).append(bid)
    for kids in children.values():
        kids.sort(key=lambda b: by_id[b].seq)  # deterministic: write order
    namespaces: dict[bytes, Namespace | None] = {}
    announced = events = 0
    # First pages first, then the orphans' subtrees (their parent left storage
    # first): a router holds those by id until the parent is stored again,
    # so its DISK set equals what storage holds.
    reached = _reached(children)
    orphan_roots = sorted(
        (b for b in by_id if b not in reached and by_id[b].parent_block_id not in by_id),
        key=lambda b: by_id[b].seq,
    )
    stack: list[tuple[int, int | None]] = [(b, by_id[b].parent_block_id) for b in reversed(orphan_roots)]
    stack.extend((b, None) for b in reversed(children.get(None, [])))
    while stack:
        bid, parent = stack.pop()
        run = [bid]
        while len(run) < max_pages and len(children.get(run[-1], ())) == 1:
            run.append(children[run[-1]][0])
        info = by_id[run[0]].info
        if info not in namespaces:
            try:
                namespaces[info] = Namespace.from_info(info)
            except ValueError:
                namespaces[info] = None
        ns = namespaces[info]
        tokens = storage.read_tokens([by_id[b].key for b in run])
        ok = ns is not None and all(t is not None and t.size == page_size for t in tokens)
        if ns is None or not ok:
            unannounceable += len(run)  # its subtree is skipped with it (not counted)
            continue
        keys = b"".join(by_id[b].key for b in run)
        recorder.stored_ids(run, parent, np.concatenate([t for t in tokens if t is not None]), ns, medium, keys)
        announced += len(run)
        events += 1
        stack.extend((b, run[-1]) for b in reversed(children.get(run[-1], [])))
    orphans = len(by_id) - len(reached)
    return SurvivorReport(announced, events, orphans, unannounceable)


def _reached(children: dict[int | None, list[int]]) -> set[int]:
    """Every id reachable from a first page."""
    seen: set[int] = set()
    stack = list(children.get(None, []))
    while stack:
        b = stack.pop()
        seen.add(b)
        stack.extend(children.get(b, []))
    return seen

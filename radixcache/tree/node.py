"""Tree nodes and the typed records the tree returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.namespace import Namespace

PageIds = npt.NDArray[np.int32]
TokenArray = npt.NDArray[np.int32]

EMPTY_PAGES: PageIds = np.empty(0, dtype=np.int32)
EMPTY_PAGES.setflags(write=False)


def concat_pages(parts: list[PageIds]) -> PageIds:
    """The page ids of ``parts``, in order, as one new array (a copy even of
    a single part or of none, so the caller owns it)."""
    if not parts:
        return EMPTY_PAGES.copy()
    if len(parts) == 1:
        return parts[0].copy()
    return np.concatenate(parts)


def first_page(tokens: TokenArray, pos: int, page_size: int) -> bytes:
    """The bytes of the page of ``tokens`` that starts at ``pos``: what a
    node's children are keyed by (their first page)."""
    return tokens[pos : pos + page_size].tobytes()


def common_len(key: TokenArray, tokens: TokenArray, pos: int, n: int, page_size: int) -> int:
    """Tokens (page-aligned) that ``key`` shares with ``tokens[pos:n]``."""
    klen = key.size
    end = pos + klen
    if end <= n and (tokens[pos:end] == key).all():
        return klen
    m = min(klen, n - pos)
    eq = tokens[pos : pos + m] == key[:m]
    if eq.all():
        return m
    first_diff = int(np.argmin(eq))
    return first_diff - first_diff % page_size


class Node:
    """A run of whole pages: ``key`` holds ``num_pages * P`` tokens.

    Residency (invariant 2 of ARCHITECTURE.md):

    * ``device``: device page ids, one per page of the run, or None;
    * ``host``: host page ids, or None;
    * ``stored``: True once every page of the run is committed to storage.

    The tree owns the index fields, ``device`` and the locks. ``host``,
    ``stored``, ``holds`` and ``loading`` belong to the tiers below the device
    (radixcache/tiers/host_index.py): they sit on the node for speed, and the tree
    never reads or writes them; it asks the ``LowerTiers`` it was built with.

    A non-root node always has device pages or a copy below the device; one
    with neither is removed from the tree. Device residency is prefix-closed:
    a node with device pages has a parent with device pages (or is a child of
    the root), because device eviction only takes nodes without
    device-resident children.
    """

    __slots__ = (
        "key",
        "device",
        "host",
        "stored",
        "children",
        "parent",
        "namespace",
        "lock_ref",
        "device_children",
        "last_access",
        "hit_count",
        "priority",
        "uid",
        "keys",
        "id_pages",
        "last_id",
        "heap_seq",
        "holds",
        "loading",
        "forgotten",
    )

    def __init__(
        self,
        key: TokenArray,
        parent: Node | None,
        namespace: Namespace,
        uid: int,
    ) -> None:
        self.key = key  # int32 tokens, length a multiple of P
        self.device: PageIds | None = None  # device page ids, one per page
        self.host: PageIds | None = None  # host page ids, one per page
        self.stored = False  # every page committed to storage
        self.children: dict[bytes, Node] = {}  # keyed by the bytes of the child's first page
        self.parent = parent  # None only for a namespace root
        self.namespace = namespace  # the partition this node belongs to
        self.lock_ref = 0  # live locks on this node or any descendant
        self.device_children = 0  # children that hold device pages
        self.last_access = uid  # tick of the last match/insert through this node
        self.hit_count = 0  # matches that used this node
        self.priority = 0  # highest priority of the requests that used it
        self.uid = uid  # creation tick: unique, also the FIFO order
        self.keys: bytes | None = None  # cached 16-byte page keys (a prefix of them, lazily)
        self.id_pages = 0  # leading pages whose last event block id is kept (0: none; keys/event_ids.py)
        self.last_id = 0  # the event block id of page id_pages - 1
        self.heap_seq = -1  # sequence number of this node's newest eviction-heap entry
        self.holds = 0  # tier jobs in flight on its pages (a split copies it to both pieces)
        self.loading = 0  # of those, loads writing its device pages (no adoption meanwhile)
        self.forgotten = False  # under a forgotten namespace's detached root: reports no events

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return (
            f"Node(uid={self.uid}, tokens={self.key.size}, device={self.device is not None}, "
            f"host={self.host is not None}, stored={self.stored}, lock_ref={self.lock_ref})"
        )


if native_core is not None:  # the same node as a C struct (radixcache/native/_core.pyx)
    Node = native_core.Node  # type: ignore[misc]  # noqa: F811
    concat_pages = native_core.concat_pages
    first_page = native_core.first_page
    common_len = native_core.common_len


@dataclass(slots=True)
class MatchResult:
    """What the cache holds of a token sequence, walked device, host, storage.

    Lengths are in tokens and page-aligned; each tier's length counts the
    pages found there *after* the previous tier's.
    """

    device_len: int  # tokens whose KV is on the device, usable at once
    device_pages: PageIds  # device page ids covering ``device_len`` (new; none found: a shared empty one)
    last_device_node: Node | None  # deepest node of the device part, None if none
    host_len: int = 0  # tokens beyond ``device_len`` held in host memory
    host_nodes: tuple[Node, ...] = ()  # the nodes holding them, in order
    storage_len: int = 0  # tokens beyond those found in storage (filled by the cache)

    @property
    def total_len(self) -> int:
        return self.device_len + self.host_len + self.storage_len


@dataclass(slots=True)
class InsertResult:
    """Outcome of inserting a run of pages."""

    existing_pages: int  # leading pages already on the device: the caller's copies are duplicates
    device_parts: list[PageIds]  # the device pages of the nodes on the inserted path, in order
    last_node: Node  # node holding the last inserted page
    new_nodes: list[Node]  # nodes whose device pages came from this insert, in path order
    new_node_offsets: list[int]  # for each, the sequence index of the first page this insert gave it
    inserted_pages: int  # leading pages now in the tree (all, unless a node being loaded back stopped it)

    @property
    def device_pages(self) -> PageIds:
        """The tree's device page ids for the whole inserted sequence (a new
        array, built on demand: the caller needs it only for duplicates)."""
        return concat_pages(self.device_parts)


@dataclass(slots=True)
class EvictResult:
    """Device pages released by an eviction; the caller frees them in its pool.

    (Copies below the device of nodes removed with a victim are released by
    the tree's ``LowerTiers.discard``.)"""

    device_pages: PageIds  # device pages dropped


@dataclass(slots=True)
class ForgetResult:
    """Outcome of forgetting a namespace."""

    removed_pages: int  # device pages released
    pending_pages: int  # device pages kept (detached) because requests or jobs still hold them
    device_page_ids: PageIds  # the released device pages, for the caller to free


if native_core is not None:  # the same record as a C struct (radixcache/native/_core.pyx)
    MatchResult = native_core.MatchResult  # type: ignore[misc]  # noqa: F811
    InsertResult = native_core.InsertResult  # type: ignore[misc]  # noqa: F811

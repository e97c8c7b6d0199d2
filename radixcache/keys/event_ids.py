"""Event block ids of tree nodes, computed a run of pages at a time.

A page's id depends on its namespace and its whole prefix (see
``radixcache.keys.hashing.block_ids``), so a node's ids chain from the last id of
its parent. A node keeps one id, not one per page: ``node.last_id``, the id
of its page ``node.id_pages - 1`` (``id_pages`` 0: none yet). Ids are
computed when asked for, from the nearest id kept: a run's ids cost one
multiply-add pass over its tokens (about 0.01 us a page), while keeping
every id would cost 8 bytes a cached page for as long as it is cached. The
recorder asks for a run's ids when it records a store or a removal, a store
job when it writes them into the pages' storage records
(``survivors.put_meta``). A node extended since keeps the id of its old last
page, which is where the new pages' ids start; a split hands the kept id to
the piece that holds its page.

This is the event side only. Storage keys (``hashing.chain_keys``, blake2b)
are computed by the tiers for the pages they write to or look up in storage.
"""

from __future__ import annotations

from radixcache.keys.hashing import BlockIds, block_ids, lane_weights, namespace_seed
from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.namespace import Namespace
from radixcache.keys.chain import ChainNode


class EventIds:
    """Event block ids of the nodes of a tree with page size ``page_size``.

    Mutates only the kept ids (``id_pages``, ``last_id``) of the nodes it
    is asked about and of their ancestors. Owner thread only.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.lanes = lane_weights(page_size)  # (read by the compiled walks)
        self._seeds: dict[Namespace, int] = {}  # namespace -> the id its chains start from

    def seed(self, namespace: Namespace) -> int:
        """The id chains of ``namespace`` start from (a blake2b once per namespace)."""
        seed = self._seeds.get(namespace)
        if seed is None:
            seed = self._seeds[namespace] = namespace_seed(namespace.digest())
        return seed

    def run_ids(self, node: ChainNode, start: int, count: int) -> tuple[int | None, BlockIds]:
        """The id of the page before ``node``'s pages ``start .. start+count-1``
        (None where they begin their namespace's sequence) and their ids (an
        array nothing else holds). ``0 <= start``, ``0 < count``, ``start + count`` within
        the node."""
        p = self.page_size
        key = node.key
        first = node.id_pages
        if first and first <= start:  # (a leaf's new pages: chain from its kept id)
            before: int | None = node.last_id
        else:
            first, before = 0, self.parent_id(node)
        ids = block_ids(key[first * p : (start + count) * p], p, before, self.seed(node.namespace))
        if start > first:
            before = int(ids[start - first - 1])
            ids = ids[start - first :]
        end = start + count
        if end > node.id_pages:
            node.id_pages, node.last_id = end, int(ids[-1])
        return before, ids

    def node_ids(self, node: ChainNode) -> BlockIds:
        """Ids of all of ``node``'s pages, in order (a new array)."""
        return self.run_ids(node, 0, node.key.size // self.page_size)[1]

    def last_id(self, node: ChainNode) -> int:
        """The id of ``node``'s last page (not a root), kept on it and on
        the ancestors it had to be chained through."""
        p = self.page_size
        chain: list[ChainNode] = []
        n = node
        while n.parent is not None and n.id_pages * p != n.key.size:
            chain.append(n)
            n = n.parent
        prev = None if n.parent is None else n.last_id
        for m in reversed(chain):
            done = m.id_pages
            if done:
                prev = m.last_id
            ids = block_ids(m.key[done * p :], p, prev, self.seed(m.namespace))
            m.id_pages, m.last_id = m.key.size // p, int(ids[-1])
            prev = m.last_id
        return node.last_id

    def chain_start(self, node: ChainNode) -> int:
        """The id ``node``'s ids chain from (not a root): its parent's last
        id, or its namespace's seed below a root. ``block_ids(node.key, p,
        chain_start, ...)`` are its ids."""
        parent = node.parent
        assert parent is not None
        return self.seed(node.namespace) if parent.parent is None else self.last_id(parent)

    def parent_id(self, node: ChainNode) -> int | None:
        """The id of the page before ``node``'s first page, None at a root."""
        parent = node.parent
        if parent is None or parent.parent is None:
            return None
        return self.last_id(parent)


# What the compiled walks are held to (tests).
run_ids_reference, node_ids_reference = EventIds.run_ids, EventIds.node_ids
last_id_reference, chain_start_reference = EventIds.last_id, EventIds.chain_start
if native_core is not None:  # the same walks and ids in one C call each (radixcache/native/_core.pyx)
    EventIds.run_ids = native_core.run_ids  # type: ignore[method-assign]
    EventIds.node_ids = native_core.node_ids  # type: ignore[method-assign]
    EventIds.last_id = native_core.last_id  # type: ignore[method-assign]
    EventIds.chain_start = native_core.chain_start  # type: ignore[method-assign]

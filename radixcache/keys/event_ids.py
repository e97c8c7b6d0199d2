"""Event block ids of tree nodes, computed a run of pages at a time and
cached on the nodes.

A page's id depends on its namespace and its whole prefix (see
``radixcache.keys.hashing.block_ids``), so a node's ids chain from the last id of
its parent. Each node caches the ids of its pages in ``node.ids`` (an int64
array; a prefix of them when the node was extended since), so an id is
computed once per page: the recorder asks for a node's ids when it records a
store or a removal, a store job when it writes the ids into the pages'
storage records (``survivors.put_meta``), and a split hands each piece its
part of the cache.

This is the event side only. Storage keys (``hashing.chain_keys``, blake2b)
are computed by the tiers for the pages they write to or look up in storage.
"""

from __future__ import annotations

import numpy as np

from radixcache.keys.hashing import BlockIds, block_ids, lane_weights, namespace_seed
from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.namespace import Namespace
from radixcache.keys.chain import ChainNode

_NONE: BlockIds = np.empty(0, dtype=np.int64)
_NONE.setflags(write=False)


class EventIds:
    """Event block ids of the nodes of a tree with page size ``page_size``.

    Mutates only the ``ids`` caches of the nodes it is asked about (and of
    their ancestors). Owner thread only.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.lanes = lane_weights(page_size)  # (read by the compiled node_ids)
        self._seeds: dict[Namespace, int] = {}  # namespace -> the id its chains start from

    def seed(self, namespace: Namespace) -> int:
        """The id chains of ``namespace`` start from (a blake2b once per namespace)."""
        seed = self._seeds.get(namespace)
        if seed is None:
            seed = self._seeds[namespace] = namespace_seed(namespace.digest())
        return seed

    def node_ids(self, node: ChainNode) -> BlockIds:
        """Ids of ``node``'s pages, in order (cached; do not modify)."""
        p = self.page_size
        chain: list[ChainNode] = []
        n = node
        while n.parent is not None and (n.ids is None or n.ids.size * p < n.key.size):
            chain.append(n)
            n = n.parent
        if not chain:
            return _NONE if node.ids is None else node.ids
        prev = None if n.parent is None else int(n.ids[-1])  # type: ignore[index]
        seed = self.seed(node.namespace)
        for m in reversed(chain):
            done = 0 if m.ids is None else m.ids.size
            if done:
                prev = int(m.ids[-1])  # type: ignore[index]
            fresh = block_ids(m.key[done * p :], p, prev, seed)
            m.ids = fresh if m.ids is None else np.concatenate([m.ids, fresh])
            prev = int(m.ids[-1])
        assert node.ids is not None
        return node.ids

    def parent_id(self, node: ChainNode) -> int | None:
        """The id of the page before ``node``'s first page, None at a root."""
        parent = node.parent
        if parent is None or parent.parent is None:
            return None
        return int(self.node_ids(parent)[-1])


node_ids_reference = EventIds.node_ids  # what the compiled walk is held to (tests)
if native_core is not None:  # the same walk and ids in one C call (radixcache/native/_core.pyx)
    EventIds.node_ids = native_core.node_ids  # type: ignore[method-assign]

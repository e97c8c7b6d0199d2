"""Expected event ids, computed apart from the engine: the definition of the
fast block id (``hashing.block_id_of_sequence``, page by page with Python
ints) over a node's whole path, and each storage record's id checked
against its own tokens and its parent's id."""

from __future__ import annotations

import numpy as np

from radixcache import Namespace
from radixcache.keys.hashing import KEY_BYTES, block_id_of_sequence, namespace_seed
from radixcache.tree.node import Node
from radixcache.offload import LmdbStorage
from radixcache.tree.radix_tree import RadixTree


def reference_ids(tree: RadixTree, node: Node) -> list[int]:
    """The event ids of ``node``'s pages by the definition."""
    parts = []
    n: Node | None = node
    while n is not None and n.parent is not None:
        parts.append(n.key)
        n = n.parent
    tokens = np.concatenate(parts[::-1]) if parts else np.empty(0, dtype=np.int32)
    p = tree.page_size
    ids = block_id_of_sequence(tokens, p, None, namespace_seed(node.namespace.digest()))
    return ids[len(ids) - node.key.size // p :]


def record_ids(storage: LmdbStorage, page_size: int) -> dict[bytes, int]:
    """Storage key -> the event id its record holds, for every record; each
    id is checked to be the fast id of the record's page: the chain step
    from its parent's id (its namespace's seed for a first page) over the
    token ids the record holds."""
    metas = list(storage.scan())
    tokens = storage.read_tokens([m.key for m in metas])
    out: dict[bytes, int] = {}
    for meta, toks in zip(metas, tokens):
        assert meta.block_id is not None and toks is not None, meta
        seed = namespace_seed(Namespace.from_info(meta.info).digest())
        want = block_id_of_sequence(toks, page_size, meta.parent_block_id, seed)
        assert [meta.block_id] == want, (meta, want)
        out[meta.key] = meta.block_id
    return out


def assert_stored_ids_match(tree: RadixTree, by_key: dict[bytes, int]) -> int:
    """Every tree page whose storage key is cached and stored holds, in its
    record, the id its device and host events carry. Returns how many pages
    were compared."""
    compared = 0
    for node in tree.nodes():
        if node.keys is None or node.forgotten:
            continue
        ids = reference_ids(tree, node)
        for i in range(len(node.keys) // KEY_BYTES):
            stored = by_key.get(node.keys[i * KEY_BYTES : (i + 1) * KEY_BYTES])
            if stored is not None:
                assert stored == ids[i], (node, i, stored, ids[i])
                compared += 1
    return compared

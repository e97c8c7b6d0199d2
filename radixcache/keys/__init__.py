"""The ids and keys of pages.

Two kinds, for two readers: **event block ids** (fast, 63-bit, for routers;
``block_ids``, cached on tree nodes by ``EventIds``) and **storage keys**
(16-byte blake2b chains that resist crafted collisions, because a key alone
decides which KV storage serves; ``chain_keys``, cached by ``PageKeys``).
Both bind the namespace and the whole prefix, and are stable across
processes, restarts and machines.

    hashing.py       the two hash functions, page by page and chained
    chain.py         what they need of a tree node (a contract)
    event_ids.py     event ids of tree nodes, computed a run at a time, cached
    page_keys.py     storage keys of tree nodes, computed lazily, cached
    storage_ids.py   storage key -> event id of pages announced on storage
    routing_keys.py  a request's storage keys as a router computes them from
                     the wire (imports the pool client: import it by path)
"""

from __future__ import annotations

from radixcache.keys.event_ids import EventIds
from radixcache.keys.hashing import (
    ID_LIMIT,
    KEY_BYTES,
    block_id_of_sequence,
    block_ids,
    chain_keys,
    namespace_seed,
    split_keys,
)
from radixcache.keys.page_keys import PageKeys
from radixcache.keys.storage_ids import StorageIds

__all__ = [
    "ID_LIMIT",
    "KEY_BYTES",
    "EventIds",
    "PageKeys",
    "StorageIds",
    "block_id_of_sequence",
    "block_ids",
    "chain_keys",
    "namespace_seed",
    "split_keys",
]

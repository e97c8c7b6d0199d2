"""Chained 16-byte page keys of tree nodes, computed lazily and cached.

A page's key binds its namespace and its whole prefix::

    key(page i) = chain(key(page i-1), tokens of page i)      key(page -1) = namespace digest

They name pages in storage only (events use the fast ids of
``radixcache.keys.event_ids``): the tiers compute them for the pages they write
to or look up in storage, and the recorder reads them back from the cache to
remember which id a stored page was announced with. Each node caches the
keys of its pages in ``node.keys`` (a prefix of them when the node was
extended since), so a key is computed once per page. ``PageKeys``
holds no state of its own: the tree and the event recorder may each have one.
"""

from __future__ import annotations

from radixcache.keys.hashing import KEY_BYTES, chain_keys
from radixcache.keys.chain import ChainNode


class PageKeys:
    """Page keys of nodes of a tree with page size ``page_size``."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    def page_keys(self, node: ChainNode) -> bytes:
        """16-byte chained keys of ``node``'s pages, concatenated (cached on the nodes)."""
        p = self.page_size
        chain: list[ChainNode] = []
        n = node
        while n.parent is not None and (n.keys is None or len(n.keys) * p < KEY_BYTES * n.key.size):
            chain.append(n)
            n = n.parent
        if n.parent is None and n.keys is None:
            n.keys = n.namespace.digest()
        assert n.keys is not None
        prev = n.keys[-KEY_BYTES:]
        for m in reversed(chain):
            # A node extended after its keys were cached has a cached prefix.
            done = 0 if m.keys is None else len(m.keys) // KEY_BYTES
            if done:
                assert m.keys is not None
                prev = m.keys[-KEY_BYTES:]
            fresh = chain_keys(prev, m.key[done * p :], p)
            m.keys = fresh if m.keys is None else m.keys + fresh
            prev = m.keys[-KEY_BYTES:]
        assert node.keys is not None
        return node.keys

    def parent_key(self, node: ChainNode) -> bytes | None:
        """The key of the page before ``node``'s first page, None at a root."""
        parent = node.parent
        if parent is None or parent.parent is None:
            return None
        return self.page_keys(parent)[-KEY_BYTES:]

    def last_key(self, node: ChainNode | None, namespace_digest: bytes) -> bytes:
        """The key a run of pages below ``node`` chains from (the namespace
        digest when ``node`` is None, i.e. the run starts at the root)."""
        if node is None or node.parent is None:
            return namespace_digest
        return self.page_keys(node)[-KEY_BYTES:]

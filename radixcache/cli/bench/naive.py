"""A deliberately naive prefix cache, the baseline the benchmarks compare to.

One Python node per page, children keyed by a tuple of the page's tokens,
tokens handled as Python lists, LRU eviction by sorting every leaf. This is
the straightforward design (close to a per-block hash table): correct, and
what the real tree must beat.
"""

from __future__ import annotations

import hashlib
import pickle

import numpy as np


class NaiveNode:
    __slots__ = ("children", "parent", "page", "last_access", "lock_ref", "key")

    def __init__(self, key: tuple[int, ...], parent: NaiveNode | None, page: int) -> None:
        self.key = key
        self.children: dict[tuple[int, ...], NaiveNode] = {}
        self.parent = parent
        self.page = page
        self.last_access = 0
        self.lock_ref = 0


class NaiveCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.root = NaiveNode((), None, -1)
        self.tick = 0
        self.size = 0

    def match(self, tokens: np.ndarray) -> tuple[int, list[int], NaiveNode]:
        toks = tokens.tolist()
        p = self.page_size
        node = self.root
        pages: list[int] = []
        self.tick += 1
        for i in range(0, len(toks) - len(toks) % p, p):
            child = node.children.get(tuple(toks[i : i + p]))
            if child is None:
                break
            child.last_access = self.tick
            pages.append(child.page)
            node = child
        return len(pages) * p, pages, node

    def insert(self, tokens: np.ndarray, pages: list[int]) -> tuple[int, NaiveNode]:
        toks = tokens.tolist()
        p = self.page_size
        node = self.root
        existing = 0
        self.tick += 1
        for j, i in enumerate(range(0, len(toks), p)):
            key = tuple(toks[i : i + p])
            child = node.children.get(key)
            if child is None:
                child = NaiveNode(key, node, pages[j])
                node.children[key] = child
                self.size += 1
            else:
                existing += 1
            child.last_access = self.tick
            node = child
        return existing, node

    def lock(self, node: NaiveNode) -> None:
        n: NaiveNode | None = node
        while n is not None:
            n.lock_ref += 1
            n = n.parent

    def unlock(self, node: NaiveNode) -> None:
        n: NaiveNode | None = node
        while n is not None:
            n.lock_ref -= 1
            n = n.parent

    def evict(self, num_pages: int) -> list[int]:
        freed: list[int] = []
        while len(freed) < num_pages:
            leaves = [n for n in self._all() if not n.children and n.lock_ref == 0]
            if not leaves:
                break
            leaves.sort(key=lambda n: n.last_access)
            for leaf in leaves:
                if len(freed) >= num_pages:
                    break
                assert leaf.parent is not None
                del leaf.parent.children[leaf.key]
                freed.append(leaf.page)
                self.size -= 1
        return freed

    def _all(self) -> list[NaiveNode]:
        out: list[NaiveNode] = []
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out


def naive_page_hashes(tokens: np.ndarray, page_size: int) -> list[bytes]:
    """Per-page chained sha256 of a pickled (parent, tokens) tuple."""
    toks = tokens.tolist()
    out: list[bytes] = []
    parent = b""
    for i in range(0, len(toks) - len(toks) % page_size, page_size):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(toks[i : i + page_size])))).digest()
        out.append(parent)
    return out

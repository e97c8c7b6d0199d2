"""The request handle a model runner holds between admit and release."""

from __future__ import annotations

from typing import Any

import numpy as np

from radixcache.namespace import Namespace
from radixcache.node import Node, PageIds, TokenArray


class Request:
    """One sequence's view of the cache.

    Page table layout (positions ``[i*P, (i+1)*P)`` live in ``page_table[i]``)::

        page_table: [ shared (tree, locked) | private (this request's own) ]
                      0 .. shared_pages-1      shared_pages .. num_pages-1

    ``num_computed`` tokens have KV in the pages; ``reserved_tokens`` is how
    far pages were reserved. Shared pages are read-only: they may be used by
    other requests at the same time.

    The cache mutates handles; runners read them.
    """

    __slots__ = (
        "rid",
        "namespace",
        "priority",
        "_tokens",
        "num_tokens",
        "cached_len",
        "num_computed",
        "reserved_tokens",
        "_pages",
        "num_pages",
        "shared_pages",
        "locked_node",
        "released",
        "pending",
        "hit_device",
        "hit_host",
        "hit_storage",
    )

    def __init__(self, rid: int, namespace: Namespace, tokens: TokenArray, priority: int) -> None:
        self.rid = rid  # unique id within the cache
        self.namespace = namespace  # identity beyond tokens
        self.priority = priority  # for the priority eviction policy
        self._tokens = tokens  # all known tokens (buffer; first num_tokens valid)
        self.num_tokens = int(tokens.size)  # prompt + appended tokens
        self.cached_len = 0  # tokens found cached at admission
        self.num_computed = 0  # tokens whose KV is in the page table
        self.reserved_tokens = 0  # positions covered by reservations
        self._pages: PageIds = np.empty(max(4, tokens.size // 8), dtype=np.int32)
        self.num_pages = 0  # valid entries of the page table
        self.shared_pages = 0  # leading pages owned by the tree
        self.locked_node: Node | None = None  # node this request locks (None: nothing)
        self.released = False  # set by release
        self.pending: list[Any] = []  # tier loads this request waits for (oldest first)
        self.hit_device = 0  # prompt tokens found on the device at admission
        self.hit_host = 0  # ... in host memory (loaded back)
        self.hit_storage = 0  # ... in storage (prefetched)

    @property
    def tokens(self) -> TokenArray:
        """All known tokens (read-only view)."""
        view = self._tokens[: self.num_tokens]
        view.flags.writeable = False
        return view

    @property
    def ready(self) -> bool:
        """True when no page of ``page_table`` is still being loaded."""
        return not self.pending

    @property
    def page_table(self) -> PageIds:
        """Device page ids covering positions ``[0, reserved_tokens)`` (a view)."""
        return self._pages[: self.num_pages]

    def _append_pages(self, pages: PageIds) -> None:
        need = self.num_pages + pages.size
        if need > self._pages.size:
            grown = np.empty(max(need, 2 * self._pages.size), dtype=np.int32)
            grown[: self.num_pages] = self._pages[: self.num_pages]
            self._pages = grown
        self._pages[self.num_pages : need] = pages
        self.num_pages = need

    def _append_tokens(self, tokens: TokenArray) -> None:
        need = self.num_tokens + tokens.size
        if need > self._tokens.size or not self._tokens.flags.writeable:
            grown = np.empty(max(need, 2 * self._tokens.size, 16), dtype=np.int32)
            grown[: self.num_tokens] = self._tokens[: self.num_tokens]
            self._tokens = grown
        self._tokens[self.num_tokens : need] = tokens
        self.num_tokens = need

    def __repr__(self) -> str:
        return (
            f"Request(rid={self.rid}, tokens={self.num_tokens}, cached={self.cached_len}, "
            f"computed={self.num_computed}, pages={self.num_pages}, shared={self.shared_pages}, "
            f"released={self.released})"
        )

"""The request handle a model runner holds between admit and release."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from radixcache.errors import RequestStateError
from radixcache.namespace import Namespace
from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.tree.node import EMPTY_PAGES, InsertResult, Node, PageIds, TokenArray


_PAGE_ID = np.dtype(np.int32)


class RollBack(NamedTuple):
    """What ``Request.roll_back`` gave up."""

    lost_pages: int  # table pages from ``start_page`` on that left the cached prefix
    dropped: PageIds  # private pages that left the table (some may belong to jobs)


class Locks(Protocol):
    """The tree's lock counts (what a request's lock moves on)."""

    def lock(self, node: Node) -> None: ...

    def unlock(self, node: Node) -> None: ...


class PendingLoad(Protocol):
    """A tier job whose pages a request already has in its page table."""

    @property
    def start_page(self) -> int:
        """Index in the request's page table of the job's first page."""
        ...

    @property
    def before(self) -> Node | None:
        """The node the request held locked before this job started."""
        ...

    @property
    def num_pages(self) -> int:
        """Pages the job moves."""
        ...

    def done(self) -> bool:
        """The move finished (``poll`` has not necessarily applied it yet)."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the move finished or ``timeout`` passed; True if done."""
        ...

    def give_up(self) -> None:
        """The request no longer waits: the job finishes on its own and
        keeps (then frees or caches) its pages."""
        ...


class Request:
    """One sequence's view of the cache.

    Page table layout (positions ``[i*P, (i+1)*P)`` live in ``page_table[i]``)::

        page_table: [ shared (tree, locked) | private (this request's own) ]
                      0 .. shared_pages-1      shared_pages .. num_pages-1

    ``num_computed`` tokens have KV in the pages; ``reserved_tokens`` is how
    far pages were reserved. Shared pages are read-only: they may be used by
    other requests at the same time.

    Runners read handles; the cache and the tiers change them only through
    the methods below, each of which keeps the layout above consistent.
    """

    # (The compiled core builds and reads handles through these slots, in
    # this order: ``REQUEST_SLOTS`` of radixcache/native/lifecycle.pxi.)
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
        "forgets",
    )

    def __init__(
        self, rid: int, namespace: Namespace, tokens: TokenArray, priority: int, forgets: int = 0
    ) -> None:
        self.rid = rid  # unique id within the cache
        self.namespace = namespace  # identity beyond tokens
        self.priority = priority  # for the priority eviction policy
        self._tokens = tokens  # all known tokens (buffer; first num_tokens valid)
        self.num_tokens = tokens.size  # prompt + appended tokens
        self.cached_len = 0  # tokens found cached at admission
        self.num_computed = 0  # tokens whose KV is in the page table
        self.reserved_tokens = 0  # positions covered by reservations
        self._pages: PageIds = EMPTY_PAGES  # the page table (allocated by the first pages)
        self.num_pages = 0  # valid entries of the page table
        self.shared_pages = 0  # leading pages owned by the tree
        self.locked_node: Node | None = None  # node this request locks (None: nothing)
        self.released = False  # set by release
        self.pending: list[PendingLoad] = []  # tier loads this request waits for (oldest first)
        self.hit_device = 0  # prompt tokens found on the device at admission
        self.hit_host = 0  # ... in host memory (loaded back)
        self.hit_storage = 0  # ... in storage (prefetched)
        self.forgets = forgets  # times its namespace was forgotten before its cached prefix was taken

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

    def first_pages(self, pages: int, page_size: int) -> tuple[TokenArray, PageIds]:
        """The tokens and page ids of the first ``pages`` pages, as views (for
        the tree's insert, which copies what it keeps and writes neither)."""
        return self._tokens[: pages * page_size], self._pages[:pages]

    @property
    def page_table(self) -> PageIds:
        """Device page ids covering positions ``[0, reserved_tokens)`` (a view)."""
        return self._pages[: self.num_pages]

    # ------------------------------------------------------------------ state changes
    def _append_pages(self, pages: PageIds) -> None:
        if not pages.size:
            return  # (the table may still be the shared read-only empty one)
        need = self.num_pages + pages.size
        if need > self._pages.size:  # (room for the prompt's pages at the first)
            grown = np.empty(max(need, 2 * self._pages.size, self._tokens.size // 8), _PAGE_ID)
            grown[: self.num_pages] = self._pages[: self.num_pages]
            self._pages = grown
        self._pages[self.num_pages : need] = pages
        self.num_pages = need

    def _move_lock(self, locks: Locks, node: Node | None) -> None:
        """Hold ``node`` (None: nothing) instead of the current locked node."""
        if node is not None:
            locks.lock(node)
        if self.locked_node is not None:
            locks.unlock(self.locked_node)
        self.locked_node = node

    def _set_cached(self, pages: int, page_size: int) -> None:
        """The first ``pages`` pages are cached (shared, computed)."""
        self.shared_pages = pages
        self.cached_len = self.num_computed = pages * page_size

    def admit_cached(self, locks: Locks, node: Node | None, pages: PageIds, tokens: int) -> None:
        """At admission: ``tokens`` cached tokens in device ``pages``, up to
        ``node`` (locked for the request: a new handle holds no lock yet)."""
        if node is not None:
            locks.lock(node)
            self.locked_node = node
        if pages.size:
            self._append_pages(pages)
        self.shared_pages = self.num_pages
        self.cached_len = self.num_computed = self.reserved_tokens = tokens
        self.hit_device = tokens

    def take_loading(
        self, locks: Locks, node: Node | None, pages: PageIds, job: PendingLoad, page_size: int
    ) -> None:
        """Device ``pages`` that ``job`` is filling join the page table as
        cached; the request's lock moves to ``node`` (None: it stays)."""
        if node is not None:
            self._move_lock(locks, node)
        self._append_pages(pages)
        self._set_cached(self.num_pages, page_size)
        self.reserved_tokens = self.num_pages * page_size
        self.pending.append(job)

    def found_below(self, host: int = 0, storage: int = 0) -> None:
        """Prompt tokens found in host memory / storage at admission."""
        self.hit_host += host
        self.hit_storage += storage

    def loaded(self, job: PendingLoad) -> None:
        """``job``'s pages arrived."""
        self.pending.remove(job)

    def chain(
        self, locks: Locks, old: PendingLoad, new: PendingLoad, node: Node | None
    ) -> None:
        """``new`` finishes what ``old`` started (a fetch chains a load); the
        lock moves to ``node`` when given."""
        self.pending[self.pending.index(old)] = new
        if node is not None:
            self._move_lock(locks, node)

    def keep_first(self, pages: int, shared: int, page_size: int) -> None:
        """Only the first ``pages`` pages hold cached KV (the rest of the
        table stays reserved, the request's own, to compute into); the first
        ``shared`` of them are the tree's."""
        self.shared_pages = shared
        self.cached_len = self.num_computed = pages * page_size

    def roll_back(
        self,
        locks: Locks,
        start_page: int,
        before: Node | None,
        page_size: int,
        keep_private: PageIds | None = None,
    ) -> RollBack:
        """Give up every pending load from page ``start_page`` on: the request
        recomputes from there. Its lock goes back to ``before``. With
        ``keep_private``, those device pages stay in the table as its own
        (free to compute into). Returns the pages given up and the private
        pages that left the table (the caller frees those no job owns: e.g.
        the pages after a short fetch, which were the request's to compute)."""
        lost = self.num_pages - start_page
        dropped = self._pages[max(start_page, self.shared_pages) : self.num_pages].copy()
        keep = next(i for i, j in enumerate(self.pending) if j.start_page >= start_page)
        for job in self.pending[keep:]:
            job.give_up()
        del self.pending[keep:]
        self._move_lock(locks, before)
        self.num_pages = start_page
        if keep_private is not None:
            self._append_pages(keep_private)
        self._set_cached(start_page, page_size)
        self.reserved_tokens = self.num_pages * page_size
        return RollBack(lost, dropped)

    def add_pages(self, pages: PageIds, reserved_tokens: int) -> None:
        """Private pages reserved up to position ``reserved_tokens``."""
        if pages.size:
            self._append_pages(pages)
        self.reserved_tokens = reserved_tokens

    def may_insert(self, forgets: int) -> bool:
        """Whether this request's pages may join the tree, its namespace having
        been forgotten ``forgets`` times so far: not if it was admitted before
        the last forget (its KV belongs to the forgotten incarnation; its
        pages stay its own and are freed at release)."""
        return forgets == self.forgets

    def check_commit(self, num_tokens: int) -> None:
        """Raise (changing nothing) unless ``num_tokens`` more positions may
        be committed: within the reservation and the known tokens, and none
        while loads are pending (the prefetch policy may give them up and
        move ``num_computed`` back under the positions the runner wrote:
        ``reserve`` settles that first)."""
        if num_tokens and self.pending:
            raise RequestStateError(
                f"request {self.rid} has loads pending: reserve() it first (which applies "
                f"the prefetch policy), then write and commit"
            )
        end = self.num_computed + num_tokens
        if end > self.reserved_tokens:
            raise ValueError(
                f"commit of {num_tokens} tokens reaches position {end}, "
                f"but only {self.reserved_tokens} were reserved"
            )
        if end > self.num_tokens:
            raise ValueError(
                f"commit of {num_tokens} tokens reaches position {end}, "
                f"but the request has {self.num_tokens} tokens; extend() it first"
            )

    def computed(self, end: int) -> None:
        """KV is written up to position ``end``."""
        self.num_computed = end

    def unlock(self, locks: Locks) -> None:
        """Drop the request's lock (before its pages are inserted)."""
        self._move_lock(locks, None)

    def inserted(self, locks: Locks, result: InsertResult, dup_to: int) -> PageIds:
        """The tree took the insert ``result``: its first ``inserted_pages``
        pages are now the tree's, up to its ``last_node``. Pages
        ``[shared_pages, dup_to)`` were cached already: the table takes the
        tree's pages for them; returns this request's copies (for the caller
        to free)."""
        dup_from = self.shared_pages
        full = result.inserted_pages
        if dup_to > dup_from:
            table = self.page_table
            dup = table[dup_from:dup_to].copy()
            table[dup_from:dup_to] = result.device_pages[dup_from:dup_to]  # (built here only)
        else:
            dup = EMPTY_PAGES
        if full:
            self._move_lock(locks, result.last_node)
        self.shared_pages = full
        return dup

    def end(self, locks: Locks) -> PageIds:
        """Release: unlock, and return the private pages (for the caller to free)."""
        if self.locked_node is not None:
            locks.unlock(self.locked_node)
            self.locked_node = None
        shared = self.shared_pages
        private = self._pages[shared : self.num_pages].copy() if self.num_pages > shared else EMPTY_PAGES
        self.num_pages = shared
        self.released = True
        return private

    def end_forced(self) -> None:
        """The cache dropped everything (a forced reset): the handle is dead."""
        self.released = True
        self.locked_node = None
        self.num_pages = 0
        self.pending = []

    def append_tokens(self, tokens: TokenArray) -> None:
        """Tokens the runner produced (decode)."""
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


append_pages_reference = Request._append_pages  # what the compiled append is held to (tests)
if native_core is not None:  # the same append without numpy's slicing (radixcache/native/_core.pyx)
    Request._append_pages = native_core.append_pages  # type: ignore[method-assign]

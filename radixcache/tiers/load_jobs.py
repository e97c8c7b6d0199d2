"""The tier jobs that bring pages up: host -> device, storage -> host.

``LoadJob`` copies host-only nodes back into device pages of the tree;
``PrivateLoadJob`` copies fetched pages into a request's own device pages
(the tree got them from elsewhere meanwhile); ``FetchJob`` reads a
request's next pages from storage into host pages, hangs them as a
host-only leaf and chains a ``LoadJob``.

Loads and fetches started for a request are in its ``pending`` list: the
request already has their device pages in its page table. ``give_up()``
detaches the request (it recomputes those pages); the job then lands on its
own and frees what nobody uses. A namespace forgotten while a fetch was in
flight makes the fetch land nowhere. See radixcache/tiers/jobs.py for the contract
every job keeps.
"""

from __future__ import annotations

import numpy as np

from radixcache.namespace import Namespace
from radixcache.tiers.jobs import JobRuntime, TierJob, pieces, share_out
from radixcache.tree.node import EMPTY_PAGES, Node, PageIds, TokenArray
from radixcache.request import Request



class LoadJob(TierJob):
    """Host -> device copy of a run of host-only nodes; lands as their device
    pages. ``prepare`` takes the holds, then ``start`` or ``cancel``."""

    loading = True

    def __init__(
        self,
        rt: JobRuntime,
        nodes: list[Node],
        req: Request | None,
        before: Node | None,
        start_page: int,
    ) -> None:
        super().__init__(rt)
        self.last = nodes[-1]
        self.pages = sum(int(n.key.size) for n in nodes) // rt.page_size
        self.req = req  # the request waiting for it (None once given up)
        self.before = before  # the request's lock before this load (for a rollback)
        self.start_page = start_page  # index in the request's table of the first page
        self.namespace = self.last.namespace
        rt.tree.lock(self.last)  # protect the nodes first: making room may evict host pages
        rt.index.hold(nodes, loading=True)
        self._nodes = nodes

    def start(self, host_pages: PageIds, device_pages: PageIds) -> None:
        """Copy ``host_pages`` into ``device_pages``; those count against the
        tenant's device limit from now until the load lands."""
        self._submitted(self.rt.controller.load(host_pages, device_pages, self))
        self.rt.index.reserve_load(self.namespace, self.pages)

    def cancel(self) -> None:
        """Not started after all (no device room): release the holds."""
        self.rt.index.release(self._nodes, loading=True)
        self.rt.tree.unlock(self.last)

    def give_up(self) -> None:
        self.req = None

    def held(self) -> list[Node]:
        return pieces(self.last, self.pages, self.rt.page_size)

    def lock(self) -> Node | None:
        return self.last

    def device_pages(self) -> PageIds:
        pages = self.submitted.device_pages
        assert pages is not None
        return pages

    def device_reserved(self) -> tuple[Namespace, int] | None:
        return self.namespace, self.pages

    def _land(self, ok: bool) -> None:
        rt = self.rt
        rt.index.settle_load(self.namespace, self.pages)  # attached below, or freed
        nodes = self.held()
        rt.index.release(nodes, loading=True)
        rt.tree.unlock(self.last)
        device = self.device_pages()
        first_parent = nodes[0].parent
        ok = ok and (
            first_parent is None or first_parent.parent is None or first_parent.device is not None
        )
        if ok and self.req is None and not rt.index.load_fits(self.namespace, self.pages):
            ok = False  # nobody waits, and its tenant's limit was lowered meanwhile: freed
        if ok:
            for node, pages in share_out(nodes, device, rt.page_size):
                rt.tree.below.attach_device(node, pages)
            rt.index.eviction.track_all(nodes)  # on the device again: host victims once free
        else:
            rt.free_device(device)
        req = self.req
        if req is None:
            return
        if ok:
            req.loaded(self)
            rt.counters.loaded_tokens += self.pages * rt.page_size
        else:
            rt.roll_back(req, self.start_page, self.before)


class PrivateLoadJob(TierJob):
    """Host -> device copy of fetched pages into a request's own device pages
    (the tree got the same pages from elsewhere meanwhile): nothing enters the
    tree; the request's next commit finds them cached and frees its copies."""

    def __init__(
        self,
        rt: JobRuntime,
        host_pages: PageIds,
        device_pages: PageIds,
        req: Request,
        before: Node | None,
        start_page: int,
    ) -> None:
        super().__init__(rt)
        self.req: Request | None = req
        self.before = before
        self.start_page = start_page
        self._submitted(rt.controller.load(host_pages, device_pages, self))

    def give_up(self) -> None:
        self.req = None

    def host_pages(self) -> PageIds:
        return self.submitted.host_pages

    def device_pages(self) -> PageIds:
        pages = self.submitted.device_pages
        assert pages is not None
        return pages if self.req is None else EMPTY_PAGES  # else: the request's own

    def _land(self, ok: bool) -> None:
        rt = self.rt
        rt.index.pool.free(self.submitted.host_pages)
        req = self.req
        device = self.submitted.device_pages
        assert device is not None
        if req is None:
            rt.free_device(device)
        elif ok:
            req.loaded(self)
            rt.counters.loaded_tokens += int(device.size) * rt.page_size
        else:
            rt.roll_back(req, self.start_page, self.before, keep_private=device)


class FetchJob(TierJob):
    """Storage -> host read of a request's next pages; lands as a host-only,
    stored leaf and chains a LoadJob into the device pages the request holds."""

    def __init__(
        self,
        rt: JobRuntime,
        req: Request,
        parent: Node | None,
        tokens: TokenArray,
        start: int,
        keys: list[bytes],
        host_pages: PageIds,
        device_pages: PageIds,
        epoch: int,
    ) -> None:
        super().__init__(rt)
        p = rt.page_size
        n = len(keys)
        self.req: Request | None = req  # the request waiting for it (None once given up)
        self.parent = parent  # the node the pages hang under (None: the namespace root)
        self.namespace = req.namespace
        self.tokens = tokens[: start + n * p].copy()  # the whole prefix, to the last fetched page
        self.start = start  # tokens before the fetched pages
        self.dev = device_pages  # allocated for the load that follows
        self.before = req.locked_node  # the request's lock before this fetch
        self.start_page = req.num_pages  # index in the request's table of the first page
        self.epoch = epoch  # the namespace's forget count at submission
        self.keys = keys  # (retention: the records' deadlines date the pages that land)
        self._submitted(
            rt.controller.fetch(
                keys, self.tokens[start:].reshape(n, p), host_pages, self.namespace.digest(), self,
                self.namespace.tenant,
            )  # fmt: skip
        )
        rt.index.reserve_load(self.namespace, n)  # until it lands (a chained load takes over)

    def give_up(self) -> None:
        self.req = None

    def host_pages(self) -> PageIds:
        return self.submitted.host_pages

    def host_reserved(self) -> tuple[Namespace, int] | None:
        return self.namespace, self.submitted.num_pages

    def device_pages(self) -> PageIds:
        return self.dev

    def device_reserved(self) -> tuple[Namespace, int] | None:
        return self.namespace, self.submitted.num_pages

    def _land(self, ok: bool) -> None:
        rt = self.rt
        p = rt.page_size
        move = self.submitted
        n = move.num_pages
        rt.index.settle(self.namespace, n)  # attached below (those that arrived), or freed
        rt.index.settle_load(self.namespace, n)  # a chained LoadJob reserves what it loads
        got = int(move.ticket.result()) if ok else 0
        if not rt.may_land(self.namespace, self.epoch):
            got = 0  # the namespace was forgotten meanwhile: nothing of it lands
        host = move.host_pages
        pool = rt.index.pool
        node = self._attach(host[:got]) if got else None
        req = self.req
        if node is None and got and req is not None:
            # Verified, but the tree has these pages already: the request loads
            # its copy privately (host pages are freed when that load is done).
            pool.free(host[got:])
            private = PrivateLoadJob(rt, host[:got], self.dev[:got], req, self.before, self.start_page)
            req.chain(rt.tree, self, private, None)
            rt.counters.storage_hit_tokens += got * p  # served: verified, for a waiting request
            req.keep_first(self.start_page + got, self.start_page, p)
            rt.counters.abandoned_tokens += (n - got) * p
            return
        if node is None:  # nothing usable arrived, or nobody waits for it
            pool.free(host)
        elif got < n:
            pool.free(host[got:])
        if req is None:
            rt.free_device(self.dev)
            return
        if node is None:
            rt.roll_back(req, self.start_page, self.before, keep_private=self.dev)
            return
        # Chain a LOAD of the fetched pages into the request's device pages.
        rt.counters.storage_hit_tokens += got * p  # served: verified, for a waiting request
        load = LoadJob(rt, [node], req, self.before, self.start_page)
        load.start(host[:got], self.dev[:got])
        req.chain(rt.tree, self, load, node)
        if got < n:  # the rest becomes the request's to compute
            cut = self.start_page + got
            req.keep_first(cut, cut, p)
            rt.counters.abandoned_tokens += (n - got) * p

    def _attach(self, host_pages: PageIds) -> Node | None:
        """Hang the fetched pages (exactly those that arrived) as one host-only
        leaf under ``parent``, if it is still in the tree and no one cached
        these pages meanwhile; else None."""
        rt = self.rt
        parent = self.parent
        if parent is not None and not rt.tree.below.is_attached(parent):
            return None
        end = self.start + int(host_pages.size) * rt.page_size
        leaf = rt.tree.below.add_leaf(self.namespace, parent, self.tokens[self.start : end])
        if leaf is None:
            return None
        rt.index.attach_stored(leaf, np.array(host_pages, dtype=np.int32))
        if rt.date_fetched is not None:
            rt.date_fetched(leaf, self.keys[: int(host_pages.size)])
        return leaf

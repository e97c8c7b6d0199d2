"""Tier jobs: one class per page move, each owning its holds and its landing.

Every move between tiers is one ``TierJob``. A job takes its holds when it
starts (tree locks, node holds, pages it owns), submits its copy or storage
operation to the offload controller, and applies the result in
``finish(ok)``, called by ``HostTiers.poll()`` on the owner thread once the
move is done. ``finish`` releases every hold the job took; no other code
releases them, and ``check_integrity`` compares every node's holds with those
the live jobs account for::

    kind          moves                holds while in flight                 lands as
    BackupJob     device -> host       lock + hold on its nodes;             host copies -> StoreJob
                                       owns the host pages
    StoreJob      host -> storage      hold on its nodes (reads host pages   ``stored`` + DISK events
                                       only: loads of them still proceed)
    LoadJob       host -> device       lock + hold + loading on its nodes;   device pages in the tree
                                       owns the device pages
    PrivateLoadJob host -> device      owns the host pages                   the request's own pages
    FetchJob      storage -> host      owns host and device pages            a host-only leaf -> LoadJob

Loads and fetches started for a request are in its ``pending`` list: the
request already has their device pages in its page table. ``give_up()``
detaches the request (it recomputes those pages); the job then lands on its
own and frees what nobody uses. A namespace forgotten while a fetch was in
flight makes the fetch land nowhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

import numpy as np

from radixcache.host_index import HostIndex
from radixcache.namespace import Namespace
from radixcache.node import EMPTY_PAGES, Node, PageIds, TokenArray
from radixcache.offload.controller import Job, OffloadController
from radixcache.request import Request
from radixcache.survivors import put_meta
from radixcache.tier_config import TierCounters
from radixcache.tree import RadixTree


class JobRuntime(Protocol):
    """What jobs use of the tiers that run them (``HostTiers``)."""

    tree: RadixTree
    index: HostIndex
    controller: OffloadController
    counters: TierCounters
    page_size: int
    jobs: dict[TierJob, None]  # live jobs, in submission order

    def free_device(self, pages: PageIds) -> None: ...

    def store(self, nodes: list[Node]) -> None: ...

    def may_land(self, namespace: Namespace, epoch: int) -> bool: ...

    def roll_back(
        self, req: Request, start_page: int, before: Node | None, keep_private: PageIds | None = None
    ) -> None: ...


def share_out(nodes: list[Node], pages: PageIds, page_size: int) -> list[tuple[Node, PageIds]]:
    """Split a run of page ids over the nodes (path order) that hold it."""
    out = []
    offset = 0
    for node in nodes:
        n = int(node.key.size) // page_size
        out.append((node, pages[offset : offset + n]))
        offset += n
    return out


class TierJob(ABC):
    """One page move in flight. Created and finished on the owner thread."""

    loading: ClassVar[bool] = False  # whether its holds mark nodes as loading

    def __init__(self, rt: JobRuntime) -> None:
        self.rt = rt
        self.move: Job | None = None  # the controller's record, once submitted

    def _submitted(self, move: Job) -> None:
        self.move = move
        self.rt.jobs[self] = None

    @property
    def submitted(self) -> Job:
        assert self.move is not None, "job not submitted"
        return self.move

    def finish(self, ok: bool) -> None:
        """The move is done: apply it and release every hold (``JobOwner``)."""
        del self.rt.jobs[self]
        self._land(ok)

    @abstractmethod
    def _land(self, ok: bool) -> None: ...

    # What the job holds, for check_integrity (and for the cache's page count).
    def held(self) -> list[Node]:
        """Nodes whose ``holds`` count this job (their current pieces)."""
        return []

    def lock(self) -> Node | None:
        """The node this job keeps one tree lock on."""
        return None

    def host_pages(self) -> PageIds:
        """Host pages this job owns (not the tree's)."""
        return EMPTY_PAGES

    def device_pages(self) -> PageIds:
        """Device pages this job owns (neither the tree's nor a request's)."""
        return EMPTY_PAGES

    @property
    def num_pages(self) -> int:
        return self.submitted.num_pages

    def wait(self, timeout: float | None = None) -> bool:
        return self.rt.controller.wait(self.submitted, timeout)

    def before_forget(self, namespace: Namespace) -> None:
        """``namespace``'s stored records are about to be deleted: a job
        writing some of them must finish first (else they would outlive the
        forget). Others do nothing: what they bring lands nowhere."""

    def done(self) -> bool:
        return self.submitted.ticket.done()


class BackupJob(TierJob):
    """Device -> host copy of one node's pages; lands as its host copy."""

    def __init__(self, rt: JobRuntime, node: Node, host_pages: PageIds) -> None:
        super().__init__(rt)
        assert node.device is not None
        self.last = node
        self.pages = int(host_pages.size)
        rt.tree.lock(node)
        rt.index.hold([node])
        self._submitted(rt.controller.backup(node.device.copy(), host_pages, self))

    def held(self) -> list[Node]:
        return self.rt.tree.pieces(self.last, self.pages)

    def lock(self) -> Node | None:
        return self.last

    def host_pages(self) -> PageIds:
        return self.submitted.host_pages

    def _land(self, ok: bool) -> None:
        rt = self.rt
        nodes = self.held()
        rt.index.release(nodes)
        rt.tree.unlock(self.last)
        if not ok:
            rt.index.pool.free(self.submitted.host_pages)
            return
        for node, pages in share_out(nodes, self.submitted.host_pages, rt.page_size):
            rt.index.attach(node, pages)
        if rt.tree.is_attached(self.last):  # a forgotten namespace stores nothing
            rt.store(nodes)


class StoreJob(TierJob):
    """Host -> storage write of a run of nodes' host copies."""

    def __init__(
        self,
        rt: JobRuntime,
        nodes: list[Node],
        keys: list[bytes],
        tokens: TokenArray,
        host: PageIds,
        epoch: int,
    ) -> None:
        super().__init__(rt)
        self.last = nodes[-1]
        self.pages = len(keys)
        self.keys = keys
        self.namespace = self.last.namespace
        self.epoch = epoch  # the namespace's forget count at submission
        rt.index.hold(nodes)  # the host copies stay; the device copies stay evictable
        meta = put_meta(rt.tree.ids, nodes)  # event ids, parent, depth: survivors after a restart
        self._submitted(
            rt.controller.store(keys, tokens, host, self.namespace.digest(), self, meta)
        )

    def held(self) -> list[Node]:
        return self.rt.tree.pieces(self.last, self.pages)

    def before_forget(self, namespace: Namespace) -> None:
        if namespace == self.namespace:
            self.wait()

    def _land(self, ok: bool) -> None:
        rt = self.rt
        nodes = self.held()
        rt.index.release(nodes)
        wrote = rt.index.take_written(self.keys)  # (a shared pool: the pages to announce)
        if not ok or not rt.may_land(self.namespace, self.epoch):
            return  # (a forget waited for this write, then deleted what it wrote)
        if not rt.tree.is_attached(self.last):
            return
        committed = int(self.submitted.ticket.result())
        offset = 0
        for node in nodes:
            n = int(node.key.size) // rt.page_size
            # A hint that spares a second write; storage may evict the pages
            # later (announced through take_removed), leaving it stale.
            rt.index.mark_stored(node, 0, max(0, min(n, committed)), wrote[offset : offset + n])
            committed -= n
            offset += n


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
        rt.tree.lock(self.last)  # protect the nodes first: making room may evict host pages
        rt.index.hold(nodes, loading=True)
        self._nodes = nodes

    def start(self, host_pages: PageIds, device_pages: PageIds) -> None:
        self._submitted(self.rt.controller.load(host_pages, device_pages, self))

    def cancel(self) -> None:
        """Not started after all (no device room): release the holds."""
        self.rt.index.release(self._nodes, loading=True)
        self.rt.tree.unlock(self.last)

    def give_up(self) -> None:
        self.req = None

    def held(self) -> list[Node]:
        return self.rt.tree.pieces(self.last, self.pages)

    def lock(self) -> Node | None:
        return self.last

    def device_pages(self) -> PageIds:
        pages = self.submitted.device_pages
        assert pages is not None
        return pages

    def _land(self, ok: bool) -> None:
        rt = self.rt
        nodes = self.held()
        rt.index.release(nodes, loading=True)
        rt.tree.unlock(self.last)
        device = self.device_pages()
        first_parent = nodes[0].parent
        ok = ok and (
            first_parent is None or first_parent.parent is None or first_parent.device is not None
        )
        if ok:
            for node, pages in share_out(nodes, device, rt.page_size):
                rt.tree.attach_device(node, pages)
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
        self._submitted(
            rt.controller.fetch(
                keys, self.tokens[start:].reshape(n, p), host_pages, self.namespace.digest(), self
            )
        )

    def give_up(self) -> None:
        self.req = None

    def host_pages(self) -> PageIds:
        return self.submitted.host_pages

    def device_pages(self) -> PageIds:
        return self.dev

    def _land(self, ok: bool) -> None:
        rt = self.rt
        p = rt.page_size
        move = self.submitted
        n = move.num_pages
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
        if parent is not None and not rt.tree.is_attached(parent):
            return None
        end = self.start + int(host_pages.size) * rt.page_size
        leaf = rt.tree.add_leaf(self.namespace, parent, self.tokens[self.start : end])
        if leaf is None:
            return None
        rt.index.attach_stored(leaf, np.array(host_pages, dtype=np.int32))
        return leaf

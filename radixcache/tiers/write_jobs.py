"""The tier jobs that move pages down: device -> host -> storage.

``BackupJob`` copies a node's device pages to host pages; when it lands, the
node has a host copy and the write goes on to storage (``JobRuntime.store``).
``StoreJob`` writes a run of nodes' host copies to storage; it only reads the
host pages, so a load back of the same pages proceeds meanwhile. See
radixcache/tiers/jobs.py for the contract every job keeps (holds taken at start,
released in ``finish``).
"""

from __future__ import annotations

from radixcache.tiers.jobs import JobRuntime, TierJob, pieces, share_out
from radixcache.namespace import Namespace
from radixcache.tree.node import Node, PageIds, TokenArray
from radixcache.tiers.survivors import put_meta



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
        return pieces(self.last, self.pages, self.rt.page_size)

    def lock(self) -> Node | None:
        return self.last

    def host_pages(self) -> PageIds:
        return self.submitted.host_pages

    def host_reserved(self) -> tuple[Namespace, int] | None:
        return self.last.namespace, self.pages

    def _land(self, ok: bool) -> None:
        rt = self.rt
        nodes = self.held()
        rt.index.release(nodes)
        rt.tree.unlock(self.last)
        rt.index.settle(self.last.namespace, self.pages)  # attached below, or freed
        if not ok:
            rt.index.pool.free(self.submitted.host_pages)
            return
        for node, pages in share_out(nodes, self.submitted.host_pages, rt.page_size):
            rt.index.attach(node, pages)
        if rt.tree.below.is_attached(self.last):  # a forgotten namespace stores nothing
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
        meta = put_meta(rt.tree.ids, nodes, rt.put_extras)  # event ids, parent, depth: survivors after a restart
        self._submitted(
            rt.controller.store(
                keys, tokens, host, self.namespace.digest(), self, meta, self.namespace.tenant
            )
        )

    def held(self) -> list[Node]:
        return pieces(self.last, self.pages, self.rt.page_size)

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
        if not rt.tree.below.is_attached(self.last):
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

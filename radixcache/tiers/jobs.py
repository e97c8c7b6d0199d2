"""Tier jobs: one class per page move, each owning its holds and its landing.

Every move between tiers is one ``TierJob``. A job takes its holds when it
starts (tree locks, node holds, pages it owns), submits its copy or storage
operation to the offload controller, and applies the result in
``finish(ok)``, called by ``HostTiers.poll()`` on the owner thread once the
move is done. ``finish`` releases every hold the job took (and settles the
host pages allocated for it, and the device pages a load brings into the
tree, in the tenants' ledger); no other code
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

This module has the contract (``JobRuntime``, what jobs use of the tiers;
``TierJob``, the base class). The kinds live by direction:
radixcache/tiers/write_jobs.py (backup, store: pages going down) and
radixcache/tiers/load_jobs.py (load, private load, fetch: pages coming up).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, Protocol

from radixcache.tiers.host_index import HostIndex
from radixcache.namespace import Namespace
from radixcache.tree.node import EMPTY_PAGES, Node, PageIds
from radixcache.offload import Job, OffloadController
from radixcache.request import Request
from radixcache.tiers.config import TierCounters
from radixcache.tiers.survivors import PutExtras
from radixcache.tree.radix_tree import RadixTree



class JobRuntime(Protocol):
    """What jobs use of the tiers that run them (``HostTiers``)."""

    tree: RadixTree
    index: HostIndex
    controller: OffloadController
    counters: TierCounters
    page_size: int
    jobs: dict[TierJob, None]  # live jobs, in submission order
    put_extras: PutExtras | None  # a store's retention deadline and tags (None: none)
    date_fetched: Callable[[Node, list[bytes]], None] | None  # retention: date pages read back

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


def pieces(last: Node, pages: int, page_size: int) -> list[Node]:
    """The nodes, in path order, that now hold a run of ``pages`` pages
    ending with ``last``'s last page (a node split while a job was in
    flight became a chain of pieces)."""
    out: list[Node] = []
    node: Node | None = last
    while pages > 0:
        assert node is not None and node.parent is not None, "job pages outside the tree"
        out.append(node)
        pages -= node.key.size // page_size
        node = node.parent
    assert pages == 0, "a job's run does not end on a node boundary"
    out.reverse()
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

    def host_reserved(self) -> tuple[Namespace, int] | None:
        """The namespace and count of the host pages ``allocate_host`` gave
        this job (settled in the ledger when it lands); None if none."""
        return None

    def device_pages(self) -> PageIds:
        """Device pages this job owns (neither the tree's nor a request's)."""
        return EMPTY_PAGES

    def device_reserved(self) -> tuple[Namespace, int] | None:
        """The namespace and count of the device pages this job brings into
        the tree (a load: reserved against its tenant's device limit until
        it lands, ``HostIndex.reserve_load``); None if none."""
        return None

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

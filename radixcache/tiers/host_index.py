"""Residency below the device: host copies, stored pages and job holds, per node.

``HostIndex`` is the ``LowerTiers`` the tree is built with. It owns, on every
tree node, four fields the tree never reads (they sit on the node for speed):

* ``host``: host page ids of the node's pages, or None (owned by this index:
  it frees them to the host pool when the copy goes);
* ``stored``: a hint that every page is committed to storage (storage may
  evict them later: it is not a promise);
* ``holds``: tier jobs in flight on the node's pages (backup, store, load):
  a held node stays in the tree and keeps its host copy;
* ``loading``: of those, loads writing its device pages: no insert adopts
  the node and no second load starts meanwhile.

Which host copies go first when the host pool is short is ``HostEviction``'s
(radixcache/tiers/host_eviction.py): every residency change below keeps it
current, so host eviction never walks the tree.

Every host copy is counted for its tenant in the ledger (``HostLedger``,
the cache's ``radixcache.tenants.TenantLedger``) wherever ``host`` is set or
cleared, so per-tenant host counts are exact at all times.

A store only reads host pages: it holds the node (so the host copy stays)
but does not mark it loading, so a load-back of the same pages proceeds
(invariant 11). A node split while a job is in flight passes its holds to
both pieces; the job finds them again with ``jobs.pieces``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Protocol

import numpy as np

from radixcache.events.types import Medium
from radixcache.namespace import Namespace
from radixcache.offload import HostPool
from radixcache.tiers.host_eviction import HostEviction
from radixcache.tree.node import EMPTY_PAGES, Node, PageIds
from radixcache.tree.policies import EvictionPolicy
from radixcache.tree.recording import Recorder

CPU_PINNED: Final = "CPU_PINNED"  # the host medium, as the recorder names it
DISK: Final = "DISK"  # the storage medium


class HostLedger(Protocol):
    """Per-tenant host page counts the index keeps exact (the cache's
    ``radixcache.tenants.TenantLedger``); the index only reports to it."""

    def add_host(self, namespace: Namespace, n: int) -> None: ...
    def sub_host(self, namespace: Namespace, n: int) -> None: ...
    def settle_host(self, namespace: Namespace, n: int) -> None: ...
    def reserve_load(self, namespace: Namespace, n: int) -> None: ...
    def settle_load(self, namespace: Namespace, n: int) -> None: ...
    def load_fits(self, namespace: Namespace, n: int) -> bool: ...
    def clear_host(self) -> None: ...
    def check_host(
        self, held: Mapping[Namespace, int], in_flight: Iterable[tuple[Namespace, int]]
    ) -> None: ...
    def check_loads(self, in_flight: Iterable[tuple[Namespace, int]]) -> None: ...


class NoHostLedger:
    """No per-tenant accounting (an index built on its own, in tests)."""

    def add_host(self, namespace: Namespace, n: int) -> None:
        pass

    def sub_host(self, namespace: Namespace, n: int) -> None:
        pass

    def settle_host(self, namespace: Namespace, n: int) -> None:
        pass

    def reserve_load(self, namespace: Namespace, n: int) -> None:
        pass

    def settle_load(self, namespace: Namespace, n: int) -> None:
        pass

    def load_fits(self, namespace: Namespace, n: int) -> bool:
        return True

    def clear_host(self) -> None:
        pass

    def check_loads(self, in_flight: Iterable[tuple[Namespace, int]]) -> None:
        pass

    def check_host(
        self, held: Mapping[Namespace, int], in_flight: Iterable[tuple[Namespace, int]]
    ) -> None:
        pass


class HostIndex:
    """Host/storage residency and job holds of tree nodes. Owner thread only."""

    def __init__(
        self,
        pool: HostPool,
        recorder: Recorder,
        page_size: int,
        policy: EvictionPolicy,
        ledger: HostLedger | None = None,
    ) -> None:
        self.pool = pool
        self.page_size = page_size
        self.recorder = recorder
        self.ledger: HostLedger = NoHostLedger() if ledger is None else ledger
        self.host_pages = 0  # host pages held by nodes
        # host copies in the tree's policy order (per tenant with quotas:
        # radixcache/tenants/host.py replaces it while the index is empty)
        self.eviction = HostEviction(policy)
        # The storage tier's event medium (HostTiers sets it): DISK announces
        # every page stored or read back; EXTERNAL (a shared pool) only the
        # pages this engine wrote, which ``note_written`` collects and the
        # landing store jobs take (``take_written``).
        self.storage_medium: Medium = DISK
        self._written: set[bytes] = set()

    # ------------------------------------------------------------------ LowerTiers
    def resident(self, node: Node) -> bool:
        return node.host is not None

    def adoptable(self, node: Node) -> bool:
        return node.loading == 0

    def bare(self, node: Node) -> bool:
        return node.host is None and not node.stored and node.holds == 0

    def held(self, node: Node) -> bool:
        return node.holds > 0

    def split(self, upper: Node, lower: Node, pages: int) -> None:
        if lower.host is not None:
            upper.host = lower.host[:pages]
            lower.host = lower.host[pages:]
        upper.stored = lower.stored
        upper.holds = lower.holds  # a job in flight covers both pieces
        upper.loading = lower.loading
        self.eviction.track(upper)

    def discard(self, node: Node) -> None:
        assert node.holds == 0, f"{node!r} left the tree while a job holds it"
        pages = node.host
        if pages is not None:
            self.recorder.removed(node, CPU_PINNED)
            node.host = None
            self.host_pages -= pages.size
            self.ledger.sub_host(node.namespace, int(pages.size))
            self.pool.free(pages)
            self.eviction.untrack(node)
        parent = node.parent
        if parent is not None and parent.host is not None:
            self.eviction.track(parent)  # it may have lost its last child

    def forgotten(self, node: Node) -> None:
        if node.host is not None:
            self.recorder.removed(node, CPU_PINNED)

    # ------------------------------------------------------------------ residency
    def attach(self, node: Node, pages: PageIds) -> None:
        """``node``'s pages now also live in host ``pages`` (owned from now on)."""
        assert node.host is None and node.parent is not None
        assert pages.size * self.page_size == node.key.size, "host pages do not cover the node"
        node.host = pages
        self.host_pages += pages.size
        self.ledger.add_host(node.namespace, int(pages.size))
        self.recorder.stored(node, 0, int(pages.size), CPU_PINNED)
        self.eviction.track(node)

    def attach_stored(self, node: Node, pages: PageIds) -> None:
        """A node read back from storage: host ``pages``, stored."""
        self.attach(node, pages)
        node.stored = True
        if self.storage_medium == DISK:  # a shared pool's pages were announced by their writer
            self.recorder.stored(node, 0, int(pages.size), DISK)  # to this publisher's consumers

    def mark_stored(
        self, node: Node, start: int, count: int, wrote: Sequence[bool] = ()
    ) -> None:
        """Pages ``[start, start+count)`` of ``node`` were committed to storage;
        on a shared pool, ``wrote[i]`` says whether this engine wrote page
        ``start + i`` (only those are announced)."""
        if count > 0 and self.storage_medium == DISK:
            self.recorder.stored(node, start, count, DISK)
        elif count > 0:
            run = 0  # announce each run of pages this engine wrote
            for i in range(count + 1):
                if i < count and i < len(wrote) and wrote[i]:
                    run += 1
                elif run:
                    self.recorder.stored(node, start + i - run, run, self.storage_medium)
                    run = 0
        if start + count >= node.key.size // self.page_size:
            node.stored = True

    def note_written(self, keys: Iterable[bytes]) -> None:
        """Page keys this engine wrote into a shared pool (``Storage.take_written``)."""
        self._written.update(keys)

    def take_written(self, keys: Sequence[bytes]) -> list[bool]:
        """For a landing store job: which of its ``keys`` this engine wrote
        (forgotten here once taken)."""
        if not self._written:
            return [False] * len(keys)
        wrote = [k in self._written for k in keys]
        self._written.difference_update(keys)
        return wrote

    def drop(self, node: Node) -> PageIds:
        """Remove ``node``'s host copy (host eviction); returns its pages, still
        allocated (the caller frees them or reuses them)."""
        pages = node.host
        assert pages is not None and node.holds == 0 and node.lock_ref == 0
        self.recorder.removed(node, CPU_PINNED)
        node.host = None
        self.host_pages -= pages.size
        self.ledger.sub_host(node.namespace, int(pages.size))
        self.eviction.untrack(node)
        return pages

    def settle(self, namespace: Namespace, n: int) -> None:
        """A job's ``n`` host pages, allocated for ``namespace`` (reserved for
        its tenant with quotas on), landed or went back to the pool. Called
        once per allocation (``HostTiers.allocate_host``), before the pages
        are attached."""
        self.ledger.settle_host(namespace, n)

    def reserve_load(self, namespace: Namespace, n: int) -> None:
        """A load of ``n`` device pages of ``namespace`` into the tree started
        (host -> device, or storage -> host -> device): with quotas they
        count against its tenant's device limit until ``settle_load``."""
        self.ledger.reserve_load(namespace, n)

    def settle_load(self, namespace: Namespace, n: int) -> None:
        """A load's ``n`` reserved device pages entered the tree or went back
        to the pool (or to a request's own pages). Once per ``reserve_load``."""
        self.ledger.settle_load(namespace, n)

    def load_fits(self, namespace: Namespace, n: int) -> bool:
        """Whether ``n`` more device pages fit the tenant's device limit now."""
        return self.ledger.load_fits(namespace, n)

    # ------------------------------------------------------------------ holds
    @staticmethod
    def hold(nodes: Sequence[Node], loading: bool = False) -> None:
        """A job takes ``nodes`` (``loading``: it writes their device pages)."""
        for node in nodes:
            node.holds += 1
            node.loading += loading

    @staticmethod
    def release(nodes: Sequence[Node], loading: bool = False) -> None:
        """Undo one ``hold`` of ``nodes`` (the job's pieces, in path order)."""
        for node in nodes:
            assert node.holds > 0 and node.loading >= loading, f"{node!r}: release without a hold"
            node.holds -= 1
            node.loading -= loading

    # ------------------------------------------------------------------ bulk
    def clear(self) -> None:
        """Everything went (the tree was reset, no job in flight): free every host page."""
        self.pool.free(self.pool.allocated_ids())
        self.host_pages = 0
        self.ledger.clear_host()
        self.eviction.clear()

    def host_page_ids(self, nodes: Iterable[Node]) -> PageIds:
        parts = [n.host for n in nodes if n.host is not None]
        return np.concatenate(parts) if parts else EMPTY_PAGES

    def check_integrity(
        self,
        nodes: Sequence[Node],
        holds: dict[Node, tuple[int, int]],
        job_host_pages: Sequence[PageIds],
        reserved: Iterable[tuple[Namespace, int]] = (),
        loads: Iterable[tuple[Namespace, int]] = (),
    ) -> None:
        """Verify the host fields of ``nodes`` (every tree node) against the
        jobs in flight: ``holds`` maps a node to the (holds, loading) counts
        the live jobs account for; ``job_host_pages`` are host pages jobs own;
        ``reserved``: the host pages live jobs were allocated, per namespace
        (the ledger's pages in flight); ``loads``: the device pages live
        loads reserved, per namespace (the ledger's device pages in flight)."""
        self.pool.check_integrity()
        total = 0
        per_namespace: dict[Namespace, int] = {}
        for node in nodes:
            want = holds.get(node, (0, 0))
            assert (node.holds, node.loading) == want, (
                f"{node!r}: holds/loading ({node.holds}, {node.loading}) but the jobs in flight "
                f"account for {want}"
            )
            if node.host is not None:
                assert node.host.size * self.page_size == node.key.size, f"{node!r}: host pages"
                total += node.host.size
                ns = node.namespace
                per_namespace[ns] = per_namespace.get(ns, 0) + int(node.host.size)
        stray = set(holds) - set(nodes)
        assert not stray, f"jobs hold {len(stray)} nodes that are not in the tree"
        assert total == self.host_pages, f"host_pages {self.host_pages} != {total}"
        self.ledger.check_host(per_namespace, reserved)
        self.ledger.check_loads(loads)
        ids = np.concatenate([self.host_page_ids(nodes), *job_host_pages])
        assert np.unique(ids).size == ids.size, "a host page is owned twice"
        allocated = self.pool.allocated_ids()
        assert np.array_equal(np.sort(ids), allocated), (
            f"host pool accounting: {allocated.size} allocated, {ids.size} owned"
        )
        self.eviction.check_integrity(nodes)

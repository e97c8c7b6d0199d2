"""The tiers below the device, as the cache sees them.

``HostTiers`` decides, with the write and prefetch policies, when pages move
between device, host and storage, and starts one tier job per move
(radixcache/tiers/jobs.py, write_jobs.py, load_jobs.py: each job owns its holds
and applies its own result).
``poll()``, on the owner thread, is the only place async results enter the
tree: it calls ``finish`` on every finished job. The hooks the cache calls
are the ``Tiers`` contract (radixcache/tiers/contract.py, with ``NullTiers``, the
device-only cache).

This module has the write path (backups by the write policy, stores), host
room, completions and bulk operations. Load-back of host and storage hits and
the prefetch policy are ``LoadBack``'s (radixcache/tiers/loads.py). Any
failure degrades to recomputing: nothing wrong is served.

No hook raises for a failing tier. A copy or storage operation that fails
fails its job (the controller turns a submission that raises into a failed
job); a storage call answered at once (``longest_prefix``, the lists of
removed and written keys, ``forget_namespace``, ``stats``) that raises is
caught here, counted in ``failed_jobs`` and treated as "nothing there": no
hit, nothing removed. A namespace whose stored pages could not be deleted
by ``forget`` is not fetched from storage until the deletion, retried by
every ``poll``, succeeds (radixcache/tiers/forgets.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from radixcache.tiers.forgets import Forgets
from radixcache.tiers.host_index import HostIndex
from radixcache.tiers.jobs import TierJob
from radixcache.tiers.loads import LoadBack
from radixcache.tiers.survivors import DateFetched, PutExtras
from radixcache.tiers.write_jobs import BackupJob, StoreJob
from radixcache.namespace import Namespace
from radixcache.tree.node import EMPTY_PAGES, InsertResult, MatchResult, Node, PageIds
from radixcache.offload import JobKind, OffloadController, RateLimitedLog, Storage, StorageOpening
from radixcache.keys.hashing import split_keys
from radixcache.request import Request
from radixcache.tiers.config import TierConfig, TierCounters, TierStats
from radixcache.tree.radix_tree import RadixTree
from radixcache.transfer import DeviceKVBuffer
from radixcache.transfer.engine import make_copy_engine

log = logging.getLogger(__name__)
_failures = RateLimitedLog(log)  # a failing tier fails every job: one line per interval

AllocateDevice = Callable[[int], "PageIds | None"]
_T = TypeVar("_T")

__all__ = ["HostTiers", "TierConfig", "TierStats"]


def _no_fetch(req: Request, tokens: PageIds) -> None:
    """No storage tier: nothing to prefetch."""


def _no_store(nodes: list[Node]) -> None:
    """No storage tier: host copies stay on the host."""


class HostTiers:
    """Host pool (+ storage, ``NullStorage`` when disabled) under a device
    cache. Owner-thread only."""

    def __init__(
        self,
        tree: RadixTree,
        index: HostIndex,
        kv: DeviceKVBuffer,
        config: TierConfig,
        storage: StorageOpening,
        allocate_device: AllocateDevice,
        free_device: Callable[[PageIds], None],
    ) -> None:
        self.tree = tree
        self.index = index
        self.host = index.pool
        self.page_size = kv.spec.page_size
        self.config = config
        self.write = config.write()
        self.prefetch = config.prefetch()
        self.controller = OffloadController(
            make_copy_engine(kv, self.host.buffer), self.host, storage.storage, kv.spec.page_bytes
        )
        self.storage_state = storage.state
        index.storage_medium = storage.storage.medium  # who announces storage pages, and as what
        self.loads = LoadBack(self)  # load-back of host and storage hits, the prefetch policy
        # Without a storage tier (NullStorage), the two storage steps are
        # no-ops chosen here once: no page keys are computed for lookups that
        # cannot hit, and no store jobs are started that commit nothing.
        enabled = storage.state != "disabled"
        self._fetch_from_storage: Callable[[Request, PageIds], None] = (
            self.loads.start_fetch if enabled else _no_fetch
        )
        self.store: Callable[[list[Node]], None] = self._store if enabled else _no_store
        self.allocate_device = allocate_device
        self.free_device = free_device
        self.jobs: dict[TierJob, None] = {}  # live jobs, in submission order
        self._deferred_stores: list[Node] = []  # backed up while being evicted
        self.counters = TierCounters()
        self.forgets = Forgets(lambda: self.storage, self.tier_failed)  # epochs, deletions owed
        self.put_extras: PutExtras | None = None  # retention deadline and tags of a store job
        self.date_fetched: DateFetched | None = None  # (retention)

    def bind_records(self, put_extras: PutExtras, date_fetched: DateFetched | None) -> None:
        """Store jobs record ``put_extras`` (deadline, tags); ``date_fetched`` dates reads."""
        self.put_extras, self.date_fetched = put_extras, date_fetched

    @property
    def storage(self) -> Storage:
        """The storage tier (``NullStorage`` when disabled)."""
        return self.controller.storage

    # ------------------------------------------------------------------ admission
    def on_admit(self, req: Request, match: MatchResult, tokens: PageIds) -> None:
        """Start loading the host part of ``match`` and prefetching what storage
        has beyond it. ``req`` holds the device part, locked.

        The load starts first: it holds its host nodes, so the host room a
        hit-path backup makes cannot drop the copies it is about to read."""
        nodes: list[Node] = []
        for node in match.host_nodes:
            if node.loading:
                break
            nodes.append(node)
        if nodes:
            self.loads.start_load(req, nodes)
        self._backup_hit_path(match.last_device_node)
        if len(nodes) == len(match.host_nodes):
            self._fetch_from_storage(req, tokens)

    def wait_for_loads(self, match: MatchResult) -> bool:
        """If another request is loading the first host node of ``match``, let
        the copies in flight land (memcpy speed) so the caller can share them;
        True if any job finished."""
        if match.host_nodes and match.host_nodes[0].loading:
            return self.settle_copies()
        return False

    def _backup_hit_path(self, node: Node | None) -> None:
        """Back up the hit nodes the write policy says have earned a copy."""
        while node is not None and node.parent is not None:
            if node.host is None and not node.holds and self.write.backup_on_hit(node.hit_count):
                self._backup(node)
            node = node.parent

    # ------------------------------------------------------------------ backups
    def on_insert(self, result: InsertResult) -> None:
        # A node with a host copy that the insert gave device pages again may
        # have left host eviction's heap as an inner host-only node: back in.
        self.index.eviction.track_all(result.new_nodes)
        if self.write.backup_on_insert():
            for node in result.new_nodes:
                if node.host is None and not node.holds:
                    self._backup(node)

    def _backup(self, node: Node) -> None:
        assert node.device is not None
        host_pages = self.allocate_host(int(node.device.size), node.namespace)
        if host_pages is None:
            self.counters.backups_skipped += 1
            return
        BackupJob(self, node, host_pages)

    def before_device_drop(self, node: Node) -> None:
        """Eviction hook: back up (and wait) when the policy asks for it, or when
        dropping the node would orphan host-only children."""
        if node.host is not None or node.holds:
            return
        if not (self.write.backup_on_evict() or node.children):
            return
        assert node.device is not None
        host_pages = self.allocate_host(int(node.device.size), node.namespace)
        if host_pages is None:
            self.counters.backups_skipped += 1
            return
        self.index.settle(node.namespace, int(host_pages.size))  # attached or freed now
        if self.controller.backup_now(node.device.copy(), host_pages):
            self.index.attach(node, host_pages)
            self._deferred_stores.append(node)  # stored at the next poll, after the eviction
        else:
            self.counters.failed_jobs += 1
            self.host.free(host_pages)

    def _store(self, nodes: list[Node]) -> None:
        """Write the complete host copy of a run of nodes (path order) on to
        storage, as one job."""
        nodes = [n for n in nodes if n.host is not None and not n.stored]
        if not nodes:
            return
        if len(nodes) > 1 and any(b.parent is not a for a, b in zip(nodes, nodes[1:])):
            for node in nodes:  # not one run: one job each
                self._store([node])
            return
        keys = split_keys(b"".join(self.tree.page_keys(n) for n in nodes))
        tokens = np.concatenate([n.key for n in nodes]).reshape(-1, self.page_size)
        host = np.concatenate([n.host for n in nodes if n.host is not None])
        StoreJob(self, nodes, keys, tokens, host, self.forgets.epoch(nodes[-1].namespace))

    # ------------------------------------------------------------------ host pool
    def allocate_host(self, n: int, namespace: Namespace) -> PageIds | None:
        """``n`` host pages for a backup or fetch of ``namespace``'s pages,
        dropping host copies in policy order if the pool is short; None if
        that cannot make room. The caller settles them (``index.settle``)
        once, when they are attached or freed. With quotas the cache replaces
        this with ``radixcache.tenants.host.HostQuota.allocate`` (limits and
        floors per tenant)."""
        pages = self.host.allocate(n)
        if pages is not None:
            return pages
        short = n - self.host.free_count
        for node in self.index.eviction.victims():  # policy order, O(log n) each: no walk
            short -= self.evict_host_copy(node)
            if short <= 0:
                break
        return self.host.allocate(n)

    def evict_host_copy(self, node: Node) -> int:
        """Drop victim ``node``'s host copy (announced), free its pages; a node
        left with no copy at all leaves the tree. Returns the pages freed."""
        freed = self.index.drop(node)
        if node.device is None:
            parent = node.parent
            self.tree.below.remove_leaf(node)
            if parent is not None:
                self.index.eviction.track(parent)  # it may have lost its last child
        self.host.free(freed)
        self.counters.host_evicted_pages += int(freed.size)
        return int(freed.size)

    # ------------------------------------------------------------------ completions
    def poll(self) -> int:
        """Finish every finished job (each applies itself to the tree and its
        request); returns how many finished. Retries the storage deletions
        that forgotten namespaces still owe."""
        if self.forgets.owed:
            self.forgets.retry()
        if self._deferred_stores:
            stores, self._deferred_stores = self._deferred_stores, []
            for node in stores:
                if self.tree.below.is_attached(node) and not node.holds:
                    self.store([node])
        # Removals go out before what this poll harvests: a key evicted and
        # then written again must end up stored. A key whose store (or fetch)
        # is harvested now but that is gone from storage was removed after it:
        # its removal goes out again, after the store.
        removed: list[bytes] = self._ask_storage("storage removals", self.storage.take_removed, [])
        self.index.recorder.removed_keys(removed, self.storage.medium)
        done = self.controller.poll()
        # after the harvest: every page of a finished put is listed by now
        self.index.note_written(self._ask_storage("storage writes", self.storage.take_written, []))
        for move in done:
            if not move.ok:
                self.counters.failed_jobs += 1
                _failures.warning("%s failed: %r", move.kind.value, move.ticket.error)
            move.owner.finish(move.ok)
        if removed:
            announced = {k for move in done for k in move.keys}
            again = [k for k in removed if k in announced and not self.stored([k])]
            self.index.recorder.removed_keys(again, self.storage.medium)
        return len(done)

    # ------------------------------------------------------------------ storage calls
    def stored(self, keys: list[bytes]) -> int:
        """How many leading ``keys`` storage holds; 0 when it cannot say."""
        return self._ask_storage("storage lookup", lambda: self.storage.longest_prefix(keys), 0)

    def _ask_storage(self, what: str, call: Callable[[], _T], failed: _T) -> _T:
        """``call()``, or ``failed`` (counted, logged) if the storage raises."""
        try:
            return call()
        except Exception as exc:
            self.tier_failed(what, exc)
            return failed

    def tier_failed(self, what: str, exc: BaseException) -> None:
        """A storage call answered at once raised: count it (degraded to a miss)."""
        self.counters.failed_jobs += 1
        _failures.warning("%s failed: %r", what, exc)

    def may_land(self, namespace: Namespace, epoch: int) -> bool:
        """Whether a job started at ``epoch`` may still add pages of ``namespace``."""
        return self.forgets.may_land(namespace, epoch)

    def epoch(self, namespace: Namespace) -> int:
        """How many times ``namespace`` was forgotten (stamped on jobs)."""
        return self.forgets.epoch(namespace)

    # ------------------------------------------------------------------ load-back
    def roll_back(
        self, req: Request, start_page: int, before: Node | None, keep_private: PageIds | None = None
    ) -> None:
        """``req`` gives up its pending loads from page ``start_page`` on."""
        self.loads.roll_back(req, start_page, before, keep_private)

    def resolve(self, req: Request) -> None:
        """Apply the prefetch policy to ``req``'s pending loads."""
        self.loads.resolve(req)

    def abandon(self, req: Request) -> None:
        """Stop waiting for ``req``'s pending loads; it recomputes them."""
        self.loads.abandon(req)

    # ------------------------------------------------------------------ bulk
    def forget(self, namespace: Namespace) -> None:
        """Jobs in flight for ``namespace`` land nowhere; its records leave
        storage before this returns (stores of it in flight finish first, then
        the owner waits for the deletion, so no later lookup finds them). If
        storage cannot delete them, the deletion is owed: the namespace is
        not fetched until a ``poll`` retried it successfully (``Forgets``)."""
        self.forgets.bump(namespace)
        for job in list(self.jobs):
            job.before_forget(namespace)
        if self.storage_state != "disabled":
            self.forgets.delete(namespace)

    def invalidate_tag(self, tag: str) -> None:
        """Storage's records under ``tag`` go before this returns (or the
        invalidation is owed: see ``Forgets.invalidate``)."""
        if self.storage_state != "disabled":
            self.forgets.invalidate(tag)

    def busy(self) -> bool:
        """Jobs in flight (or stores deferred by an eviction): what settling
        or draining could finish. Without them an allocation that is short
        fails at once, changing nothing."""
        return bool(self.controller.in_flight or self._deferred_stores)

    def settle_copies(self) -> bool:
        """Wait for the device<->host copies in flight (they pin device pages)
        and apply every finished job; True if any job finished."""
        for move in self.controller.jobs():
            if move.kind in (JobKind.BACKUP, JobKind.LOAD):
                self.controller.wait(move)
        return self.poll() > 0

    def drain(self) -> bool:
        """Wait for every job in flight and apply it; True if any job finished
        (the first poll's included)."""
        finished = self.poll()
        while self.controller.in_flight or self._deferred_stores:
            self.controller.wait_all()
            finished += self.poll()
        return finished > 0

    def reset(self) -> None:
        """The tree was reset (no job in flight): every host page goes back."""
        self._deferred_stores.clear()
        self.index.clear()

    def job_device_pages(self) -> PageIds:
        """Device pages owned by in-flight jobs (not the tree's, no request's)."""
        parts = [job.device_pages() for job in self.jobs]
        return np.concatenate(parts) if parts else EMPTY_PAGES

    def job_locks(self) -> dict[Node, int]:
        """Tree locks held by in-flight jobs, per node."""
        locks: dict[Node, int] = {}
        for job in self.jobs:
            node = job.lock()
            if node is not None:
                locks[node] = locks.get(node, 0) + 1
        return locks

    def stats(self) -> TierStats:
        c = self.counters
        t = self.controller.counters
        return TierStats(
            host_pages=self.host.capacity,
            host_free_pages=self.host.free_count,
            host_cached_pages=self.index.host_pages,
            host_hit_tokens=c.host_hit_tokens,
            storage_hit_tokens=c.storage_hit_tokens,
            loaded_tokens=c.loaded_tokens,
            abandoned_tokens=c.abandoned_tokens,
            backups_skipped=c.backups_skipped,
            host_evicted_pages=c.host_evicted_pages,
            failed_jobs=c.failed_jobs,
            in_flight=self.controller.in_flight,
            pages_moved={k.value: v for k, v in t.pages.items()},
            bytes_moved={k.value: v for k, v in t.bytes.items()},
            bytes_per_second={k.value: t.bytes_per_second(k) for k in JobKind},
            storage=(
                None
                if self.storage_state == "disabled"
                else self._ask_storage("storage stats", self.storage.stats, None)
            ),
            storage_state=self.storage_state,
            job_latency={k.value: h.copy() for k, h in t.latency.items()},
        )

    def check_integrity(self) -> None:
        """Every node's holds equal those of the live jobs; host pages are
        owned exactly once (by the tree or by a job)."""
        assert len(self.jobs) == self.controller.in_flight, (
            f"{len(self.jobs)} live jobs, {self.controller.in_flight} moves in flight"
        )
        holds: dict[Node, tuple[int, int]] = {}
        for job in self.jobs:
            for node in job.held():
                h, ld = holds.get(node, (0, 0))
                holds[node] = (h + 1, ld + job.loading)
        reserved = [r for r in (job.host_reserved() for job in self.jobs) if r is not None]
        loads = [r for r in (job.device_reserved() for job in self.jobs) if r is not None]
        self.index.check_integrity(
            list(self.tree.nodes()), holds, [job.host_pages() for job in self.jobs], reserved, loads
        )

    def close(self) -> None:
        """Finish every job, settle owed deletions, stop the threads."""
        self.drain()
        self.forgets.settle()
        self.controller.close()

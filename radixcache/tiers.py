"""The tiers below the device, as the cache sees them.

``HostTiers`` decides, with the write and prefetch policies, when pages move
between device, host and storage, submits the moves to the offload
controller, and applies finished moves to the tree in ``poll()`` (on the
owner thread, the only place async results enter the tree). ``NullTiers`` is
the device-only cache: every hook does nothing.

Job life cycle. Every job marks the nodes it touches busy (no host eviction,
no adoption, no removal while pages are in flight); backups and loads also
lock them against device eviction, stores do not. A node split meanwhile
passes ``busy`` to both pieces, and the job finds them with ``tree.pieces``::

    BACKUP  device -> host     done: node gains host pages -> STORE (if storage)
    STORE   host -> storage    done: node.stored
    LOAD    host -> device     done: host-only nodes gain device pages
    FETCH   storage -> host    done: new host-only nodes -> LOAD

A request admitted with host or storage hits takes the pages being loaded
into its page table at once (``req.pending`` lists the loads); ``resolve``
applies the prefetch policy: wait, or give up what has not arrived and
recompute it. Any failure degrades to recomputing: nothing wrong is served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from radixcache.events.types import DISK
from radixcache.offload.controller import Job, JobKind, OffloadController
from radixcache.offload.host import HostPool, HostPoolConfig
from radixcache.offload.lmdb_storage import LmdbStorage, StorageConfig
from radixcache.survivors import put_meta
from radixcache.offload.policy import PrefetchPolicy, WritePolicy, make_prefetch_policy, make_write_policy
from radixcache.offload.storage import ModelFingerprint, NullStorage, Storage, StorageStats
from radixcache.hashing import KEY_BYTES, chain_keys, split_keys
from radixcache.node import EMPTY_PAGES, InsertResult, MatchResult, Node, PageIds
from radixcache.request import Request
from radixcache.tree import RadixTree
from radixcache.transfer import DeviceKVBuffer, KVSpec
from radixcache.transfer.engine import make_copy_engine

log = logging.getLogger(__name__)

AllocateDevice = Callable[[int], "PageIds | None"]


@dataclass(frozen=True, slots=True)
class TierConfig:
    """Host and storage tiers (names follow HiCache's where they exist)."""

    host: HostPoolConfig = field(default_factory=lambda: HostPoolConfig(ratio=2.0))
    write_policy: str = "write_through"  # write_through, write_through_selective, write_back
    write_threshold: int = 2  # hits before write_through_selective backs a node up
    prefetch_policy: str = "best_effort"  # best_effort, wait_complete, timeout
    prefetch_base_s: float = 0.002  # timeout policy: fixed wait per request
    prefetch_per_token_s: float = 2e-7  # timeout policy: extra wait per token in flight
    storage: StorageConfig | None = None  # None: no storage tier
    model_id: str = "radixcache-model"  # part of the storage fingerprint
    tp_rank: int = 0  # part of the storage fingerprint

    def __post_init__(self) -> None:
        if not isinstance(self.host, HostPoolConfig):
            raise TypeError(f"host must be a HostPoolConfig, got {type(self.host).__name__}")
        if self.storage is not None and not isinstance(self.storage, StorageConfig):
            raise TypeError(f"storage must be a StorageConfig, got {type(self.storage).__name__}")
        self.write()
        self.prefetch()

    def write(self) -> WritePolicy:
        """The configured write policy object (validates the name)."""
        if self.write_policy == "write_through_selective":
            return make_write_policy(self.write_policy, threshold=self.write_threshold)
        return make_write_policy(self.write_policy)

    def prefetch(self) -> PrefetchPolicy:
        """The configured prefetch policy object (validates the name)."""
        if self.prefetch_policy == "timeout":
            return make_prefetch_policy(
                "timeout", base_s=self.prefetch_base_s, per_token_s=self.prefetch_per_token_s
            )
        return make_prefetch_policy(self.prefetch_policy)


@dataclass(slots=True)
class TierCounters:
    host_hit_tokens: int = 0  # prompt tokens found in host memory at admission
    storage_hit_tokens: int = 0  # prompt tokens found in storage at admission
    loaded_tokens: int = 0  # of those, loaded back in time for their request
    abandoned_tokens: int = 0  # given up (not in time, or failed): recomputed
    backups_skipped: int = 0  # backups not made: no host page could be freed
    host_evicted_pages: int = 0  # host pages dropped to make room
    failed_jobs: int = 0  # copies or storage operations that failed


@dataclass(frozen=True, slots=True)
class TierStats:
    """A snapshot of the tiers below the device."""

    host_pages: int  # host pool capacity
    host_free_pages: int  # free host pages
    host_cached_pages: int  # host pages held by the tree
    host_hit_tokens: int  # prompt tokens found in host memory at admission
    storage_hit_tokens: int  # prompt tokens found in storage at admission
    loaded_tokens: int  # of those, loaded back in time for their request
    abandoned_tokens: int  # given up or failed: recomputed
    backups_skipped: int  # backups not made for lack of host room
    host_evicted_pages: int  # host pages dropped to make room
    failed_jobs: int  # copies or storage operations that failed
    in_flight: int  # jobs in flight now
    pages_moved: dict[str, int]  # per direction (device_to_host, host_to_device, ...)
    bytes_moved: dict[str, int]  # per direction
    bytes_per_second: dict[str, float]  # per direction, over job latency
    storage: StorageStats | None  # the storage backend's counters, None without one


class Tiers(Protocol):
    """What the cache calls; see HostTiers for the behaviour."""

    def on_admit(self, req: Request, match: MatchResult, tokens: PageIds) -> None: ...
    def on_insert(self, result: InsertResult) -> None: ...
    def before_device_drop(self, node: Node) -> None: ...
    def free_host(self, pages: PageIds) -> None: ...
    def resolve(self, req: Request) -> None: ...
    def abandon(self, req: Request) -> None: ...
    def poll(self) -> int: ...
    def forget(self, namespace_digest: bytes) -> None: ...
    def drain(self) -> bool: ...
    def settle_copies(self) -> bool: ...
    def job_device_pages(self) -> PageIds: ...
    def job_locks(self) -> dict[Node, int]: ...
    def stats(self) -> TierStats | None: ...
    def check_integrity(self) -> None: ...
    def close(self) -> None: ...


class NullTiers:
    """The device-only cache: no host, no storage."""

    def on_admit(self, req: Request, match: MatchResult, tokens: PageIds) -> None:
        pass

    def on_insert(self, result: InsertResult) -> None:
        pass

    def before_device_drop(self, node: Node) -> None:
        pass

    def free_host(self, pages: PageIds) -> None:
        assert pages.size == 0, "host pages without a host tier"

    def resolve(self, req: Request) -> None:
        pass

    def abandon(self, req: Request) -> None:
        pass

    def poll(self) -> int:
        return 0

    def forget(self, namespace_digest: bytes) -> None:
        pass

    def drain(self) -> bool:
        return False

    def settle_copies(self) -> bool:
        return False

    def job_device_pages(self) -> PageIds:
        return EMPTY_PAGES

    def job_locks(self) -> dict[Node, int]:
        return {}

    def stats(self) -> TierStats | None:
        return None

    def check_integrity(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(slots=True, eq=False)
class LoadTag:
    """A LOAD job's context: the host-only run of pages it brings back."""

    last: Node  # the node holding the run's last page (the job locks it)
    req: Request | None  # the request waiting for it (None once given up)
    before: Node | None  # the request's lock before this load (for a rollback)
    start_page: int  # index in the request's page table of the first loaded page


@dataclass(slots=True, eq=False)
class PrivateLoadTag:
    """A LOAD of fetched pages into a request's own device pages (the tree got
    the same pages from elsewhere meanwhile): nothing enters the tree."""

    req: Request | None  # the request waiting for it (None once given up)
    before: Node | None  # the request's lock before the fetch
    start_page: int  # index in the request's page table of the first page


@dataclass(slots=True, eq=False)
class FetchTag:
    """A FETCH job's context: pages read from storage for a request."""

    req: Request | None  # the request waiting for it (None once given up)
    parent: Node | None  # the node the pages hang under (None: the namespace root)
    tokens: PageIds  # the whole prefix, up to the end of the fetched pages
    start: int  # tokens before the fetched pages
    device_pages: PageIds  # allocated for the load that follows
    before: Node | None  # the request's lock before this fetch
    start_page: int  # index in the request's page table of the first fetched page


class HostTiers:
    """Host pool (+ optional LMDB storage) under a device cache. Owner-thread only."""

    def __init__(
        self,
        tree: RadixTree,
        kv: DeviceKVBuffer,
        config: TierConfig,
        allocate_device: AllocateDevice,
        free_device: Callable[[PageIds], None],
    ) -> None:
        self.tree = tree
        self.spec: KVSpec = kv.spec
        self.page_size = kv.spec.page_size
        self.config = config
        self.write = config.write()
        self.prefetch = config.prefetch()
        self.host = HostPool(kv.spec, config.host, kv.num_pages)
        storage: Storage = NullStorage()
        if config.storage is not None:
            fingerprint = ModelFingerprint(config.model_id, kv.spec.describe(), config.tp_rank)
            storage = LmdbStorage(config.storage, kv.spec, fingerprint)
        self.has_storage = config.storage is not None
        self.controller = OffloadController(
            make_copy_engine(kv, self.host.buffer), self.host, storage, kv.spec.page_bytes
        )
        self._allocate_device = allocate_device
        self._free_device = free_device
        self._deferred_stores: list[Node] = []  # backed up while being evicted
        self.counters = TierCounters()

    # ------------------------------------------------------------------ admission
    def on_admit(self, req: Request, match: MatchResult, tokens: PageIds) -> None:
        """Start loading the host part of ``match`` and prefetching what storage
        has beyond it. ``req`` holds the device part, locked."""
        self._backup_hit_path(match.last_device_node)
        nodes: list[Node] = []
        for node in match.host_nodes:
            if node.busy:
                break
            nodes.append(node)
        if nodes:
            self._start_load(req, nodes)
        if self.has_storage and len(nodes) == len(match.host_nodes):
            self._start_fetch(req, tokens)

    def _backup_hit_path(self, node: Node | None) -> None:
        """Back up the hit nodes the write policy says have earned a copy."""
        while node is not None and node.parent is not None:
            if node.host is None and not node.busy and self.write.backup_on_hit(node.hit_count):
                self._backup(node)
            node = node.parent

    def _start_load(self, req: Request, nodes: list[Node]) -> None:
        n = sum(int(node.key.size) for node in nodes) // self.page_size
        last = nodes[-1]
        # Protect the nodes first: making room on the device may evict host pages.
        self.tree.lock(last)  # the job's lock
        for node in nodes:
            node.busy += 1
        dev = self._allocate_device(n)
        if dev is None:  # no room on the device: the request recomputes these pages
            for node in nodes:
                node.busy -= 1
            self.tree.unlock(last)
            return
        host_pages = np.concatenate([node.host for node in nodes if node.host is not None])
        tag = LoadTag(last, req, req.locked_node, req.num_pages)
        job = self.controller.load(host_pages, dev, tag)
        self._take_pages(req, last, dev, job)
        self.counters.host_hit_tokens += n * self.page_size
        req.hit_host = n * self.page_size

    def _take_pages(self, req: Request, lock: Node | None, dev: PageIds, job: Job) -> None:
        """The request uses pages still in flight; they count as cached for it."""
        if lock is not None:
            self.tree.lock(lock)
            if req.locked_node is not None:
                self.tree.unlock(req.locked_node)
            req.locked_node = lock
        req._append_pages(dev)
        req.shared_pages = req.num_pages
        req.cached_len = req.num_computed = req.reserved_tokens = req.num_pages * self.page_size
        req.pending.append(job)

    def _start_fetch(self, req: Request, tokens: PageIds) -> None:
        p = self.page_size
        start = req.num_pages * p
        usable = (max(tokens.size - 1, 0) // p) * p
        if usable - start < p:
            return
        parent = req.locked_node
        if parent is None:
            parent_key = req.namespace.digest()
        else:
            parent_key = self.tree.page_keys(parent)[-KEY_BYTES:]
        keys = split_keys(chain_keys(parent_key, tokens[start:usable], p))
        n = self.controller.storage.longest_prefix(keys)
        if n == 0:
            return
        host_pages = self._allocate_host(n)
        if host_pages is None:
            return
        dev = self._allocate_device(n)
        if dev is None:
            self.host.free(host_pages)
            return
        end = start + n * p
        tag = FetchTag(req, parent, tokens[:end].copy(), start, dev, parent, req.num_pages)
        job = self.controller.fetch(keys[:n], tokens[start:end].reshape(n, p), host_pages, tag)
        self._take_pages(req, None, dev, job)
        self.counters.storage_hit_tokens += n * p
        req.hit_storage = n * p

    # ------------------------------------------------------------------ backups
    def on_insert(self, result: InsertResult) -> None:
        if self.write.backup_on_insert():
            for node in result.new_nodes:
                if node.host is None and not node.busy:
                    self._backup(node)

    def _backup(self, node: Node) -> None:
        assert node.device is not None
        host_pages = self._allocate_host(int(node.device.size))
        if host_pages is None:
            self.counters.backups_skipped += 1
            return
        self.tree.lock(node)
        node.busy += 1
        self.controller.backup(node.device.copy(), host_pages, node)

    def before_device_drop(self, node: Node) -> None:
        """Eviction hook: back up (and wait) when the policy asks for it, or when
        dropping the node would orphan host-only children."""
        if node.host is not None or node.busy:
            return
        if not (self.write.backup_on_evict() or node.children):
            return
        assert node.device is not None
        host_pages = self._allocate_host(int(node.device.size))
        if host_pages is None:
            self.counters.backups_skipped += 1
            return
        if self.controller.backup_now(node.device.copy(), host_pages):
            self.tree.attach_host(node, host_pages)
            if self.has_storage:  # after the eviction: a store locks the node
                self._deferred_stores.append(node)
        else:
            self.counters.failed_jobs += 1
            self.host.free(host_pages)

    def _store(self, nodes: list[Node]) -> None:
        """Write the complete host copy of a run of nodes (path order) on to
        storage, as one job."""
        nodes = [n for n in nodes if n.host is not None and not n.stored]
        if not self.has_storage or not nodes:
            return
        if len(nodes) > 1 and any(b.parent is not a for a, b in zip(nodes, nodes[1:])):
            for node in nodes:  # not one run: one job each
                self._store([node])
            return
        last = nodes[-1]
        keys = split_keys(b"".join(self.tree.page_keys(n) for n in nodes))
        tokens = np.concatenate([n.key for n in nodes]).reshape(-1, self.page_size)
        host = np.concatenate([n.host for n in nodes if n.host is not None])
        # No lock: a store reads host pages only, and busy keeps them (host
        # eviction, forget and subtree drops skip busy nodes); the device
        # copy stays evictable meanwhile.
        for node in nodes:
            node.busy += 1
        self.controller.store(keys, tokens, host, last.namespace.digest(), last, put_meta(self.tree, nodes))

    # ------------------------------------------------------------------ host pool
    def _allocate_host(self, n: int) -> PageIds | None:
        pages = self.host.allocate(n)
        if pages is not None:
            return pages
        short = n - self.host.free_count
        for node in self.tree.host_candidates():
            if short <= 0:
                break
            freed = self.tree.drop_host(node)
            self.host.free(freed)
            self.counters.host_evicted_pages += int(freed.size)
            short -= int(freed.size)
        return self.host.allocate(n)

    def free_host(self, pages: PageIds) -> None:
        if pages.size:
            self.host.free(pages)

    # ------------------------------------------------------------------ completions
    def poll(self) -> int:
        """Apply every finished job to the tree; returns how many finished."""
        if self._deferred_stores:
            for node in self._deferred_stores:
                if self.tree.is_attached(node) and not node.busy:
                    self._store([node])
            self._deferred_stores.clear()
        # Removals go out before what this poll harvests: a key evicted and
        # then written again must end up stored. A key whose store (or fetch)
        # is harvested now but that is gone from storage was removed after it:
        # its removal goes out again after the store.
        storage = self.controller.storage
        removed = storage.take_removed()
        self.tree.recorder.removed_keys(removed, DISK)
        done = self.controller.poll()
        for job in done:
            if job.ticket.error is not None:
                self.counters.failed_jobs += 1
                log.warning("%s failed: %r", job.kind.value, job.ticket.error)
            if job.kind is JobKind.BACKUP:
                self._finish_backup(job)
            elif job.kind is JobKind.STORE:
                self._finish_store(job)
            elif isinstance(job.tag, PrivateLoadTag):
                self._finish_private_load(job)
            elif job.kind is JobKind.LOAD:
                self._finish_load(job)
            else:
                self._finish_fetch(job)
        if removed:
            announced = {k for job in done for k in job.keys}
            again = [k for k in removed if k in announced and not storage.longest_prefix([k])]
            self.tree.recorder.removed_keys(again, DISK)
        return len(done)

    def _finish_backup(self, job: Job) -> None:
        last = job.tag
        assert isinstance(last, Node)
        nodes = self.tree.pieces(last, job.num_pages)
        for node in nodes:
            node.busy -= 1
        self.tree.unlock(last)
        if not job.ok:
            self.host.free(job.host_pages)
            return
        for node, pages in self._share_out(nodes, job.host_pages):
            self.tree.attach_host(node, pages)
        self._store(nodes)

    def _share_out(self, nodes: list[Node], pages: PageIds) -> list[tuple[Node, PageIds]]:
        """Split a run of page ids over the nodes (path order) that hold it."""
        out = []
        offset = 0
        for node in nodes:
            n = int(node.key.size) // self.page_size
            out.append((node, pages[offset : offset + n]))
            offset += n
        return out

    def job_locks(self) -> dict[Node, int]:
        """Locks held by in-flight jobs, per node (backups and loads; stores
        mark nodes busy without locking them)."""
        locks: dict[Node, int] = {}
        for job in self.controller.jobs():
            tag = job.tag
            if job.kind is JobKind.BACKUP:
                node: Node | None = tag if isinstance(tag, Node) else None
            elif isinstance(tag, LoadTag):
                node = tag.last
            else:
                node = None
            if node is not None:
                locks[node] = locks.get(node, 0) + 1
        return locks

    def _finish_store(self, job: Job) -> None:
        last = job.tag
        assert isinstance(last, Node)
        nodes = self.tree.pieces(last, len(job.keys))
        for node in nodes:
            node.busy -= 1
        committed = int(job.ticket.result()) if job.ok else 0
        for node in nodes:
            n = int(node.key.size) // self.page_size
            if committed > 0:
                self.tree.recorder.stored(node, 0, min(n, committed), DISK)
            if committed >= n:
                # A hint that spares a second write; storage may evict the
                # pages later (announced through take_removed), leaving it stale.
                node.stored = True
            committed -= n

    def _finish_load(self, job: Job) -> None:
        tag = job.tag
        assert isinstance(tag, LoadTag) and job.device_pages is not None
        nodes = self.tree.pieces(tag.last, job.num_pages)
        for node in nodes:
            node.busy -= 1
        self.tree.unlock(tag.last)  # the job's lock
        first_parent = nodes[0].parent
        ok = job.ok and (
            first_parent is None or first_parent.parent is None or first_parent.device is not None
        )
        if ok:
            for node, pages in self._share_out(nodes, job.device_pages):
                self.tree.attach_device(node, pages)
        else:
            self._free_device(job.device_pages)
        req = tag.req
        if req is None:
            return
        if ok:
            req.pending.remove(job)
            self.counters.loaded_tokens += job.num_pages * self.page_size
        else:
            self._rollback(req, tag.start_page, tag.before)

    def _finish_fetch(self, job: Job) -> None:
        tag = job.tag
        assert isinstance(tag, FetchTag)
        got = int(job.ticket.result()) if job.ok else 0
        p = self.page_size
        node = self._attach_fetched(tag, job.host_pages[:got]) if got else None
        req = tag.req
        if node is None and got and req is not None:
            # Verified, but the tree has these pages already: the request loads
            # its copy privately (host pages are freed when that load is done).
            self.host.free(job.host_pages[got:])
            self._load_private(job, tag, req, got)
            return
        if node is None:  # nothing usable arrived, or nobody waits for it
            self.host.free(job.host_pages)
        elif got < job.num_pages:
            self.host.free(job.host_pages[got:])
        if req is None:
            self._free_device(tag.device_pages)
            return
        if node is None:
            self._rollback(req, tag.start_page, tag.before, keep_private=tag.device_pages)
            return
        # Chain a LOAD of the fetched pages into the request's device pages.
        node.busy += 1
        self.tree.lock(node)  # the job's lock
        load = self.controller.load(
            job.host_pages[:got],
            tag.device_pages[:got],
            LoadTag(node, req, tag.before, tag.start_page),
        )
        self.tree.lock(node)  # the request's lock moves to the new node
        if req.locked_node is not None:
            self.tree.unlock(req.locked_node)
        req.locked_node = node
        req.pending[req.pending.index(job)] = load
        if got < job.num_pages:  # the rest becomes the request's to compute
            cut = tag.start_page + got
            req.shared_pages = cut
            req.cached_len = req.num_computed = cut * p
            self.counters.abandoned_tokens += (job.num_pages - got) * p

    def _load_private(self, job: Job, tag: FetchTag, req: Request, got: int) -> None:
        """The fetched pages are verified but the tree has them already (another
        request fetched the same prefix): load them into the request's own
        device pages; its next commit finds them cached and frees its copies."""
        p = self.page_size
        load = self.controller.load(
            job.host_pages[:got], tag.device_pages[:got],
            PrivateLoadTag(req, tag.before, tag.start_page),
        )
        req.pending[req.pending.index(job)] = load
        req.shared_pages = tag.start_page  # from here on the pages are the request's own
        req.cached_len = req.num_computed = (tag.start_page + got) * p

    def _finish_private_load(self, job: Job) -> None:
        tag = job.tag
        assert isinstance(tag, PrivateLoadTag) and job.device_pages is not None
        self.host.free(job.host_pages)
        req = tag.req
        if req is None:
            self._free_device(job.device_pages)
        elif job.ok:
            req.pending.remove(job)
            self.counters.loaded_tokens += job.num_pages * self.page_size
        else:
            self._rollback(req, tag.start_page, tag.before, keep_private=job.device_pages)

    def _attach_fetched(self, tag: FetchTag, host_pages: PageIds) -> Node | None:
        """Hang the fetched pages, as one host-only node, under ``tag.parent``.

        Only if the parent is still in the tree and has no child for the first
        fetched page (no one cached these pages meanwhile); else None.
        """
        req = tag.req
        parent = tag.parent
        if parent is None:
            if req is None:
                return None
            return self.tree.insert_host_leaf(req.namespace, None, tag.tokens[tag.start :], host_pages)
        if not self.tree.is_attached(parent):
            return None
        return self.tree.insert_host_leaf(
            parent.namespace, parent, tag.tokens[tag.start :], host_pages
        )

    def _rollback(
        self,
        req: Request,
        start_page: int,
        before: Node | None,
        keep_private: PageIds | None = None,
    ) -> None:
        """Give up every pending load from page ``start_page`` on: the request
        recomputes those tokens. With ``keep_private``, those device pages stay
        in the request's table as its own (they are free to compute into)."""
        p = self.page_size
        lost = req.num_pages - start_page
        keep = req.pending.index(next(j for j in req.pending if self._start_of(j) >= start_page))
        for job in req.pending[keep:]:
            job.tag.req = None  # the job finishes on its own
        req.pending = req.pending[:keep]
        if before is not None:
            self.tree.lock(before)
        if req.locked_node is not None:
            self.tree.unlock(req.locked_node)
        req.locked_node = before
        req.num_pages = start_page
        if keep_private is not None:
            req._append_pages(keep_private)
        req.shared_pages = start_page
        req.cached_len = req.num_computed = start_page * p
        req.reserved_tokens = req.num_pages * p
        self.counters.abandoned_tokens += lost * p

    @staticmethod
    def _start_of(job: Job) -> int:
        tag = job.tag
        assert isinstance(tag, (LoadTag, FetchTag, PrivateLoadTag))
        return tag.start_page

    def resolve(self, req: Request) -> None:
        """Apply the prefetch policy to ``req``'s pending loads."""
        if not req.pending:
            return
        tokens = sum(job.num_pages for job in req.pending) * self.page_size
        budget = self.prefetch.wait_seconds(tokens)
        for job in list(req.pending):
            if budget is None:
                self.controller.wait(job)
            elif budget > 0:
                self.controller.wait(job, budget)
            self.poll()
            # A finished FETCH chains a LOAD: wait for that one too.
            while budget is None and req.pending and not req.pending[-1].ticket.done():
                self.controller.wait(req.pending[-1])
                self.poll()
        self.poll()
        if req.pending:
            self.abandon(req)

    def abandon(self, req: Request) -> None:
        """Stop waiting for ``req``'s pending loads; it recomputes them."""
        if req.pending:
            first = req.pending[0].tag
            assert isinstance(first, (LoadTag, FetchTag, PrivateLoadTag))
            self._rollback(req, first.start_page, first.before)

    # ------------------------------------------------------------------ bulk
    def forget(self, namespace_digest: bytes) -> None:
        if self.has_storage:
            self.controller.storage.forget_namespace(namespace_digest)

    def settle_copies(self) -> bool:
        """Wait for the device<->host copies in flight (they pin device pages)
        and apply them; True if there were any."""
        copies = [j for j in self.controller.jobs() if j.kind in (JobKind.BACKUP, JobKind.LOAD)]
        for job in copies:
            self.controller.wait(job)
        self.poll()
        return bool(copies)

    def drain(self) -> bool:
        """Wait for every job in flight and apply it; True if there were any."""
        self.poll()
        busy = bool(self.controller.in_flight)
        while self.controller.in_flight:
            self.controller.wait_all()
            self.poll()
        return busy

    def job_device_pages(self) -> PageIds:
        """Device pages owned by in-flight loads (not in the tree yet)."""
        parts = [  # a private load's pages are already the request's own
            job.device_pages
            for job in self.controller.jobs()
            if job.kind is JobKind.LOAD
            and job.device_pages is not None
            and not isinstance(job.tag, PrivateLoadTag)
        ]
        parts += [
            job.tag.device_pages
            for job in self.controller.jobs()
            if job.kind is JobKind.FETCH and isinstance(job.tag, FetchTag)
        ]
        return np.concatenate(parts) if parts else EMPTY_PAGES

    def stats(self) -> TierStats:
        c = self.counters
        t = self.controller.counters
        return TierStats(
            host_pages=self.host.capacity,
            host_free_pages=self.host.free_count,
            host_cached_pages=self.tree.host_pages,
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
            storage=self.controller.storage.stats() if self.has_storage else None,
        )

    def check_integrity(self) -> None:
        self.host.check_integrity()
        owned = [self.tree.host_page_ids()]
        owned += [
            j.host_pages
            for j in self.controller.jobs()
            if j.kind in (JobKind.BACKUP, JobKind.FETCH) or isinstance(j.tag, PrivateLoadTag)
        ]
        ids = np.concatenate(owned)
        assert np.unique(ids).size == ids.size, "a host page is owned twice"
        allocated = self.host.allocated_ids()
        assert np.array_equal(np.sort(ids), allocated), (
            f"host pool accounting: {allocated.size} allocated, {ids.size} owned"
        )

    def close(self) -> None:
        self.drain()
        self.controller.close()

"""Load-back and prefetch: pages found below the device, on their way up.

A request admitted with host or storage hits takes the pages being loaded
into its page table at once; ``req.pending`` lists the loads::

    page_table: [ device hit (locked) | LoadJob (host hit) | FetchJob (storage hit) ]
                                        ^ start_page of the first pending load

``LoadBack`` belongs to one ``HostTiers`` (built by it, owner thread only).
``start_load`` starts a ``LoadJob`` of host-only nodes, ``start_fetch`` a
``FetchJob`` of the pages storage has beyond them (radixcache/tiers/load_jobs.py).
``resolve`` applies the prefetch policy when the request steps: wait, or give
up what has not arrived (``abandon``) and recompute it; ``roll_back`` cuts
the request's table back and frees the private pages no job writes.

What it mutates: the request (through its own methods: ``take_loading``,
``found_below``, ``roll_back``), the tiers' counters, the device and host
pools (through the tiers' allocators); the jobs it starts take their own
holds.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from radixcache.keys.hashing import chain_keys, split_keys
from radixcache.tiers.forgets import Forgets
from radixcache.tiers.jobs import JobRuntime
from radixcache.tiers.load_jobs import FetchJob, LoadJob
from radixcache.namespace import Namespace
from radixcache.tree.node import Node, PageIds
from radixcache.offload import HostPool, PrefetchPolicy, Storage
from radixcache.request import Request


class LoadSite(JobRuntime, Protocol):
    """What load-back uses of the tiers that own it (``HostTiers``)."""

    host: HostPool
    prefetch: PrefetchPolicy
    forgets: Forgets  # epochs; namespaces storage still owes a deletion are not fetched

    def stored(self, keys: list[bytes]) -> int: ...

    @property
    def storage(self) -> Storage: ...

    def allocate_device(self, n: int) -> PageIds | None: ...

    def allocate_host(self, n: int, namespace: Namespace) -> PageIds | None: ...

    def epoch(self, namespace: Namespace) -> int: ...

    def poll(self) -> int: ...

    def job_device_pages(self) -> PageIds: ...


class LoadBack:
    """Loads and fetches for admitted requests, and the prefetch policy."""

    def __init__(self, rt: LoadSite) -> None:
        self.rt = rt

    def start_load(self, req: Request, nodes: list[Node]) -> None:
        """Load the host-only ``nodes`` (path order, right after ``req``'s
        device hit) back into fresh device pages ``req`` takes at once."""
        rt = self.rt
        job = LoadJob(rt, nodes, req, req.locked_node, req.num_pages)
        dev = rt.allocate_device(job.pages)
        if dev is None:  # no room on the device: the request recomputes these pages
            job.cancel()
            return
        job.start(np.concatenate([n.host for n in nodes if n.host is not None]), dev)
        req.take_loading(rt.tree, job.last, dev, job, rt.page_size)
        hit = job.pages * rt.page_size
        rt.counters.host_hit_tokens += hit
        req.found_below(host=hit)

    def start_fetch(self, req: Request, tokens: PageIds) -> None:
        """Fetch from storage the pages of ``tokens`` it has beyond what
        ``req`` holds (or loads) already."""
        rt = self.rt
        p = rt.page_size
        start = req.num_pages * p
        usable = (max(tokens.size - 1, 0) // p) * p
        if usable - start < p:
            return
        if rt.forgets.blocked(req.namespace):
            return  # storage may still hold its pages from before a forget
        parent = req.locked_node
        first = rt.tree.keys.last_key(parent, req.namespace.digest())
        keys = split_keys(chain_keys(first, tokens[start:usable], p))
        n = rt.stored(keys)
        if n == 0:
            return
        host_pages = rt.allocate_host(n, req.namespace)
        if host_pages is None:
            return
        dev = rt.allocate_device(n)
        if dev is None or req.num_pages * p != start:  # (making room may finish a load of req)
            rt.index.settle(req.namespace, n)
            rt.host.free(host_pages)
            if dev is not None:
                rt.free_device(dev)
            return
        epoch = rt.epoch(req.namespace)
        job = FetchJob(rt, req, parent, tokens, start, keys[:n], host_pages, dev, epoch)
        req.take_loading(rt.tree, None, dev, job, p)
        req.found_below(storage=n * p)  # promised; the hit is counted when pages arrive

    def roll_back(
        self, req: Request, start_page: int, before: Node | None, keep_private: PageIds | None = None
    ) -> None:
        """``req`` gives up its pending loads from page ``start_page`` on."""
        rt = self.rt
        lost, dropped = req.roll_back(rt.tree, start_page, before, rt.page_size, keep_private)
        rt.counters.abandoned_tokens += lost * rt.page_size
        # Private pages that left the table and that no job in flight writes
        # (the rest of a short fetch, kept for the request to compute into)
        # go back to the pool; a given-up job frees its own when it lands.
        owned = rt.job_device_pages()
        if keep_private is not None:
            owned = np.concatenate([owned, keep_private])
        stray = np.setdiff1d(dropped, owned)
        if stray.size:
            rt.free_device(stray.astype(dropped.dtype, copy=False))

    def resolve(self, req: Request) -> None:
        """Apply the prefetch policy to ``req``'s pending loads."""
        if not req.pending:
            return
        rt = self.rt
        tokens = sum(job.num_pages for job in req.pending) * rt.page_size
        budget = rt.prefetch.wait_seconds(tokens)
        for job in list(req.pending):
            if budget is None:
                job.wait()
            elif budget > 0:
                job.wait(budget)
            rt.poll()
            # A finished fetch chains a load: wait for that one too.
            while budget is None and req.pending and not req.pending[-1].done():
                req.pending[-1].wait()
                rt.poll()
        rt.poll()
        if req.pending:
            self.abandon(req)

    def abandon(self, req: Request) -> None:
        """Stop waiting for ``req``'s pending loads; it recomputes them."""
        if req.pending:
            first = req.pending[0]
            self.roll_back(req, first.start_page, first.before)

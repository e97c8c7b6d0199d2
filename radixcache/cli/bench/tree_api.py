"""The tree benchmark's figures through the API a model runner calls.

Every request goes ``admit -> reserve -> commit -> release`` on a
``RadixCache`` (index and pools only, no KV tensors) with events recorded,
and ``take_events()`` drains them after every request, as a router-facing
runner does each step. Evictions are timed through ``RadixCache.evict``, so
the pages' return to the pool and their ``BlockRemoved`` events count.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixcache.cache import CacheConfig, RadixCache
from radixcache.tenants import QuotaBook, TenantQuota
from radixcache.transfer import KVSpec

P = 16
SYSTEM = 1024  # tokens of the system prompt every first turn starts with
REQ = 4096  # tokens of a first turn
TURN = 512  # tokens a second turn adds
VOCAB = 32000
SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float16, page_size=P)


class Workload:
    """Deterministic token streams: one system prompt, conversations, long docs."""

    def __init__(self, conversations: int, long_docs: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.system = rng.integers(0, VOCAB, SYSTEM, dtype=np.int32)
        self.first = [
            np.concatenate([self.system, rng.integers(0, VOCAB, REQ - SYSTEM, dtype=np.int32)])
            for _ in range(conversations)
        ]
        self.turns = [rng.integers(0, VOCAB, TURN, dtype=np.int32) for _ in range(conversations)]
        self.long = [
            np.concatenate([self.system, rng.integers(0, VOCAB, 32768 - SYSTEM, dtype=np.int32)])
            for _ in range(long_docs)
        ]
        self.miss4k = rng.integers(0, VOCAB, REQ, dtype=np.int32) + VOCAB
        self.miss32k = rng.integers(0, VOCAB, 32768, dtype=np.int32) + VOCAB


def make_cache(capacity: int, record_events: bool = True, quotas: QuotaBook | None = None) -> RadixCache:
    """Index and page pool only (no KV tensors), events recorded; ``quotas``
    (None: off) as ``CacheConfig.quotas``."""
    return RadixCache(
        CacheConfig(spec=SPEC, device_pages=capacity, allocate_kv=False, record_events=record_events,
                    quotas=quotas)
    )


def serve(cache: RadixCache, tokens: np.ndarray) -> int:
    """One request through the runner's calls; returns its device hit tokens."""
    req = cache.admit(tokens)
    n = req.num_tokens - req.num_computed
    cache.reserve(req, n)
    cache.commit(req, n)
    cache.release(req)
    cache.take_events()
    return req.cached_len


def probe(cache: RadixCache, tokens: np.ndarray) -> None:
    """A lookup as a runner makes it: admit (match + lock), release, drain."""
    cache.release(cache.admit(tokens))
    cache.take_events()


def timed(fn: Callable[[int], object], n: int, start: int = 0) -> list[float]:
    """Seconds of each of ``fn(start) .. fn(n-1)``, timed one call at a time
    (every benchmark of the tree, ours and the peer's, times with this)."""
    out = []
    clock = time.perf_counter
    for i in range(start, n):
        t0 = clock()
        fn(i)
        out.append(clock() - t0)
    return out


@dataclass(slots=True)
class ApiBuild:
    """A cache built by serving every first turn, second turn and long document."""

    cache: RadixCache
    first_s: list[float]  # each first turn (4k tokens, 1k shared system prompt)
    second_s: list[float]  # each second turn (the first + 512 tokens)


def build(capacity: int, first: list[np.ndarray], turns: list[np.ndarray], long: list[np.ndarray]) -> ApiBuild:
    cache = make_cache(capacity)
    first_s = timed(lambda i: serve(cache, first[i]), len(first))
    seconds = [np.concatenate([a, b]) for a, b in zip(first, turns)]
    second_s = timed(lambda i: serve(cache, seconds[i]), len(seconds))
    for doc in long:
        serve(cache, doc)
    return ApiBuild(cache, first_s, second_s)


def evictions(cache: RadixCache, pages: int, times: int) -> list[tuple[float, int]]:
    """``times`` consecutive evictions of ``pages`` pages: (seconds, pages freed)."""
    out = []
    for _ in range(times):
        before = cache.pool.free_count
        t0 = time.perf_counter()
        cache.evict(pages)
        cache.take_events()
        out.append((time.perf_counter() - t0, cache.pool.free_count - before))
    return out


def replay(seqs: list[np.ndarray], capacity: int, quotas: QuotaBook | None = None) -> tuple[float, float]:
    """Serve every request in order; returns (seconds, device token hit ratio)."""
    cache = make_cache(capacity, quotas=quotas)
    hit = 0
    total = 0
    t0 = time.perf_counter()
    for seq in seqs:
        hit += serve(cache, seq)
        total += seq.size
    elapsed = time.perf_counter() - t0
    cache.check_integrity()
    return elapsed, hit / total


# Tenant bookkeeping on the request path: quotas on with none set (per-tenant
# ledger, counted locks), and a retention every page lives far longer than the
# run (nodes dated, one heap per tenant, an expiry check on every admit and poll).
QUOTA_CASES = {"quotas_on": lambda: QuotaBook(), "quotas_ttl": lambda: QuotaBook({}, TenantQuota(ttl_s=1e9))}


def bytes_per_page(first: list[np.ndarray], turns: list[np.ndarray], long: list[np.ndarray], capacity: int) -> dict[str, Any]:
    """tracemalloc of a cache built through the API (events on, drained),
    the page pool included; per cached page, with and without its tokens."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    built = build(capacity, first, turns, long)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    pages = built.cache.tree.device_pages
    return {
        "cached_pages": pages,
        "pool_capacity_pages": capacity,
        "bytes_per_page": round(used / pages, 1),
        "bytes_per_page_without_tokens": round((used - pages * P * 4) / pages, 1),
    }


def rss_per_page(conversations: int, long_docs: int, capacity: int) -> dict[str, Any]:
    """Bytes per cached page as the process's resident memory grows while a
    cache is built through the API (events on, drained): token ids, the
    tree, the page pool and what the allocator keeps, all included. Measured
    in a fresh process (``spawn``), so memory freed by earlier figures
    cannot hide any of it."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        result: dict[str, Any] = pool.apply(_rss_child, (conversations, long_docs, capacity))
        return result


def _rss_child(conversations: int, long_docs: int, capacity: int) -> dict[str, Any]:
    w = Workload(conversations, long_docs)
    seconds = [np.concatenate([a, b]) for a, b in zip(w.first, w.turns)]
    gc.collect()
    before = _rss()
    cache = make_cache(capacity)
    for seq in [*w.first, *seconds, *w.long]:
        serve(cache, seq)
    gc.collect()
    used = _rss() - before
    pages = cache.tree.device_pages
    return {"cached_pages": pages, "rss_bytes": used, "bytes_per_page": round(used / pages, 1)}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 2)

"""The tree benchmark's figures through the API a model runner calls.

Every request goes ``admit -> reserve -> commit -> release`` on a
``RadixCache`` (index and pools only, no KV tensors) with events recorded,
and ``take_events()`` drains them after every request, as a router-facing
runner does each step. Evictions are timed through ``RadixCache.evict``, so
the pages' return to the pool and their ``BlockRemoved`` events count.
Below them, the memory floor of the lookups and the insert (``floor_*``):
the prompt's copy and the token compare alone.
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
from radixcache.native import compiled as native_core  # None on the pure-Python path
from radixcache.tenants import QuotaBook, TenantQuota
from radixcache.transfer import KVSpec
from radixcache.tree.node import common_len  # the tree's compare (the compiled core's, where built)

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


# ---------------------------------------------------------------- the memory floor
# Under the lookups and the insert (``tree_targets`` times it beside them).
# Whatever else a cache does, ``admit`` copies the prompt into memory it owns
# (a runner reuses its ``input_ids`` buffer, radixcache/tokens.py) and checks
# its sign, and a hit compares every cached token with the prompt's: the
# prompt is read once, its copy written once, and the cached tokens read
# once. An insert also keeps the new pages' tokens, in memory the process
# has not touched before while the tree grows (a page fault per 4 KiB).
#
# The floor does exactly that and nothing else, with the fastest calls this
# installation has (the compiled core's copy and compare; numpy's on the
# pure-Python path), and is timed interleaved with the figures it sits under,
# so the same cache state and the same machine drift
# fall on both. A figure minus its floor is bookkeeping; a bound below its
# floor cannot be met by a cache that copies the prompt and compares tokens.
# The cached tokens the floor compares with are a copy of the prompt's
# pages of their own, as cold as the tree's own keys after the other side's
# turn.

FLOOR_CALLS = "numpy" if native_core is None else "compiled"  # whose copy and compare the floor times


def _floor_copy(tokens: np.ndarray) -> np.ndarray:
    """The owned copy with its sign checked, as ``as_tokens(copy=True)`` takes it."""
    if native_core is not None:
        out = native_core.owned_tokens(tokens)
        if out is None:
            raise ValueError("negative token id")
        return out
    out = tokens.copy()
    if out.size and out.min() < 0:
        raise ValueError("negative token id")
    return out


def floor_cached_tokens(prompt: np.ndarray) -> np.ndarray:
    """A full hit's cached tokens for ``prompt``: its whole pages but the
    last token (always computed), in memory of their own."""
    usable = prompt.size - 1
    return prompt[: usable - usable % P].copy()


def floor_lookup(prompts: list[np.ndarray], hit: bool) -> Callable[[int], object]:
    """The floor of ``admit`` + ``release`` of ``prompts[i % len]``: the copy,
    and on a hit the compare with its cached tokens (a miss compares at most
    one page, which is noise here)."""
    cached = [floor_cached_tokens(p) for p in prompts] if hit else []
    n = len(prompts)

    def floor(i: int) -> object:
        own = _floor_copy(prompts[i % n])
        return common_len(cached[i % n], own, 0, cached[i % n].size, P) if hit else own

    return floor


def floor_insert(prompts: list[np.ndarray], shared: int) -> tuple[Callable[[int], object], list[np.ndarray]]:
    """The floor of inserting ``prompts[i]`` whose first ``shared`` tokens
    are cached: the copy, the compare of the shared part, and a kept copy of
    the new tokens (returned list: it grows as the tree's keys do)."""
    kept: list[np.ndarray] = []
    cached = [p[:shared].copy() for p in prompts]

    def floor(i: int) -> object:
        own = _floor_copy(prompts[i])
        common_len(cached[i], own, 0, shared, P)
        kept.append(_floor_copy(own[shared:]))
        return own

    return floor, kept

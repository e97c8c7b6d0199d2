"""Tree benchmark: ``radixcache bench tree [--quick] [--runs N] [--no-peer]``.

Prints one JSON object. Page size 16 throughout, tokens given as int32 arrays.

Tree level (``RadixTree`` + ``PageAllocator``, no events), each figure next
to the naive baseline (``radixcache.cli.bench.naive``) in the same run:
(a) insert of 4k-token requests sharing a 1k-token system prompt, then
multi-turn growth; (b) match of 4k and 32k prompts, full hit and full miss,
on a tree of ~100k pages; (c) evicting 10k pages, their return to the pool
included; (d) a mixed multi-turn replay (match + lock, make room, insert,
unlock), also with events recorded and published (``tree_replay``); (e) page hashes of a
32k-token prompt: event block ids, storage keys, naive; (f) bookkeeping
bytes per cached page (tracemalloc).

Public API (``radixcache.cli.bench.tree_api``): the same workload through
admit/reserve/commit/release with events recorded and drained after every
request, ``runs`` times, next to SGLang's ``UnifiedRadixCache`` with its Rust
tree core (``radixcache.cli.bench.sglang_tree``, when importable), and the
target table with pass/fail (``radixcache.cli.bench.tree_targets``), each
lookup and the insert beside its memory floor (``tree_api.floor_*``: the prompt's
copy and the token compare alone). Pin to one core for figures:
``taskset -c 1 python -m radixcache bench tree``.
"""

from __future__ import annotations

from radixcache.cli.bench import run_note, with_note
from radixcache.cli.parser import CliParser

import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from radixcache.cli.bench import tree_targets
from radixcache.cli.bench.tree_replay import mixed_replay, replay_requests
from radixcache.cli.bench.tree_api import FLOOR_CALLS, VOCAB, Workload, timed
from radixcache.cli.bench.naive import NaiveCache, naive_page_hashes
from radixcache.tree.policies import make_eviction_policy
from radixcache.keys.hashing import block_ids, chain_keys, namespace_seed
from radixcache.namespace import DEFAULT_NAMESPACE as NS
from radixcache.tree.radix_tree import RadixTree
from radixcache.transfer import PageAllocator

P = 16


def _us(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_us": round(statistics.median(s) * 1e6, 2),
        "p99_us": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6, 2),
    }


def _ratio(naive: float, ours: float) -> float:
    return round(naive / ours, 1) if ours else float("inf")


def build(tree: RadixTree, pool: PageAllocator, w: Workload) -> tuple[list[float], list[float]]:
    """Insert every first turn, then every second turn; returns their timings."""
    first = []
    clock = time.perf_counter
    for toks in w.first:
        pages = pool.allocate(toks.size // P)
        assert pages is not None
        t0 = clock()
        tree.insert(NS, toks, pages)
        first.append(clock() - t0)
    second = []
    for toks, turn in zip(w.first, w.turns):
        full = np.concatenate([toks, turn])
        pages = pool.allocate(full.size // P)
        assert pages is not None
        t0 = clock()
        res = tree.insert(NS, full, pages)
        second.append(clock() - t0)
        pool.free(pages[: res.existing_pages])
    for toks in w.long:
        pages = pool.allocate(toks.size // P)
        assert pages is not None
        res = tree.insert(NS, toks, pages)
        pool.free(pages[: res.existing_pages])
    return first, second


def build_naive(cache: NaiveCache, w: Workload) -> tuple[list[float], list[float]]:
    first = []
    clock = time.perf_counter
    page = 0
    for toks in w.first:
        pages = list(range(page, page + toks.size // P))
        page += len(pages)
        t0 = clock()
        cache.insert(toks, pages)
        first.append(clock() - t0)
    second = []
    for toks, turn in zip(w.first, w.turns):
        full = np.concatenate([toks, turn])
        pages = list(range(page, page + full.size // P))
        page += len(pages)
        t0 = clock()
        cache.insert(full, pages)
        second.append(clock() - t0)
    for toks in w.long:
        cache.insert(toks, list(range(page, page + toks.size // P)))
        page += toks.size // P
    return first, second


def bench_match(tree: RadixTree, naive: NaiveCache, w: Workload, reps: int) -> dict[str, Any]:
    cases = {
        "hit_4k": [w.first[i % len(w.first)] for i in range(reps)],
        "hit_32k": [w.long[i % len(w.long)] for i in range(reps)],
        "miss_4k": [w.miss4k] * reps,
        "miss_32k": [w.miss32k] * reps,
    }
    out: dict[str, Any] = {}
    for name, inputs in cases.items():
        ours = timed(lambda i: tree.match(NS, inputs[i]), reps)
        base = timed(lambda i: naive.match(inputs[i]), max(20, reps // 20))
        o, b = _us(ours), _us(base)
        out[name] = {"ours": o, "naive": b, "speedup": _ratio(b["median_us"], o["median_us"])}
    return out


def bench_evict(w: Workload, pages_to_evict: int) -> dict[str, Any]:
    """Evict from the tree and return the pages to the pool (both timed)."""
    tree = RadixTree(P, make_eviction_policy("lru"))
    pool = PageAllocator(len(w.first) * 320 + len(w.long) * 2048 + 1024)
    build(tree, pool, w)
    before = pool.free_count
    t0 = time.perf_counter()
    pool.free(tree.evict(pages_to_evict).device_pages)
    ours = time.perf_counter() - t0
    naive = NaiveCache(P)
    build_naive(naive, w)
    t0 = time.perf_counter()
    naive.evict(pages_to_evict)
    base = time.perf_counter() - t0
    return {
        "pages": pool.free_count - before,
        "ours_ms": round(ours * 1e3, 3),
        "naive_ms": round(base * 1e3, 3),
        "speedup": _ratio(base, ours),
    }


def bench_hash(reps: int) -> dict[str, Any]:
    """Event block ids (vectorized) against storage keys (blake2b chain) and
    the naive per-page sha256 of a pickle, for a 32k-token prompt."""
    toks = np.random.default_rng(2).integers(0, VOCAB, 32768, dtype=np.int32)
    seed = namespace_seed(NS.digest())
    ids = timed(lambda _: block_ids(toks, P, None, seed), reps * 10)
    keys = timed(lambda _: chain_keys(bytes(16), toks, P), reps)
    base = timed(lambda _: naive_page_hashes(toks, P), max(3, reps // 5))
    i, k, b = (statistics.median(x) for x in (ids, keys, base))
    pages = toks.size // P
    return {
        "tokens": toks.size,
        "block_ids_us_per_page": round(i / pages * 1e6, 4),
        "storage_keys_blake2b_us_per_page": round(k / pages * 1e6, 4),
        "naive_sha256_pickle_us_per_page": round(b / pages * 1e6, 4),
        "block_ids_speedup_over_blake2b": _ratio(k, i),
    }


def bench_memory(w: Workload) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tree = RadixTree(P, make_eviction_policy("lru"))
    pool = PageAllocator(len(w.first) * 320 + len(w.long) * 2048 + 1024)
    build(tree, pool, w)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    naive = NaiveCache(P)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    build_naive(naive, w)
    naive_used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "cached_pages": tree.device_pages,
        "nodes": tree.node_count,
        "ours_bytes_per_page": round(used / tree.device_pages, 1),
        "ours_bytes_per_page_without_tokens": round(
            (used - tree.device_pages * P * 4) / tree.device_pages, 1
        ),
        "naive_bytes_per_page": round(naive_used / naive.size, 1),
        "pool_capacity_pages": pool.capacity,
    }


def run(quick: bool, runs: int = 1, with_peer: bool = False) -> dict[str, Any]:
    caveat = run_note(quick)  # the load before this run adds its own
    """Tree-level figures against the naive baseline (one run), then the
    public API figures with events and, with ``with_peer``, SGLang's Rust tree
    core, ``runs`` times each, with the target table."""
    conversations = 80 if quick else 450
    w = Workload(conversations, long_docs=4 if quick else 8)
    tree = RadixTree(P, make_eviction_policy("lru"))
    pool = PageAllocator(conversations * 320 + len(w.long) * 2048 + 1024)
    first, second = build(tree, pool, w)
    naive = NaiveCache(P)
    nfirst, nsecond = build_naive(naive, w)
    ins: dict[str, dict[str, Any]] = {
        "insert_4k_shared_system": {"ours": _us(first), "naive": _us(nfirst)},
        "insert_turn2_4k+512": {"ours": _us(second), "naive": _us(nsecond)},
    }
    for v in ins.values():
        v["speedup"] = _ratio(v["naive"]["median_us"], v["ours"]["median_us"])
    replay_sizes = {
        "conversations": 60 if quick else 200,
        "turns": 6 if quick else 10,
        "capacity": 20_000 if quick else 60_000,
    }
    result: dict[str, Any] = {
        "benchmark": "tree",
        "page_size": P,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        # glibc's allocator settings for this process (README "Benchmarks":
        # glibc.malloc.hugetlb=1 takes most page faults off tree growth)
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        # whose copy and compare the targets' memory floors time (tree_api.floor_*)
        "memory_floor_calls": FLOOR_CALLS,
        "tree_pages": tree.device_pages,
        "tree_nodes": tree.node_count,
        "tree_level": "RadixTree and PageAllocator alone, no events, against the naive cache",
        "insert": ins,
        "match": bench_match(tree, naive, w, reps=300 if quick else 2000),
        "evict_10k_pages": bench_evict(w, 10_000 if not quick else 2_000),
        "mixed_replay": mixed_replay(**replay_sizes),
        "page_hash_32k": bench_hash(reps=10 if quick else 40),
        "memory": bench_memory(w),
    }
    del tree, pool, naive
    sizes = tree_targets.Sizes(
        conversations=conversations,
        long_docs=len(w.long),
        reps=300 if quick else 2000,
        evictions=3,
        replay_conversations=replay_sizes["conversations"],
        replay_turns=replay_sizes["turns"],
        replay_capacity=replay_sizes["capacity"],
    )
    seqs = replay_requests(replay_sizes["conversations"], replay_sizes["turns"])
    make_peer, note = tree_targets.peer_factory(with_peer)
    ours_runs: list[dict[str, float]] = []
    peer_runs: list[dict[str, float]] = []
    for _ in range(runs):
        mine, theirs = tree_targets.measure(make_peer, w, seqs, sizes)
        ours_runs.append(mine)
        if theirs is not None:
            peer_runs.append(theirs)
    result["public_api"] = {
        "what": "RadixCache admit/reserve/commit/release, record_events=True, take_events() after every request",
        "runs": ours_runs,
    }
    if peer_runs:
        result["sglang_rust"] = {"what": note, "runs": peer_runs}
    result["targets"] = tree_targets.table(ours_runs, peer_runs or None, note, caveat)
    result = with_note(result, caveat)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = CliParser(prog="radixcache bench tree", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one run, no peer (smoke test)")
    parser.add_argument(
        "--runs", type=int, default=None,
        help="runs of the target figures, medians (None: 3, or 1 with --quick)"
    )
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument("--peer", action="store_true", help="time SGLang's tree also with --quick")
    peer.add_argument(
        "--no-peer", action="store_true", help="skip the SGLang baseline even if it is importable"
    )
    args = parser.parse_args(argv)
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if runs < 1:
        parser.error(f"--runs must be >= 1, got {runs}")
    with_peer = args.peer or not (args.no_peer or args.quick)
    json.dump(run(args.quick, runs, with_peer), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

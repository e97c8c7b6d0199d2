"""The tree benchmark's target table: the public API with events on, against
SGLang's Rust tree core measured in the same run.

Each run measures both sides on the same workload, their calls interleaved
(``interleaved``: chunks of calls taking turns), so that the drift of a
shared machine's speed falls on both; with ``runs > 1`` every figure is the
median over runs, and every ratio is the median of the per-run ratios.

Two yardsticks on the peer's side: its scheduler's path (``sglang_rust``:
what SGLang's scheduler calls per request, the device indices and the lock
included) and, for the lookups and the insert, its Rust core's call alone
(``sglang_rust_core``: the walk, the insert call). The second is the
stricter one: every ratio against it is smaller.

On our side, each lookup and the insert also time their memory floor
(``tree_api.floor_*``: the prompt's copy and the token compare alone, interleaved
with the rest): a row gets ``memory_floor``, ``above_floor`` (bookkeeping)
and ``bound_below_floor`` (an absolute bound no cache that copies the
prompt and compares tokens can meet here); with the peer's core,
``ratio_core_ceiling`` (its call over our floor, per run: the best ratio
such a cache could reach against it).
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcache.cli.bench import tree_api, verdict
from radixcache.cli.bench.sglang_tree import SglangTree, load
from radixcache.cli.bench.tree_api import timed


@dataclass(frozen=True, slots=True)
class Target:
    """One row of the table: an absolute bound and a ratio over the peer."""

    figure: str  # key in a run's figures
    label: str  # what the row measures
    unit: str  # "us", "ms", "req/s" or "B"
    bound: float  # absolute target (upper bound, or lower bound for req/s)
    min_ratio: float | None  # times better than the peer, None: no ratio target

    @property
    def higher_is_better(self) -> bool:
        return self.unit == "req/s"


TARGETS = (
    Target("hit_32k_us", "match (admit+release) 32k-token full hit", "us", 15, 3),
    Target("hit_4k_us", "match 4k full hit", "us", 5, 3),
    Target("miss_4k_us", "match 4k full miss", "us", 3, 3),
    Target("miss_32k_us", "match 32k full miss", "us", 3, 3),
    Target("insert_4k_us", "insert a 4k-token request (admit/reserve/commit/release)", "us", 10, 3),
    Target("evict_10k_ms", "evict 10k pages, returned to the pool", "ms", 0.35, 3),
    Target("replay_req_per_s", "mixed multi-turn replay", "req/s", 30_000, 3),
    Target("bytes_per_page", "bytes per cached page, RSS, token ids and events included", "B", 80, None),
)


@dataclass(frozen=True, slots=True)
class Sizes:
    conversations: int  # first turns of 4k tokens (1k shared system prompt)
    long_docs: int  # 32k-token documents
    reps: int  # timed lookups per case
    evictions: int  # consecutive 10k-page evictions timed
    replay_conversations: int
    replay_turns: int
    replay_capacity: int  # pages


CHUNK = 25  # calls a side makes in a row before the other side's turn


def interleaved(
    mine: Callable[[int], object], theirs: Callable[[int], object] | None, n: int,
    *more: Callable[[int], object],
) -> tuple[list[float], ...]:
    """Seconds of each of ``mine(0) .. mine(n-1)`` and of ``theirs``'s (and of
    each of ``more``'s), timed one call at a time (``timed``) in chunks of
    ``CHUNK`` calls that take turns, the order rotated every chunk (with two
    sides: the side going first swapped): a drift of the machine's speed
    (minutes here) falls on every side alike. ``theirs`` None: ``mine``
    alone (and ``more``)."""
    out: tuple[list[float], ...] = tuple([] for _ in range(2 + len(more)))
    sides = list(zip((mine, theirs, *more), out))
    for start in range(0, n, CHUNK):
        for fn, samples in sides:
            if fn is not None:
                samples += timed(fn, min(n, start + CHUNK), start)
        sides = sides[1:] + sides[:1]
    return out


def measure(
    make: Any, w: Any, seqs: list[np.ndarray], s: Sizes
) -> tuple[dict[str, float], dict[str, float] | None]:
    """One run of the public API figures (events recorded, drained every
    request) and, when ``make`` builds the peer (SGLang's Rust tree core),
    the same figures for the peer, every compared call timed interleaved
    with the peer's (``interleaved``); None for the peer without one. The
    peer's figures also hold ``core_*``: its Rust core's walk alone for the
    lookups, its insert call alone for the insert (sglang_tree.py)."""
    capacity = s.conversations * 320 + s.long_docs * 2048 + 1024
    gc.collect()
    cache = tree_api.make_cache(capacity)
    peer: SglangTree | None = None if make is None else make(capacity)
    seconds = [np.concatenate([a, b]) for a, b in zip(w.first, w.turns)]
    keys = {} if peer is None else {  # the peer's keys are built before its clock starts
        "first": [peer.key(x) for x in w.first], "second": [peer.key(x) for x in seconds],
        "long": [peer.key(x) for x in w.long], "miss4k": [peer.key(w.miss4k)], "miss32k": [peer.key(w.miss32k)],
    }

    def both(ours: Callable[[int], object], theirs: Callable[[Any, int], object], n: int,
             core: Callable[[Any, int], object] | None = None,
             floor: Callable[[int], object] | None = None) -> dict[str, list[float]]:
        """Each side's seconds per call, interleaved: "ours", "peer" (empty
        without one), "core" (the peer's core call, when given) and "floor"
        (``tree_api.floor_*``, when given)."""
        more: dict[str, Callable[[int], object]] = {}
        if peer is not None and core is not None:
            more["core"] = lambda i: core(peer, i)
        if floor is not None:
            more["floor"] = floor
        sides = interleaved(ours, None if peer is None else (lambda i: theirs(peer, i)), n, *more.values())
        return dict(zip(("ours", "peer", *more), sides))

    if peer is not None:
        peer.insert_s.clear()
    insert_floor, kept = tree_api.floor_insert(w.first, tree_api.SYSTEM)
    first_s = both(lambda i: tree_api.serve(cache, w.first[i]), lambda t, i: t.serve(keys["first"][i]),
                   len(w.first), floor=insert_floor)
    insert_call_s = [] if peer is None else list(peer.insert_s)
    second_s = both(lambda i: tree_api.serve(cache, seconds[i]), lambda t, i: t.serve(keys["second"][i]), len(seconds))
    for i, doc in enumerate(w.long):
        tree_api.serve(cache, doc)
        if peer is not None:
            peer.serve(keys["long"][i])
    cases = {"hit_32k": (w.long, "long"), "hit_4k": (w.first, "first"), "miss_4k": ([w.miss4k], "miss4k"),
             "miss_32k": ([w.miss32k], "miss32k")}

    def lookup(name: str, arrays: list[np.ndarray], key: str) -> dict[str, list[float]]:
        return both(lambda i: tree_api.probe(cache, arrays[i % len(arrays)]),
                    lambda t, i: t.probe(keys[key][i % len(keys[key])]), s.reps,
                    lambda t, i: t.match(keys[key][i % len(keys[key])]),
                    tree_api.floor_lookup(arrays, hit=name.startswith("hit")))

    looked = {name: lookup(name, arrays, key) for name, (arrays, key) in cases.items()}
    evicted: list[tuple[float, int]] = []
    peer_evicted: list[float] = []
    tree_pages = float(cache.tree.device_pages)
    peer_pages = 0.0 if peer is None else float(peer.cached_pages())
    for k in range(s.evictions):  # one eviction a side in turn, the first side swapped
        for side in ("ours", "peer") if k % 2 == 0 else ("peer", "ours"):
            if side == "ours":
                evicted += tree_api.evictions(cache, 10_000, 1)
            elif peer is not None:
                peer_evicted += timed(lambda _: peer.evict_pages(10_000), 1)
    cache.check_integrity()
    del cache, peer, kept
    gc.collect()
    replay_cache = tree_api.make_cache(s.replay_capacity)
    replay_peer: SglangTree | None = None if make is None else make(s.replay_capacity)
    replay_keys = [] if replay_peer is None else [replay_peer.key(x) for x in seqs]
    hits: list[int] = []
    replayed = interleaved(lambda i: hits.append(tree_api.serve(replay_cache, seqs[i])),
                           None if replay_peer is None else lambda i: replay_peer.serve(replay_keys[i]),
                           len(seqs))
    replay_cache.check_integrity()
    del replay_cache, replay_peer
    # Tenant bookkeeping against the same replay without it (ours alone, each
    # replay timed as a whole loop).
    plain, _ = tree_api.replay(seqs, s.replay_capacity)
    tenants = {name: tree_api.replay(seqs, s.replay_capacity, book())[0]
               for name, book in tree_api.QUOTA_CASES.items()}
    mem = tree_api.rss_per_page(s.conversations, s.long_docs, capacity)
    traced = tree_api.bytes_per_page(w.first, w.turns, w.long, capacity)
    mine = {
        "tree_pages": tree_pages,
        **{f"{k}_us": tree_api.us(v["ours"]) for k, v in looked.items()},
        **{f"floor_{k}_us": tree_api.us(v["floor"]) for k, v in looked.items()},
        "insert_4k_us": tree_api.us(first_s["ours"]),
        "floor_insert_4k_us": tree_api.us(first_s["floor"]),
        "insert_turn2_us": tree_api.us(second_s["ours"]),
        "evict_10k_ms": round(statistics.median(t for t, _ in evicted) * 1e3, 3),
        "evict_pages_freed": float(statistics.median(p for _, p in evicted)),
        "replay_req_per_s": round(len(seqs) / sum(replayed[0])),
        "replay_hit_ratio": round(sum(hits) / sum(x.size for x in seqs), 4),
        "replay_plain_req_per_s": round(len(seqs) / plain),
        **{f"replay_{name}_req_per_s": round(len(seqs) / t) for name, t in tenants.items()},
        **{f"replay_{name}_vs_off": round(plain / t, 3) for name, t in tenants.items()},
        "bytes_per_page": mem["bytes_per_page"],
        "tracemalloc_bytes_per_page": traced["bytes_per_page"],
        "tracemalloc_bytes_per_page_without_tokens": traced["bytes_per_page_without_tokens"],
    }
    if make is None:
        return mine, None
    theirs = {
        "tree_pages": peer_pages,
        **{f"{k}_us": tree_api.us(v["peer"]) for k, v in looked.items()},
        "insert_4k_us": tree_api.us(first_s["peer"]),
        "insert_turn2_us": tree_api.us(second_s["peer"]),
        "evict_10k_ms": round(statistics.median(peer_evicted) * 1e3, 3),
        "replay_req_per_s": round(len(seqs) / sum(replayed[1])),
        **{f"core_{k}_us": tree_api.us(v["core"]) for k, v in looked.items()},
        "core_insert_4k_us": tree_api.us(insert_call_s),
    }
    return mine, theirs


def ratio(t: Target, mine: float, theirs: float) -> float:
    if t.higher_is_better:
        return mine / theirs if theirs else float("inf")
    return theirs / mine if mine else float("inf")


def _against(
    t: Target, runs_ours: list[dict[str, float]], runs_peer: list[dict[str, float]], key: str
) -> tuple[float, float]:
    """The peer's median of ``key`` over the runs, and the median of the
    per-run ratios of ``t``'s figure against it."""
    per_run = [ratio(t, a[t.figure], b[key]) for a, b in zip(runs_ours, runs_peer)]
    return statistics.median(r[key] for r in runs_peer), round(statistics.median(per_run), 2)


def table(
    runs_ours: list[dict[str, float]], runs_peer: list[dict[str, float]] | None, note: str,
    caveat: str | None = None,
) -> dict[str, Any]:
    """Medians over runs, per-run ratios' median, pass/fail per target
    (marked indicative when ``caveat`` says the run is not the measurement)."""
    rows = []
    for t in TARGETS:
        mine = statistics.median(r[t.figure] for r in runs_ours)
        row: dict[str, Any] = {"figure": t.label, "unit": t.unit, "radixcache": mine}
        abs_ok = mine >= t.bound if t.higher_is_better else mine <= t.bound
        row["target"] = f"{'>=' if t.higher_is_better else '<='} {t.bound:g} {t.unit}"
        row["absolute"] = verdict(abs_ok, caveat)
        floor = "floor_" + t.figure
        if floor in runs_ours[0]:  # the copy and the compare alone, same runs (tree_api.floor_*)
            row["memory_floor"] = statistics.median(r[floor] for r in runs_ours)
            row["above_floor"] = round(mine - row["memory_floor"], 2)
            row["bound_below_floor"] = t.bound < row["memory_floor"]
        if runs_peer and t.figure in runs_peer[0]:
            row["sglang_rust"], row["ratio_vs_sglang"] = _against(t, runs_ours, runs_peer, t.figure)
            if t.min_ratio is not None:
                row["ratio_target"] = f">= {t.min_ratio:g}x"
                row["ratio"] = verdict(row["ratio_vs_sglang"] >= t.min_ratio, caveat)
            core = "core_" + t.figure
            if core in runs_peer[0]:  # the Rust core's own call alone (sglang_tree.py)
                row["sglang_rust_core"], row["ratio_vs_sglang_core"] = _against(t, runs_ours, runs_peer, core)
                if t.min_ratio is not None:
                    row["ratio_core"] = verdict(row["ratio_vs_sglang_core"] >= t.min_ratio, caveat)
                if "memory_floor" in row:  # the best ratio a cache that copies and compares could reach
                    row["ratio_core_ceiling"] = round(statistics.median(
                        b[core] / a["floor_" + t.figure] for a, b in zip(runs_ours, runs_peer)), 2)
        elif t.min_ratio is not None:
            row["ratio_target"] = f">= {t.min_ratio:g}x"
            row["ratio"] = "not measured (no peer)"
        rows.append(row)
    return {"peer": note, "runs": len(runs_ours), "rows": rows}


def peer_factory(enabled: bool) -> tuple[Any, str]:
    if not enabled:
        return None, "SGLang baseline not requested"
    return load()

"""The tree benchmark's target table: the public API with events on, against
SGLang's Rust tree core measured in the same run.

Each run measures both sides on the same workload, one after the other; with
``runs > 1`` every figure is the median over runs, and every ratio is the
median of the per-run ratios (absolute times drift on a shared machine,
ratios measured side by side hold better).
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcache.cli.bench import tree_api, verdict
from radixcache.cli.bench.sglang_tree import SglangTree, load, rss_bytes
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


def ours(w: Any, seqs: list[np.ndarray], s: Sizes) -> dict[str, float]:
    """One run of the public API figures (events recorded, drained every request)."""
    capacity = s.conversations * 320 + s.long_docs * 2048 + 1024
    built = tree_api.build(capacity, w.first, w.turns, w.long)
    cache = built.cache
    cases = {"hit_32k": w.long, "hit_4k": w.first, "miss_4k": [w.miss4k], "miss_32k": [w.miss32k]}
    looked = tree_api.lookups(cache, cases, s.reps)
    evicted = tree_api.evictions(cache, 10_000, s.evictions)
    cache.check_integrity()
    seconds, hit_ratio = tree_api.replay(seqs, s.replay_capacity)
    tenants = {name: tree_api.replay(seqs, s.replay_capacity, book())[0]
               for name, book in tree_api.QUOTA_CASES.items()}
    mem = tree_api.rss_per_page(s.conversations, s.long_docs, capacity)
    traced = tree_api.bytes_per_page(w.first, w.turns, w.long, capacity)
    return {
        "tree_pages": float(built.cache.tree.device_pages + sum(p for _, p in evicted)),
        **{f"{k}_us": tree_api.us(v) for k, v in looked.items()},
        "insert_4k_us": tree_api.us(built.first_s),
        "insert_turn2_us": tree_api.us(built.second_s),
        "evict_10k_ms": round(statistics.median(t for t, _ in evicted) * 1e3, 3),
        "evict_pages_freed": float(statistics.median(p for _, p in evicted)),
        "replay_req_per_s": round(len(seqs) / seconds),
        "replay_hit_ratio": round(hit_ratio, 4),
        **{f"replay_{name}_req_per_s": round(len(seqs) / t) for name, t in tenants.items()},
        **{f"replay_{name}_vs_off": round(seconds / t, 3) for name, t in tenants.items()},
        "bytes_per_page": mem["bytes_per_page"],
        "tracemalloc_bytes_per_page": traced["bytes_per_page"],
        "tracemalloc_bytes_per_page_without_tokens": traced["bytes_per_page_without_tokens"],
    }


def peer(make: Any, w: Any, seqs: list[np.ndarray], s: Sizes) -> dict[str, float]:
    """The same figures for SGLang's UnifiedRadixCache (Rust tree core)."""
    capacity = s.conversations * 320 + s.long_docs * 2048 + 1024
    gc.collect()
    t: SglangTree = make(capacity)
    firsts = [t.key(x) for x in w.first]
    seconds = [t.key(np.concatenate([a, b])) for a, b in zip(w.first, w.turns)]
    longs = [t.key(x) for x in w.long]
    rss0 = rss_bytes()
    first_s = timed(lambda i: t.serve(firsts[i]), len(firsts))
    second_s = timed(lambda i: t.serve(seconds[i]), len(seconds))
    for k in longs:
        t.serve(k)
    pages = t.cached_pages()
    rss = rss_bytes() - rss0
    cases = {
        "hit_32k": longs,
        "hit_4k": firsts,
        "miss_4k": [t.key(w.miss4k)],
        "miss_32k": [t.key(w.miss32k)],
    }
    out: dict[str, float] = {"tree_pages": float(pages)}
    for name, keys in cases.items():
        out[f"{name}_us"] = tree_api.us(timed(lambda i: t.probe(keys[i % len(keys)]), s.reps))
    ev = []
    for _ in range(s.evictions):
        ev.append(timed(lambda _: t.evict_pages(10_000), 1)[0])
    out["insert_4k_us"] = tree_api.us(first_s)
    out["insert_turn2_us"] = tree_api.us(second_s)
    out["evict_10k_ms"] = round(statistics.median(ev) * 1e3, 3)
    del t
    gc.collect()
    r = make(s.replay_capacity)
    keys = [r.key(x) for x in seqs]
    total = timed(lambda i: r.serve(keys[i]), len(keys))
    out["replay_req_per_s"] = round(len(keys) / sum(total))
    # Rust memory is invisible to tracemalloc, and an RSS delta in this
    # process reuses memory freed by earlier figures: reported for what it
    # is, never compared (no ratio target on memory).
    out["rss_delta_bytes_per_page"] = round(rss / pages, 1)
    return out


def ratio(t: Target, mine: float, theirs: float) -> float:
    if t.higher_is_better:
        return mine / theirs if theirs else float("inf")
    return theirs / mine if mine else float("inf")


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
        if runs_peer and t.figure in runs_peer[0]:
            theirs = statistics.median(r[t.figure] for r in runs_peer)
            per_run = [ratio(t, a[t.figure], b[t.figure]) for a, b in zip(runs_ours, runs_peer)]
            row["sglang_rust"] = theirs
            row["ratio_vs_sglang"] = round(statistics.median(per_run), 2)
            if t.min_ratio is not None:
                row["ratio_target"] = f">= {t.min_ratio:g}x"
                row["ratio"] = verdict(row["ratio_vs_sglang"] >= t.min_ratio, caveat)
        elif t.min_ratio is not None:
            row["ratio_target"] = f">= {t.min_ratio:g}x"
            row["ratio"] = "not measured (no peer)"
        rows.append(row)
    return {"peer": note, "runs": len(runs_ours), "rows": rows}


def peer_factory(enabled: bool) -> tuple[Any, str]:
    if not enabled:
        return None, "SGLang baseline not requested"
    return load()

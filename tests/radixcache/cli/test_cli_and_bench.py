"""The tree benchmark runs end to end (no timing asserts)."""

from __future__ import annotations

import json

import pytest

from radixcache.cli.bench.tree import run
from radixcache.cli.bench.tree_replay import mixed_replay


def test_tree_benchmark_quick_produces_every_figure() -> None:
    result = run(quick=True)
    json.dumps(result)  # serializable
    assert set(result["match"]) == {"hit_4k", "hit_32k", "miss_4k", "miss_32k"}
    for case in result["match"].values():
        assert case["ours"]["median_us"] > 0 and case["naive"]["median_us"] > 0
    assert result["evict_10k_pages"]["pages"] >= 2000
    assert result["memory"]["cached_pages"] == result["tree_pages"]


def test_mixed_replay_is_deterministic() -> None:
    a = mixed_replay(conversations=10, turns=3, capacity=2000)
    b = mixed_replay(conversations=10, turns=3, capacity=2000)
    assert a["token_hit_ratio"] == b["token_hit_ratio"] and a["requests"] == 30
    assert 0.5 < a["token_hit_ratio"] < 1.0

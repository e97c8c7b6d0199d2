"""The tree benchmark's command, target table and optional peer (no timing asserts)."""

from __future__ import annotations

import importlib
import json
from typing import Any

import numpy as np
import pytest

from radixcache.cli.bench import sglang_tree, tree, tree_api, tree_replay, tree_targets


def test_command_reports_every_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert tree.main(["--quick"]) == 0  # one run, no peer
    out = json.loads(capsys.readouterr().out)
    rows = out["targets"]["rows"]
    assert [r["figure"] for r in rows] == [t.label for t in tree_targets.TARGETS]
    assert out["note"].startswith("not the measurement: a --quick smoke run")
    for row in rows:  # a quick run's verdicts are marked indicative
        assert row["radixcache"] > 0
        assert row["absolute"] in ("pass (indicative only: see note)",
                                   "fail (indicative only: see note)")
    assert out["targets"]["peer"] == "SGLang baseline not requested"
    floored = {r["figure"]: r for r in rows if "memory_floor" in r}
    lookups = {t.label for t in tree_targets.TARGETS if t.figure.startswith(("hit_", "miss_", "insert_"))}
    assert set(floored) == lookups  # the four lookups and the insert carry their floor
    for row in floored.values():
        assert row["memory_floor"] > 0
        assert row["above_floor"] == round(row["radixcache"] - row["memory_floor"], 2)
        assert isinstance(row["bound_below_floor"], bool)
    (run,) = out["public_api"]["runs"]
    assert run["evict_pages_freed"] == 10_000  # page-granular: exactly what was asked
    assert 0.5 < run["replay_hit_ratio"] < 1.0


def test_table_takes_medians_and_per_run_ratios() -> None:
    names = [t.figure for t in tree_targets.TARGETS]
    ours = [dict.fromkeys(names, 10.0) | {"replay_req_per_s": r} for r in (30_000.0, 60_000.0, 40_000.0)]
    peer = [dict.fromkeys(names, 40.0) | {"replay_req_per_s": r} for r in (10_000.0, 10_000.0, 20_000.0)]
    table = tree_targets.table(ours, peer, "peer")
    rows = {r["figure"]: r for r in table["rows"]}
    replay = rows["mixed multi-turn replay"]
    assert replay["radixcache"] == 40_000 and replay["sglang_rust"] == 10_000
    assert replay["ratio_vs_sglang"] == 3.0  # median of 3, 6, 2
    assert replay["absolute"] == "pass" and replay["ratio"] == "pass"
    hit = rows["match (admit+release) 32k-token full hit"]
    assert hit["ratio_vs_sglang"] == 4.0 and hit["absolute"] == "pass" and hit["ratio"] == "pass"
    miss = rows["match 4k full miss"]
    assert miss["absolute"] == "fail"  # 10 us > 3 us
    assert "sglang_rust_core" not in hit  # no core figure in these runs
    alone = tree_targets.table(ours, None, "none")
    assert alone["rows"][0]["ratio"] == "not measured (no peer)"


def test_table_reports_the_rust_core_alone_beside_the_scheduler_path() -> None:
    names = [t.figure for t in tree_targets.TARGETS]
    ours = [dict.fromkeys(names, 10.0) for _ in range(3)]
    peer = [dict.fromkeys(names, 40.0) | {"core_hit_4k_us": c} for c in (20.0, 25.0, 35.0)]
    rows = {r["figure"]: r for r in tree_targets.table(ours, peer, "peer")["rows"]}
    hit = rows["match 4k full hit"]
    assert hit["ratio_vs_sglang"] == 4.0 and hit["ratio"] == "pass"
    assert hit["sglang_rust_core"] == 25.0
    assert hit["ratio_vs_sglang_core"] == 2.5  # median of 2.0, 2.5, 3.5
    assert hit["ratio_core"] == "fail"  # under 3x against the core alone
    assert "ratio_core" not in rows["match 4k full miss"]  # no core figure for it
    assert "ratio_core_ceiling" not in hit  # no floor in these runs
    floored = [r | {"floor_hit_4k_us": f} for r, f in zip(ours, (5.0, 10.0, 10.0))]
    hit = {r["figure"]: r for r in tree_targets.table(floored, peer, "peer")["rows"]}["match 4k full hit"]
    assert hit["ratio_core_ceiling"] == 3.5  # median of 20/5, 25/10, 35/10


def test_table_sets_each_figure_beside_its_memory_floor() -> None:
    names = [t.figure for t in tree_targets.TARGETS]
    ours = [dict.fromkeys(names, 10.0) | {"floor_hit_4k_us": f, "floor_miss_4k_us": 1.0}
            for f in (6.0, 7.0, 9.0)]
    rows = {r["figure"]: r for r in tree_targets.table(ours, None, "none")["rows"]}
    hit = rows["match 4k full hit"]
    assert hit["memory_floor"] == 7.0 and hit["above_floor"] == 3.0  # medians
    assert hit["bound_below_floor"] is True  # <= 5 us is under a 7 us floor
    assert rows["match 4k full miss"]["bound_below_floor"] is False  # <= 3 us over a 1 us floor
    assert "memory_floor" not in rows["mixed multi-turn replay"]


def test_floor_copies_the_prompt_and_compares_what_a_hit_compares() -> None:
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 1000, 4096, dtype=np.int32) for _ in range(3)]
    hit = tree_api.floor_lookup(prompts, hit=True)
    assert hit(4) == 4080  # prompts[1]: 4095 usable tokens, 255 whole pages agree
    miss = tree_api.floor_lookup(prompts, hit=False)
    own = miss(2)
    assert isinstance(own, np.ndarray) and np.array_equal(own, prompts[2])
    assert not np.shares_memory(own, prompts[2])  # a copy, as admit takes
    bad = [np.array([5, -1], dtype=np.int32)]
    with pytest.raises(ValueError, match="negative"):
        tree_api.floor_lookup(bad, hit=False)(0)
    floor, kept = tree_api.floor_insert(prompts, 1024)
    floor(0)
    floor(1)
    assert [k.size for k in kept] == [3072, 3072]  # the new tokens, kept as a tree keeps keys
    assert np.array_equal(kept[1], prompts[1][1024:])


def test_the_two_sides_take_turns_in_chunks_the_first_swapped_each_time() -> None:
    calls: list[tuple[str, int]] = []
    mine, theirs = tree_targets.interleaved(lambda i: calls.append(("mine", i)),
                                            lambda i: calls.append(("theirs", i)), 60)
    assert len(mine) == len(theirs) == 60 and min(mine + theirs) >= 0
    c = tree_targets.CHUNK
    want = ([("mine", i) for i in range(c)] + [("theirs", i) for i in range(c)]
            + [("theirs", i) for i in range(c, 2 * c)] + [("mine", i) for i in range(c, 2 * c)]
            + [("mine", i) for i in range(2 * c, 60)] + [("theirs", i) for i in range(2 * c, 60)])
    assert calls == want
    calls.clear()
    a, b, core = tree_targets.interleaved(lambda i: calls.append(("a", i)), lambda i: calls.append(("b", i)),
                                          3 * c, lambda i: calls.append(("core", i)))
    assert len(a) == len(b) == len(core) == 3 * c
    firsts = [calls[k * 3 * c][0] for k in range(3)]  # who went first in each chunk
    assert firsts == ["a", "b", "core"]  # the order rotates
    assert sorted(calls) == sorted((side, i) for side in ("a", "b", "core") for i in range(3 * c))
    calls.clear()
    alone, none = tree_targets.interleaved(lambda i: calls.append(("mine", i)), None, 30)
    assert len(alone) == 30 and none == [] and calls == [("mine", i) for i in range(30)]


def test_both_sides_run_the_same_workload_against_the_real_peer() -> None:
    make, note = sglang_tree.load()
    assert make is not None, note  # (installed by .ci/install-extras)
    w = tree_api.Workload(conversations=12, long_docs=1)
    seqs = tree_replay.replay_requests(6, 3)
    sizes = tree_targets.Sizes(conversations=12, long_docs=1, reps=60, evictions=2,
                               replay_conversations=6, replay_turns=3, replay_capacity=3000)
    mine, theirs = tree_targets.measure(make, w, seqs, sizes)
    assert theirs is not None
    for t in tree_targets.TARGETS:
        if t.min_ratio is not None:
            assert mine[t.figure] > 0 and theirs[t.figure] > 0, t.figure
    for figure in ("hit_32k_us", "hit_4k_us", "miss_4k_us", "miss_32k_us", "insert_4k_us"):
        assert theirs["core_" + figure] > 0, figure  # the Rust core's own call, timed too
    assert mine["tree_pages"] == theirs["tree_pages"]  # the same pages cached on both sides
    assert 0.5 < mine["replay_hit_ratio"] < 1.0


def test_peer_is_skipped_with_the_reason_when_sglang_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SGLang is installed here; its absence is simulated (the only way to test it).
    real = importlib.import_module

    def no_sglang(name: str, *args: Any) -> Any:
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(sglang_tree.importlib, "import_module", no_sglang)
    make, note = sglang_tree.load()
    assert make is None and note.startswith("sglang not importable: ModuleNotFoundError")

"""Trace replay: token synthesis, exact hits on hand-made traces, tiers,
determinism, bad input, sweeps and the command line."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from radixcache.cli import main
from radixcache.cli.replay.run import ReplayConfig, replay
from radixcache.cli.replay.trace import TraceError, TraceRequest, decode_tokens, load_trace, prompt_tokens

SLICE = Path(__file__).parent / "data" / "mooncake_slice.jsonl"  # first 200 lines of the trace
B = 512

# Four requests: a miss, a shared two-block prefix, a repeat, a one-block share.
HANDMADE = [
    {"timestamp": 0, "input_length": 1500, "output_length": 3, "hash_ids": [1, 2, 3]},
    {"timestamp": 1, "input_length": 1536, "output_length": 2, "hash_ids": [1, 2, 4]},
    {"timestamp": 2, "input_length": 1536, "output_length": 700, "hash_ids": [1, 2, 4]},
    {"timestamp": 3, "input_length": 600, "output_length": 1, "hash_ids": [1, 5]},
]


def write_trace(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def three_blocks(*starts: int) -> list[dict[str, object]]:
    """One 3-block request (1536 tokens) per start id: ids start, start+1, start+2."""
    return [
        {"timestamp": i, "input_length": 3 * B, "output_length": 1, "hash_ids": [s, s + 1, s + 2]}
        for i, s in enumerate(starts)
    ]


def req(ids: list[int], n: int) -> TraceRequest:
    return TraceRequest(1, n, 0, np.asarray(ids, dtype=np.int64))


# ---------------------------------------------------------------------- tokens
def test_equal_ids_give_equal_tokens_and_the_last_block_is_cut() -> None:
    a = prompt_tokens(req([1, 2, 3], 1500))
    b = prompt_tokens(req([1, 2, 4], 1536))
    assert a.dtype == np.int32 and a.size == 1500 and b.size == 1536
    assert np.array_equal(a[:1024], b[:1024])  # blocks 1 and 2
    assert not np.any(a[1024:] == b[1024:1500])  # blocks 3 and 4 differ everywhere here
    assert np.array_equal(prompt_tokens(req([9], 100)), prompt_tokens(req([9], 512))[:100])
    assert a.min() >= 0 and len(np.unique(a)) > 1490  # spread over 31 bits
    out = decode_tokens(0, 600)
    assert out.size == 600 and not np.array_equal(out, decode_tokens(1, 600))
    assert not np.isin(out, a).any()


# ---------------------------------------------------------------------- exact hits
@pytest.mark.parametrize(
    ("page_size", "hits"),
    [
        # Admission matches at most input_length - 1 tokens, in whole pages.
        (512, [0, 1024, 1024, 512]),  # request 3 cannot hit its last page (1535 usable)
        (256, [0, 1024, 1280, 512]),  # ... but can hit the first half of block 4
        (1024, [0, 1024, 1024, 0]),  # 600 tokens fill no page
    ],
)
def test_handmade_trace_exact_hits(tmp_path: Path, page_size: int, hits: list[int]) -> None:
    trace = load_trace(write_trace(tmp_path / "t.jsonl", HANDMADE))
    result = replay(trace, ReplayConfig(page_size=page_size, device_pages=64, check_integrity=True))
    f = result.figures
    assert (f.requests, f.prompt_tokens) == (4, 1500 + 1536 + 1536 + 600)
    assert f.hit_device_tokens == sum(hits) and f.hit_tokens == sum(hits)
    assert f.hit_host_tokens == f.hit_storage_tokens == 0
    assert f.saved_tokens == sum(hits) and f.device_evicted_pages == 0
    config = ReplayConfig(page_size=page_size, device_pages=64)
    per_request = [replay(trace[: i + 1], config).figures.hit_tokens for i in range(4)]
    assert np.diff([0, *per_request]).tolist() == hits


def test_warmup_limit_and_decode(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", HANDMADE)
    f = replay(load_trace(path), ReplayConfig(device_pages=64, warmup=0.5)).figures
    assert (f.warmup_requests, f.requests, f.prompt_tokens, f.hit_tokens) == (2, 2, 2136, 1536)
    assert len(load_trace(path, limit=3)) == 3
    d = replay(load_trace(path), ReplayConfig(device_pages=64, decode=True, check_integrity=True))
    assert d.figures.decode_tokens == 3 + 2 + 700 + 1
    assert d.figures.hit_tokens == 2560  # generated tokens are never in a later prompt


def test_a_prompt_larger_than_the_pool_is_rejected_not_counted(tmp_path: Path) -> None:
    trace = load_trace(write_trace(tmp_path / "t.jsonl", HANDMADE))
    f = replay(trace, ReplayConfig(device_pages=2, check_integrity=True)).figures
    assert (f.requests, f.rejected_requests) == (1, 3)  # only the 600-token prompt fits
    assert f.prompt_tokens == 600


# ---------------------------------------------------------------------- tiers
def test_host_tier_serves_what_the_small_device_evicted(tmp_path: Path) -> None:
    # Device 4 pages: B evicts A (copied to host by write-through), A's repeat
    # loads 2 pages back from host, which evicts B, whose repeat does the same.
    trace = load_trace(write_trace(tmp_path / "t.jsonl", three_blocks(10, 20, 10, 20)))
    f = replay(trace, ReplayConfig(device_pages=4, host_pages=16, check_integrity=True)).figures
    assert (f.hit_device_tokens, f.hit_host_tokens, f.hit_storage_tokens) == (0, 2 * 1024, 0)
    assert f.saved_tokens == 2048 and f.failed_jobs == 0
    without = replay(trace, ReplayConfig(device_pages=4)).figures
    # Device alone: eviction takes only the 2 pages wanted (a leaf's tail), so
    # each repeat still finds its first page (512 tokens) on the device.
    assert without.hit_tokens == 2 * 512 < f.saved_tokens


def test_storage_tier_serves_what_host_dropped(tmp_path: Path) -> None:
    # Host 4 pages holds one request: A is dropped from host, but LMDB kept it.
    trace = load_trace(write_trace(tmp_path / "t.jsonl", three_blocks(10, 20, 30, 10)))
    config = ReplayConfig(device_pages=4, host_pages=4, storage_pages=64, check_integrity=True)
    f = replay(trace, config).figures
    assert (f.hit_device_tokens, f.hit_host_tokens, f.hit_storage_tokens) == (0, 0, 1024)
    assert f.saved_tokens == 1024 and f.failed_jobs == 0 and f.host_evicted_pages > 0
    no_storage = replay(trace, ReplayConfig(device_pages=4, host_pages=4)).figures
    assert no_storage.hit_tokens == 0


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_tiered_replay_is_deterministic(write_policy: str) -> None:
    trace = load_trace(SLICE)
    config = ReplayConfig(device_pages=400, host_pages=800, storage_pages=3000,
                          write_policy=write_policy)
    a = replay(trace, replace(config, check_integrity=True))
    b = replay(trace, config)
    assert a.figures == b.figures
    f = a.figures
    assert f.hit_device_tokens > 0 and f.hit_host_tokens > 0 and f.hit_storage_tokens > 0
    assert f.saved_tokens == f.hit_tokens and f.failed_jobs == 0
    assert f.requests == 200 and f.prompt_tokens == sum(r.input_length for r in trace)


def test_large_device_pool_without_tiers_allocates_no_kv() -> None:
    config = ReplayConfig(device_pages=100_000)
    assert not config.cache_config(None).allocate_kv
    f = replay(load_trace(SLICE, limit=50), config).figures
    assert f.device_evicted_pages == 0 and f.requests == 50


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"input_length": 10, "output_length": 1, "hash_ids": [1]', "t.jsonl:2: malformed JSON"),
        ('{"input_length": 10, "hash_ids": [1]}', "t.jsonl:2: missing key(s) output_length"),
        ('{"input_length": 600, "output_length": 1, "hash_ids": [1]}', "expected 1..512"),
        ('{"input_length": 512, "output_length": 1, "hash_ids": [1, 2]}', "expected 513..1024"),
        ('{"input_length": 0, "output_length": 1, "hash_ids": [1]}', "input_length must be"),
        ('{"input_length": 10, "output_length": -1, "hash_ids": [1]}', "output_length must be"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": []}', "non-empty list"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [-1]}', "got -1"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [true]}', "got True"),
        ('{"input_length": 10.5, "output_length": 1, "hash_ids": [1]}', "input_length must be"),
        ('[1, 2]', "expected a JSON object"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_length": 10, "output_length": 1, "hash_ids": [1]}\n' + line + "\n")
    with pytest.raises(TraceError, match=None) as info:
        load_trace(path)
    assert message in str(info.value) and ":2:" in str(info.value)


def test_empty_trace_and_blank_lines(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no requests"):
        load_trace(write_trace(tmp_path / "e.jsonl", []))
    path = tmp_path / "b.jsonl"
    path.write_text('\n{"input_length": 10, "output_length": 1, "hash_ids": [1]}\n\n')
    assert [r.line for r in load_trace(path)] == [2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"page_size": 100}, "power of two"),
        ({"storage_pages": 10}, "needs a host tier"),
        ({"warmup": 1.0}, "warmup"),
        ({"device_pages": 0}, "device pages"),
        ({"eviction_policy": "nope"}, "nope"),
        ({"host_pages": 4, "write_policy": "nope"}, "nope"),
    ],
)
def test_bad_config(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayConfig(**options)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- command line
def test_cli_single_run_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", HANDMADE)
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--device-pages", "64", "--json", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "hit tokens" in text and "prefill only" in text
    report = json.loads(out.read_text())
    assert report["figures"]["hit_tokens"] == 2560
    assert report["figures"]["hit_ratio"] == 2560 / 5172
    assert report["config"]["page_size"] == 512 and report["config"]["device_pages"] == 64
    assert main(["replay", str(trace), "--device-pages", "64", "--json", "-"]) == 0
    captured = capsys.readouterr()  # stdout is the JSON alone; the summary goes to stderr
    assert json.loads(captured.out)["figures"] == report["figures"]
    assert "hit tokens" in captured.err


def test_cli_json_is_the_same_run_after_run(tmp_path: Path) -> None:
    args = ["replay", str(SLICE), "--device-pages", "300", "--host-pages", "600",
            "--storage-pages", "2000", "--warmup", "0.25", "--quiet", "--json"]
    figures = []
    for name in ("a.json", "b.json"):
        assert main([*args, str(tmp_path / name)]) == 0
        figures.append(json.loads((tmp_path / name).read_text())["figures"])
    assert figures[0] == figures[1] and figures[0]["warmup_requests"] == 50


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--page-size", "100"], "power of two"),
        (["--storage-pages", "8"], "needs a host tier"),
        (["--sweep", "device=1,x"], "must be ints"),
        (["--sweep", "gpu=1,2"], "tier must be one of"),
        (["--sweep", "host=1,2", "--host-ratio", "2"], "device sweep only"),
        (["--sweep", "1,2", "--json", "x.json"], "single runs"),
    ],
)
def test_cli_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", HANDMADE)
    assert main(["replay", str(trace), *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_bad_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_length": 10, "output_length": 1, "hash_ids": [1]}\n{oops\n')
    assert main(["replay", str(path)]) == 2
    assert f"{path}:2: malformed JSON" in capsys.readouterr().err


def test_sweep_writes_csv_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", three_blocks(10, 20, 10, 20, 30, 10))
    prefix = tmp_path / "sweep"
    has_plot = importlib.util.find_spec("matplotlib") is not None
    argv = ["replay", str(trace), "--sweep", "8,4,16", "--host-ratio", "2", "--out", str(prefix),
            "--quiet"]
    assert main(argv if has_plot else [*argv, "--no-plot"]) == 0
    assert "| device capacity (pages) | device capacity (GB) |" in capsys.readouterr().out
    with open(f"{prefix}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["device_pages"], r["host_pages"]) for r in rows] == [("8", "16"), ("4", "8"),
                                                                     ("16", "32")]
    data = json.loads(Path(f"{prefix}.json").read_text())
    assert data["sweep"] == {"tier": "device", "values": [8, 4, 16]}
    assert [p["figures"]["hit_tokens"] for p in data["points"]] == [
        float(r["hit_tokens"]) for r in rows
    ]
    if has_plot:
        assert Path(f"{prefix}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_without_matplotlib_says_how_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    trace = write_trace(tmp_path / "t.jsonl", HANDMADE)
    assert main(["replay", str(trace), "--sweep", "4,8", "--out", str(tmp_path / "s")]) == 2
    assert "pip install 'radixcache[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()  # refused before replaying anything


def test_a_sweep_sizes_hardware_gb_warm_up_ceiling_part_of_trace_host_and_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Capacity in pages and GB; the context every output carries; the plot's
    axes (GB below, pages above, scales named) and the ceiling line."""
    from radixcache.cli.replay.capacity import Planning
    from radixcache.cli.replay.figure import draw_sweep
    from radixcache.cli.replay.plot import Sweep, sweep_configs
    from radixcache.cli.replay.run import ReplayConfig, replay

    # the 4th request needs 6 pages: the 4-page point rejects it
    small = [{"timestamp": i, "input_length": 12, "output_length": 1,
              "hash_ids": [s, s + 1, s + 2]} for i, s in enumerate((10, 20, 10, 20, 30, 10))]
    trace = write_trace(tmp_path / "t.jsonl", small + [
        {"timestamp": 9, "input_length": 24, "output_length": 1, "hash_ids": list(range(90, 96))}])
    prefix = tmp_path / "plan"
    argv = ["replay", str(trace), "--sweep", "4,8,32", "--host-pages", "8", "--write-policy",
            "write_back", "--warmup", "0.25", "--limit", "6", "--kv-bytes-per-token", "1000000",
            "--page-size", "4", "--block-size", "4", "--out", str(prefix), "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"trace: {trace}, first 6 of 7 requests (--limit)" in out
    assert "warm-up: first 1 requests (25%) fill the cache and are not counted" in out
    assert ("pages of 4 tokens; 1,000,000 B of KV per token (--kv-bytes-per-token); host tier "
            "8 pages (0.0 GB), write policy write_back") in out
    assert re.search(r"trace ceiling \(a cache that never evicts\): [\d.]+% hit ratio", out)
    with open(f"{prefix}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["device_gb"] for r in rows] == ["0.016", "0.032", "0.128"]  # pages * 4 * 1e6 / 1e9
    assert {r["replayed_requests"] for r in rows} == {"6"} and {r["trace_requests"] for r in rows} == {"7"}
    assert {r["warmup_fraction"] for r in rows} == {"0.25"} and {r["write_policy"] for r in rows} == {"write_back"}
    assert len({r["ceiling_hit_ratio"] for r in rows}) == 1
    assert all(float(r["hit_ratio"]) <= float(r["ceiling_hit_ratio"]) + 1e-9 for r in rows)
    assert Path(f"{prefix}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the picture itself, drawn from a sweep where a request is rejected
    requests = load_trace(trace, 4)
    base = ReplayConfig(page_size=4, block_size=4, host_pages=8, write_policy="write_back")
    sweep = Sweep("device", (4, 8, 32))
    results = [replay(requests, c) for c in sweep_configs(base, sweep, None)]
    assert results[0].figures.rejected_requests == 1
    plan = Planning(str(trace), 7, 7, 1_000_000, "custom", 0.5)
    fig = draw_sweep(results, sweep, plan)
    ax = fig.axes[0]
    assert "GB of KV at 1,000,000 B of KV per token (custom) (log scale, base 2)" in ax.get_xlabel()
    assert ax.get_ylabel() == "prompt tokens served from cache (linear scale)"
    top = [a for a in fig.axes[0].child_axes]
    assert top and "pages of 4 tokens (same log scale, base 2)" in top[0].get_xlabel()
    title = ax.get_title(loc="left")
    for fragment in ("all 7 requests", "warm-up: first 0 requests", "write policy write_back",
                     "host tier 8 pages", "rejected requests (prompt larger than the device pool): 1"):
        assert fragment in title, title
    ceiling = [line for line in ax.get_lines() if "trace ceiling" in str(line.get_label())]
    assert ceiling and list(ceiling[0].get_ydata()) == [0.5, 0.5]
    texts = [t.get_text() for t in ax.texts]
    assert any("1 rejected" in t for t in texts)


def test_cli_quotas_bound_the_replayed_cache(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The trace's requests carry no salt: "(none)" (or "*") bounds them, another
    tenant's quota does not; the report and the JSON say which quotas ran."""
    trace = write_trace(tmp_path / "t.jsonl", HANDMADE)
    hits = {}
    for quotas in ('{"(none)": {"device_pages": 1}}', '{"*": {"device_pages": 1}}',
                   '{"someone": {"device_pages": 1}}'):
        out = tmp_path / "r.json"
        assert main(["replay", str(trace), "--device-pages", "64", "--quiet", "--quotas", quotas,
                     "--json", str(out)]) == 0
        assert f"; quotas {quotas}" in capsys.readouterr().out
        report = json.loads(out.read_text())
        assert report["config"]["quotas"] == json.loads(quotas)
        hits[quotas] = report["figures"]["hit_tokens"]
    # one cached page at most: only the first block is ever hit again (3 requests share it)
    assert hits['{"(none)": {"device_pages": 1}}'] == hits['{"*": {"device_pages": 1}}'] == 3 * B
    assert hits['{"someone": {"device_pages": 1}}'] == 2560  # as without quotas
    assert main(["replay", str(trace), "--quotas", '{"*": {"host_floor": "2"}}']) == 2
    assert "argument --quotas: quotas['*']: TenantQuota.host_floor must be a non-negative int" \
        in capsys.readouterr().err

"""The offload demo: a small run end to end, the store it leaves and reuses,
seed determinism, the event endpoint and the HiCache / vLLM option names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radixcache.cli import main
from tests.radixcache.cli.clikit import SMALL_DEMO


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["demo", *argv]) == 0
    return capsys.readouterr().out


def figures(out: str) -> list[str]:
    """The run's counted figures: hit shares per turn, the tier table, the
    prefill avoided, what came back after the restart (no times, no rates)."""
    keep = []
    for line in out.splitlines():
        if "turn " in line and "requests" in line:
            keep.append(re.sub(r"requests\s+[\d.]+ s", "requests", line))
        elif line.startswith(("│ device ", "│ host ", "│ LMDB ")) or "prefill avoided" in line:
            keep.append(line)
        elif line.startswith("after a restart"):
            keep.append(re.sub(r"replayed in [\d.]+ s", "", line))
    return keep


def test_demo_small_run_reports_every_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = demo(capsys, *SMALL_DEMO, "--turns", "3", "--storage-path", str(tmp_path / "lmdb"),
               "--events", "none")
    assert "turn 3/3" in out and "summary (18 requests" in out
    assert "none wrong" in out and "0 corrupt" in out
    for direction in ("device_to_host", "host_to_device", "host_to_storage", "storage_to_host"):
        assert direction in out
    restart = out.split("after a restart")[1]
    assert "came back from LMDB" in restart and " 0 prompt tokens came back" not in restart
    assert "found" not in out.split("workload")[0]  # a new store: nothing to reuse
    size = re.search(r"LMDB store .*: ([\d.]+) MiB on disk, (\d+) pages", out)
    assert size is not None and float(size.group(1)) > 0 and int(size.group(2)) > 0


def test_a_second_run_says_it_reuses_the_store_and_fresh_empties_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "lmdb"
    args = [*SMALL_DEMO, "--storage-path", str(store), "--events", "none"]
    first = demo(capsys, *args)
    kept = re.search(r"LMDB store .*, (\d+) pages; the next run reuses it", first)
    assert kept is not None
    second = demo(capsys, *args)
    assert (f"found {kept.group(1)} pages from an earlier run in {store}; --fresh starts empty"
            in second)
    assert figures(second) != figures(first)  # the reused pages are hits from the start
    fresh = demo(capsys, *args, "--fresh")
    assert "from an earlier run" not in fresh
    assert figures(fresh) == figures(first)


def test_same_seed_same_figures_other_seed_other_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = {}
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        out = demo(capsys, *SMALL_DEMO, "--turns", "3", "--seed", seed, "--events", "none",
                   "--storage-path", str(tmp_path / name))
        runs[name] = figures(out)
    assert len(runs["a"]) == 3 + 3 + 1 + 1  # turns, tiers, prefill avoided, restart
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_events_line_names_the_bound_endpoints(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = demo(capsys, *SMALL_DEMO, "--storage-path", str(tmp_path / "s"))
    assert re.search(r"^events: publishing on tcp://127\.0\.0\.1:\d+, "
                     r"replay on tcp://127\.0\.0\.1:\d+$", out, re.M), out
    assert re.search(r"events: [1-9]\d* batches published, 0 dropped", out)


def test_kv_events_config_takes_vllm_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": '
              '"tcp://127.0.0.1:*", "replay_endpoint": null, "topic": "kv", "buffer_steps": 64, '
              '"hwm": 1000, "max_queue_size": 32}')
    out = demo(capsys, *SMALL_DEMO, "--storage-path", str(tmp_path / "s"),
               "--kv-events-config", config)
    assert re.search(r"^events: publishing on tcp://127\.0\.0\.1:\d+, no replay$", out, re.M)
    off = demo(capsys, *SMALL_DEMO, "--storage-path", str(tmp_path / "t"),
               "--kv-events-config", '{"endpoint": "tcp://127.0.0.1:*"}')
    assert "events: off" in off  # vLLM's default: enable_kv_cache_events is false


def test_hicache_host_pool_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = [a for a in SMALL_DEMO if a not in ("--host-pages", "48")]
    out = demo(capsys, *base, "--hicache-ratio", "1.5", "--storage-path", str(tmp_path / "a"),
               "--events", "none")
    assert "host 48 pages" in out  # 1.5 x 32 device pages
    page_bytes = 2 * 2 * 1 * 8 * 2 * 16  # layers, K+V, heads, head dim, fp16, page size
    out = demo(capsys, *base, "--hicache-size", f"{100 * page_bytes / 1e9}",
               "--hicache-write-policy", "write_back", "--hicache-storage-prefetch-policy",
               "best_effort", "--storage-path", str(tmp_path / "b"), "--events", "none")
    assert "host 100 pages" in out
    assert "write policy write_back, prefetch best_effort" in out


def test_quotas_bound_the_demos_tenants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = demo(capsys, *SMALL_DEMO, "--events", "none", "--storage-path", str(tmp_path / "s"),
               "--quotas", '{"tenant-0": {"device_pages": 8}, "*": {"device_floor": 4}}')
    lines = dict(re.findall(r"^    (tenant-\d): (.*)$", out, re.M))
    assert set(lines) == {"tenant-0", "tenant-1"}
    assert re.search(r"; ([0-8]) device pages, \d+ evicted for its limit; quota device_pages=8$",
                     lines["tenant-0"]), lines
    assert lines["tenant-1"].endswith("quota device_floor=4"), lines
    assert "none wrong" in out
    plain = demo(capsys, *SMALL_DEMO, "--events", "none", "--storage-path", str(tmp_path / "t"))
    assert "tenants (with quotas)" not in plain

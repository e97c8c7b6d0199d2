"""The offload demo runs end to end on a small configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.cli import main


def test_demo_small_run_reports_every_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "demo", "--device", "cpu", "--storage-path", str(tmp_path / "lmdb"), "--events", "none",
        "--tenants", "2", "--chats", "3", "--turns", "3", "--system", "256", "--user", "64",
        "--decode", "4", "--device-pages", "48", "--host-pages", "64", "--layers", "2",
        "--kv-heads", "1", "--head-dim", "8", "--restart-requests", "3",
    ])
    assert code == 0
    out = capsys.readouterr().out
    assert "turn 3/3" in out and "summary (18 requests" in out
    assert "none wrong" in out and "0 corrupt" in out
    for direction in ("device_to_host", "host_to_device", "host_to_storage", "storage_to_host"):
        assert direction in out
    restart = out.split("after a restart")[1]
    assert "came back from LMDB" in restart and " 0 prompt tokens came back" not in restart

"""The copy benchmark runs end to end on a tiny spec and reports every figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

# Loaded from its file, so this test needs transfer/ only, not the radixcache package.
_PATH = Path(__file__).resolve().parents[2] / "radixcache" / "cli" / "bench" / "copy.py"


def main(argv: list[str]) -> Any:
    spec = importlib.util.spec_from_file_location("transfer_copy_bench", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def test_copy_benchmark_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--pages", "6", "--repeat", "2"]
    assert main([*argv, "--no-cuda"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pages_per_copy"] == 6
    assert result["bytes_per_copy"] == 6 * result["page_bytes"] == 6 * 2 * 2 * 16 * 2 * 64 * 2
    cpu = result["cpu"]
    for name in ("memcpy", "device_to_host", "host_to_device", "worst_device_to_host"):
        assert cpu[f"{name}_gbps"] > 0
    assert cpu["device_to_host_ratio"] > 0 and cpu["target_ratio"] == 0.5
    assert result["cuda"] is None


def test_copy_benchmark_refuses_more_pages_than_the_pools(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--pages", "8", "--host-pages", "4", "--layers", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--pages must be in [1, 4]" in err and len(err.splitlines()) == 1

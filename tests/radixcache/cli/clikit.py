"""Running ``python -m radixcache`` as a user would, and what a user mistake
must look like: one line ``radixcache <cmd>: error: ...`` and exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "examples" / "data" / "mooncake_synthetic_trace.jsonl"

# A demo small enough to take a few seconds (sizes only; policies at defaults).
SMALL_DEMO = [
    "--device", "cpu", "--tenants", "2", "--chats", "3", "--turns", "2", "--system", "128",
    "--user", "32", "--decode", "2", "--device-pages", "32", "--host-pages", "48",
    "--layers", "2", "--kv-heads", "1", "--head-dim", "8", "--restart-requests", "2",
    "--storage-mib", "16",
]


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m radixcache ARGS`` from the repository root."""
    return subprocess.run([sys.executable, "-m", "radixcache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], command: str,
                          fragment: str) -> str:
    """Exit status 2 and exactly one stderr line naming the command and ``fragment``."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"radixcache {command}: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    return lines[0]

"""examples/router.py end to end: two engine processes, one router."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_router_example_routes_by_tier_aware_overlap() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "router.py")],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    lines = {line[:44].strip(): line for line in out.splitlines() if "->" in line}
    host_hit = lines["legal doc 1 + question (on legal's host)"].split()
    assert host_hit[-1] == "legal"
    # legal holds the system prompt (16 blocks) on GPU and the document on host
    assert "16   48" in lines["legal doc 1 + question (on legal's host)"]
    assert lines["code file 2 + question (on code's GPU)"].split()[-1] == "code"
    assert lines["legal doc 5 + question (on legal's GPU)"].split()[-1] == "legal"
    # Two salted tenants share the legal system prompt: each is routed to the
    # engine holding its own copy; the other tenant's identical blocks do not count.
    acme = lines["tenant acme: legal prompt + its document"]
    assert acme.split()[-1] == "code" and " legal     0    0    0 " in acme
    globex = lines["tenant globex: legal prompt + new question"]
    assert globex.split()[-1] == "legal" and " legal    16   16   16 " in globex
    assert "unrepaired=0" in out and "malformed=0" in out

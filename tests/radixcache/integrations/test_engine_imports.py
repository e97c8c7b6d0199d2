"""``import radixcache`` (and the engine-free page store) never imports vLLM or SGLang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
import sys
import radixcache, radixcache.offload, radixcache.integrations, radixcache.integrations.pagestore
import radixcache.cli
engines = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "sglang"))
print(engines)
"""


def test_radixcache_imports_no_engine() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout

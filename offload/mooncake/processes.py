"""Running a pool: a ``mooncake_master`` and the holder processes that give it memory.

    MasterProcess     the master from the wheel, with its built-in HTTP
                      metadata server, on three ports (RPC, metadata,
                      metrics/admin; picked free on loopback unless given)
    HolderProcess     ``python -m radixcache.offload.mooncake.holder``: a
                      client that contributes a memory segment and nothing
                      else, and unmounts it when it is stopped (SIGTERM)
    scratch_pool()    both, for demos and benchmarks; stopped at the end

The master is the binary inside the ``mooncake-transfer-engine-non-cuda``
wheel (``mooncake/mooncake_master``; the ``mooncake_master`` console script
only execs it). It is ready once its ``/health`` says ``service_ready`` and
its RPC port accepts (about 1 s after start; the metadata port accepts
earlier). Children are started in their own session and, on Linux, die with
the process that started them (no orphaned master after a crash).

The master keeps its index in memory: stopping it loses every page (the
holders' memory stays mounted; clients reconnect to a master restarted on
the same ports by themselves).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from radixcache.offload.mooncake.storage import master_health, master_metrics


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (bound to 0, then released: a small race)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def master_binary() -> str:
    """The ``mooncake_master`` executable inside the installed wheel."""
    import mooncake

    path = Path(mooncake.__file__).parent / "mooncake_master"
    if not path.is_file():
        raise FileNotFoundError(f"no mooncake_master in {path.parent} (pip install mooncake-transfer-engine-non-cuda)")
    return str(path)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec_fn: the child gets SIGKILL when its parent dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class MasterProcess:
    """A ``mooncake_master`` subprocess (see the module docstring)."""

    def __init__(
        self,
        *,
        ports: tuple[int, int, int] | None = None,
        lease_ttl_ms: int = 10_000,
        client_ttl_s: int = 10,
        extra_args: tuple[str, ...] = (),
        log_path: str | None = None,
    ) -> None:
        """``ports``: (RPC, metadata, metrics), free loopback ports if None.
        ``lease_ttl_ms``: how long a read or existence check leases an object
        (longer than the slowest batch read). ``client_ttl_s``: how long a
        client without heartbeat (a killed holder) keeps its segment mounted."""
        self.rpc_port, self.http_port, self.metrics_port = ports or free_ports(3)
        self.lease_ttl_ms = lease_ttl_ms
        self.client_ttl_s = client_ttl_s
        self.extra_args = extra_args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def url(self) -> str:
        """The pool URL engines are given (``mooncake://...``)."""
        return f"mooncake://127.0.0.1:{self.rpc_port}?metadata={self.metadata_url}&metrics={self.metrics_url}"

    def argv(self) -> list[str]:
        return [
            master_binary(),
            f"--rpc_port={self.rpc_port}",
            "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http_port}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={self.metrics_port}",  # 9003 by default: two masters would collide
            f"--default_kv_lease_ttl={self.lease_ttl_ms}",
            f"--client_ttl={self.client_ttl_s}",
            "--enable_metric_reporting=false",
            "--rpc_thread_num=2",
            "--minloglevel=1",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 20.0) -> MasterProcess:
        """Start it (on the same ports as before, after a stop) and wait until it serves."""
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}: {' '.join(self.argv())}")
            try:
                ready = master_health(self.metrics_url, 0.2).get("service_ready") is True
            except OSError:
                ready = False
            if ready:
                with socket.socket() as s:
                    s.settimeout(0.2)
                    if s.connect_ex(("127.0.0.1", self.rpc_port)) == 0:
                        return
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"mooncake_master not ready in {timeout_s} s")

    def capacity(self) -> int:
        """Bytes of memory the mounted segments give the pool (0 if unknown)."""
        try:
            return int(master_metrics(self.metrics_url).get("master_total_capacity_bytes", 0))
        except OSError:
            return 0

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        """Stop it (SIGTERM takes about a second; ``kill`` is immediate)."""
        _stop(self.proc, sig, timeout_s)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


class HolderProcess:
    """A process holding ``segment_mib`` MiB of the pool's memory (see the module docstring)."""

    def __init__(self, url: str, segment_mib: int) -> None:
        self.url = url
        self.segment_mib = segment_mib
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> HolderProcess:
        """Start it and wait until its segment is mounted (it prints "ready")."""
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # this checkout, for the child's import
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixcache.offload.mooncake.holder", self.url,
             "--segment-mib", str(self.segment_mib)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        while time.monotonic() < deadline and not line.startswith(b"ready"):
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"the pool holder exited with {self.proc.returncode}")
        if not line.startswith(b"ready"):
            self.kill()
            raise TimeoutError(f"the pool holder did not mount its segment in {timeout_s} s")
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM: it unmounts its segment (its pages leave the pool) and exits."""
        _stop(self.proc, signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL: its segment stays mounted, unreadable, until the master's client_ttl."""
        _stop(self.proc, signal.SIGKILL, 10.0)


def _stop(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextmanager
def scratch_pool(segment_mib: int = 1024, **master_options: object) -> Iterator[MasterProcess]:
    """A master and one holder of ``segment_mib`` MiB on free loopback ports,
    stopped at the end; yields the master (its ``url`` is the pool's)."""
    master = MasterProcess(**master_options).start()  # type: ignore[arg-type]
    holder = None
    try:
        holder = HolderProcess(master.url, segment_mib).start()
        yield master
    finally:
        if holder is not None:
            holder.kill()
        master.kill()

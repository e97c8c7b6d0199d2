"""DaemonPool: the worker threads of storage reads and pool sends."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from radixcache.transfer.workers import DaemonPool

ROOT = Path(__file__).resolve().parents[2]


def test_calls_run_and_their_results_and_errors_come_back() -> None:
    pool = DaemonPool(2, "t-pool")
    assert all(t.daemon and t.is_alive() for t in pool._threads)
    assert [t.name for t in pool._threads] == ["t-pool_0", "t-pool_1"]
    futures = [pool.submit(lambda x: x * x, i) for i in range(20)]
    assert [f.result(10) for f in futures] == [i * i for i in range(20)]

    def boom() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        pool.submit(boom).result(10)
    pool.shutdown()
    assert not any(t.is_alive() for t in pool._threads)


def test_shutdown_lets_submitted_work_finish_then_refuses_more() -> None:
    pool = DaemonPool(1, "t-pool")
    gate = threading.Event()
    done: list[int] = []
    pool.submit(gate.wait, 10)
    for i in range(5):
        pool.submit(done.append, i)
    closer = threading.Thread(target=pool.shutdown)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive() and done == []  # waits for the work in the queue
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(done.append, 99)
    gate.set()
    closer.join(10)
    assert not closer.is_alive() and done == [0, 1, 2, 3, 4]
    pool.shutdown()  # again: nothing to do


def test_a_worker_may_shut_its_own_pool_down() -> None:
    pool = DaemonPool(2, "t-pool")
    pool.submit(pool.shutdown).result(10)
    for t in pool._threads:
        t.join(10)
        assert not t.is_alive()


def test_bad_sizes_are_refused() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            DaemonPool(bad, "x")  # type: ignore[arg-type]


def test_a_store_left_open_does_not_hold_the_process_at_exit(tmp_path: Path) -> None:
    """A process that opens an LMDB store, reads through it and never closes
    it (an interrupt before its close, say) exits at once: its reader threads
    are daemon threads, and exit waits for none of them. (An executor's
    worker that an interrupt cut off from the executor's bookkeeping hung
    the demo at exit: nothing ever woke it.)"""
    pool = DaemonPool(1, "t-pool")  # and one left open in this process
    assert pool.submit(int, "7").result(10) == 7
    code = f"""
import numpy as np, torch
from radixcache.offload import LmdbStorage, ModelFingerprint, StorageConfig
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec
spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.float16, page_size=4)
host = HostKVBuffer(spec, 4)
store = LmdbStorage(StorageConfig(path={str(tmp_path / "s")!r}, capacity_bytes=1 << 20),
                    spec, ModelFingerprint("m", spec.describe(), 0))
ticket = store.get([b"k" * 16], None, host, np.array([0], dtype=np.int32))
ticket.wait(10)
print("read done")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "read done" in proc.stdout, proc.stderr[-2000:]

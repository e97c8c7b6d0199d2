"""DaemonPool: the worker threads of storage reads and pool sends."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from radixcache.transfer.workers import DaemonPool, HelpingTicket

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


def _held_pool() -> tuple[DaemonPool, threading.Event]:
    """A one-worker pool whose worker is held mid-call until the event is set."""
    pool = DaemonPool(1, "t-pool")
    gate, entered = threading.Event(), threading.Event()
    pool.submit(lambda: (entered.set(), gate.wait(10)))
    assert entered.wait(10)
    return pool, gate


def test_run_queued_runs_the_oldest_waiting_call_on_the_calling_thread() -> None:
    pool, gate = _held_pool()
    ran: list[tuple[str, int]] = []
    first = pool.submit(lambda: ran.append(("first", threading.get_ident())) or 1)
    second = pool.submit(lambda: ran.append(("second", threading.get_ident())) or 2)
    assert pool.run_queued()
    assert ran == [("first", threading.get_ident())] and first.result(0) == 1
    assert not second.done()  # one call a time, oldest first
    assert pool.run_queued() and second.result(0) == 2
    assert not pool.run_queued()  # nothing queued: nothing run, no wait
    gate.set()
    pool.shutdown()
    assert not pool.run_queued()  # after shutdown the marker stays for the workers
    assert not any(t.is_alive() for t in pool._threads)


def test_run_queued_hands_errors_to_the_future_and_raises_interrupts() -> None:
    pool, gate = _held_pool()

    def boom() -> None:
        raise KeyError("nope")

    def interrupt() -> None:
        raise KeyboardInterrupt

    failed, stopped = pool.submit(boom), pool.submit(interrupt)
    assert pool.run_queued()  # an error stays in its future
    with pytest.raises(KeyError, match="nope"):
        failed.result(0)
    with pytest.raises(KeyboardInterrupt):  # an interrupt is the calling thread's
        pool.run_queued()
    assert isinstance(stopped.exception(0), KeyboardInterrupt)
    gate.set()
    pool.shutdown()


def test_a_helping_ticket_waits_by_running_queued_calls_itself() -> None:
    pool, gate = _held_pool()  # the only worker is busy: without help, nothing would run
    tickets = [HelpingTicket(pool) for _ in range(3)]
    threads: list[int] = []

    def work(i: int) -> None:
        threads.append(threading.get_ident())
        tickets[i].finish(i)

    for i in range(3):
        pool.submit(work, i)
    assert not tickets[1].wait(0.05)  # a wait with a timeout only waits
    assert tickets[1].wait()  # runs the queue up to its own call, on this thread
    assert threads == [threading.get_ident()] * 2
    assert tickets[0].result() == 0 and tickets[1].result() == 1 and not tickets[2].done()
    gate.set()
    assert tickets[2].wait()  # the worker may take it meanwhile: either way it ends
    assert tickets[2].result() == 2
    pool.shutdown()


def test_a_helping_ticket_waits_for_its_call_a_worker_already_runs() -> None:
    pool = DaemonPool(1, "t-pool")
    ticket = HelpingTicket(pool)
    entered, gate = threading.Event(), threading.Event()

    def work() -> None:
        entered.set()
        gate.wait(10)
        ticket.finish("done")

    pool.submit(work)
    assert entered.wait(10)  # the worker has it: nothing is queued
    threading.Timer(0.05, gate.set).start()
    assert ticket.wait() and ticket.result() == "done"
    pool.shutdown()

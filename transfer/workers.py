"""``DaemonPool``: a fixed set of daemon worker threads that run submitted
calls, first submitted first started.

The storage readers and the pool's senders use it where a
``concurrent.futures.ThreadPoolExecutor`` would do, for one reason: an
executor's threads are not daemon threads, and the interpreter waits for
them at exit. An executor starts its threads lazily, inside ``submit``; a
KeyboardInterrupt that lands between a thread's start and the executor's
bookkeeping (or a caller that never closes the store) leaves a worker
blocked on its queue that nothing will wake, and the process hangs at exit.
Here every thread starts in the constructor and is a daemon: at exit it
simply stops with the process (every store is crash-safe; a write in flight
is lost, as with any crash). ``shutdown`` is the orderly way out, as before.

``run_queued`` lets a thread that waits for the pool's work do some of it
(``HelpingTicket``: what the LMDB store's reads return).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from radixcache.transfer.ticket import FutureTicket

_T = TypeVar("_T")


class DaemonPool:
    """``workers`` daemon threads named ``{name}_{i}`` running submitted calls."""

    def __init__(self, workers: int, name: str) -> None:
        if type(workers) is not int or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders submit against shutdown
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., _T], /, *args: Any) -> Future[_T]:
        """Run ``fn(*args)`` on a worker; its Future. RuntimeError after ``shutdown``."""
        future: Future[_T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._queue.put((future, fn, args))
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new work; the calls already submitted still run. With
        ``wait``, return once every worker has finished them (a worker
        calling this does not wait for itself). Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)  # each worker passes it on before it leaves
        if wait:
            me = threading.current_thread()
            for thread in self._threads:
                if thread is not me:
                    thread.join()

    def run_queued(self) -> bool:
        """Run the oldest call not started yet on the calling thread, as a
        worker would; False when none is queued (or the pool is shutting
        down). A KeyboardInterrupt (or SystemExit) the call raises here is
        handed to its future and raised again: it belongs to the calling
        thread."""
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return False
        if item is None:
            self._queue.put(None)  # shutdown's marker stays for the workers
            return False
        interrupt = _call(item)
        if interrupt is not None:
            raise interrupt
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # wake the next worker too
                return
            _call(item)
            del item  # (no reference kept while idle)


def _call(item: tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]) -> BaseException | None:
    """Run one submitted call into its future; the interrupt it raised (a
    ``BaseException`` that is no ``Exception``), else None."""
    future, fn, args = item
    if not future.set_running_or_notify_cancel():
        return None
    try:
        result = fn(*args)
    except Exception as exc:  # the caller sees it through the future
        future.set_exception(exc)
    except BaseException as exc:  # (KeyboardInterrupt, SystemExit)
        future.set_exception(exc)
        return exc
    else:
        future.set_result(result)
    return None


class HelpingTicket(FutureTicket):
    """A ticket for a call queued on a ``DaemonPool`` whose ``wait()``
    without a timeout puts the waiting thread to work: until the ticket is
    done, it runs the pool's queued calls (its own or older ones) itself,
    then waits for whatever a worker still runs. A thread that would block
    anyway starts at once, instead of after a worker wakes up (a sleeping
    worker on a vCPU the host descheduled can take a while), and adds
    itself to the pool for that wait. ``wait(timeout)`` only waits: a call
    it ran could outlast the timeout."""

    __slots__ = ("_pool",)

    def __init__(self, pool: DaemonPool) -> None:
        super().__init__()
        self._pool = pool

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            run = self._pool.run_queued
            while not self._event.is_set() and run():
                pass
        return self._event.wait(timeout)

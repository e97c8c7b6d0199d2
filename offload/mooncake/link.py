"""The connection to the pool: one Mooncake client, its health, and the calls that crash.

    MooncakeLink(config)
      connect thread: MooncakeDistributedStore().setup(...) until it succeeds
                      (a dead master costs ~4.5 s per try), then "ready"
      run(fn)         fn(store) on a ready client; raises PoolUnavailable while
                      connecting, after close, or within retry_after_s of a
                      call that found the master unreachable (RPC_FAIL)
      register(arr)   registers a host buffer once (zero-copy transfers)
      close()         unregisters the buffers and closes the client, once

The Mooncake client segfaults the process on any call made before a
successful ``setup`` or after ``close``, so nothing reaches the client
object except through ``run``, which checks both under a lock; ``close``
runs only after the storage's reader and writer threads have stopped (the
shared base closes them first), so no call is in flight when it runs.

Health: a master that is down answers ``batch_is_exist`` in under a
millisecond with RPC_FAIL, but gets, puts and removes only after ~4.3 s
each. After any RPC_FAIL the link answers "unavailable" at once for
``retry_after_s``; the first call after that probes with ``batch_is_exist``
before it lets a slow call through. A master restarted on the same address is
used again without any action here: the client reconnects by itself.

The client reads its settings from the environment when ``setup`` runs
(``MC_TCP_BIND_ADDRESS``, ``MC_LOG_LEVEL``, ``MC_STORE_CLIENT_SETUP_RETRIES``):
the first link of a process sets those it finds unset, and they hold for
the whole process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from radixcache.offload.mooncake.config import MooncakeConfig
from radixcache.offload.storage import StorageUnavailable

log = logging.getLogger(__name__)

# Mooncake's ErrorCode values (mooncake-store/include/types.h) that this backend acts on
OK = 0
NO_AVAILABLE_HANDLE = -200  # no segment space (pool full, or no holder mounted)
INVALID_PARAMS = -600  # e.g. a destination of another size than the object
OBJECT_NOT_FOUND = -704  # absent: never stored, evicted, removed, or its segment left
OBJECT_HAS_LEASE = -706  # a remove without force within a read lease
LEASE_EXPIRED = -707  # the lease ran out before the read finished: the bytes are not trusted
TRANSFER_FAIL = -800  # the transfer failed (e.g. a dead holder still mounted; a size mismatch)
RPC_FAIL = -900  # the master cannot be reached

T = TypeVar("T")
# Read by the client library when it is loaded (a later setting has no effect):
# errors only, unless the process says otherwise.
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
_PROBE_KEY = "radixcache-health-probe"


class PoolUnavailable(StorageUnavailable):
    """The pool cannot be used now (connecting, closed, or its master unreachable)."""


class MooncakeLink:
    """One Mooncake client shared by a storage's threads (see the module docstring)."""

    def __init__(self, config: MooncakeConfig) -> None:
        self.config = config
        self._lock = threading.Lock()  # guards the state below
        self._store: Any = None  # the client once setup succeeded
        self._closed = False
        self._down_until = 0.0  # monotonic time before which calls answer "unavailable"
        self._registered: dict[tuple[int, int], npt.NDArray[np.uint8]] = {}  # kept alive
        self._ready = threading.Event()
        self.connects = 0  # successful setups
        self.failed_setups = 0  # setups that failed (master down or unreachable)
        self.last_error = ""  # why the last setup failed
        config.configure_client_environment()
        self._thread = threading.Thread(target=self._connect, name="radixcache-mooncake-connect", daemon=True)
        self._thread.start()
        self._ready.wait(config.connect_timeout_s)

    # -- calls ---------------------------------------------------------------------------
    def available(self) -> bool:
        """Whether calls are let through now (connected, not in a down window)."""
        with self._lock:
            return self._store is not None and not self._closed and time.monotonic() >= self._down_until

    def run(self, fn: Callable[[Any], T]) -> T:
        """``fn(client)`` on the ready client; PoolUnavailable when there is none usable."""
        store = self._usable()
        return fn(store)

    def mark_down(self, why: str) -> None:
        """A call found the master unreachable: answer "unavailable" for a while."""
        with self._lock:
            first = time.monotonic() >= self._down_until
            self._down_until = time.monotonic() + self.config.retry_after_s
        if first:
            log.warning("pool %s unavailable (%s); calls are misses for %.1f s",
                        self.config.describe(), why, self.config.retry_after_s)

    def register(self, array: npt.NDArray[np.uint8]) -> None:
        """Register ``array``'s memory with the client once (zero-copy source and
        destination); a no-op before the client is connected (it registers on a
        later call). Keeps a reference, so the memory outlives its registration."""
        key = (array.ctypes.data, array.nbytes)
        with self._lock:
            store = self._store
            if store is None or self._closed or key in self._registered:
                return
            rc = store.register_buffer(key[0], key[1])
            if rc != OK:  # TCP works without it; RDMA would not
                log.warning("pool %s: register_buffer of %d B failed (%d)", self.config.describe(), key[1], rc)
            self._registered[key] = array

    def close(self) -> None:
        """Close the client (idempotent). No call may be in flight."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            store, self._store = self._store, None
            registered, self._registered = self._registered, {}
        if store is None:
            return  # a setup still running closes its client itself (see _connect)
        for ptr, _size in registered:
            store.unregister_buffer(ptr)
        store.close()

    # -- internals -------------------------------------------------------------------------
    def _usable(self) -> Any:
        with self._lock:
            store = self._store
            if store is None or self._closed:
                raise PoolUnavailable(f"pool {self.config.describe()} is not connected")
            if time.monotonic() < self._down_until:
                raise PoolUnavailable(f"pool {self.config.describe()} is down")
            probe = self._down_until > 0.0
        if probe:  # the first call after a down window: a fast check before slow calls
            if store.batch_is_exist([_PROBE_KEY])[0] == RPC_FAIL:
                self.mark_down("the master does not answer")
                raise PoolUnavailable(f"pool {self.config.describe()} is down")
            with self._lock:
                self._down_until = 0.0
        return store

    def _connect(self) -> None:
        from mooncake.store import MooncakeDistributedStore

        config = self.config
        settings = config.client_settings()
        while True:
            with self._lock:
                if self._closed:
                    return
            store = MooncakeDistributedStore()
            rc = store.setup(settings)
            with self._lock:
                if rc == OK and not self._closed:
                    self._store = store
                    self.connects += 1
                    self._ready.set()
                    return
                closed = self._closed
            if rc == OK:  # closed while it set up: nobody else will close it
                store.close()
                return
            if closed:
                return
            self.failed_setups += 1
            self.last_error = f"setup returned {rc}"
            if self.failed_setups == 1:
                log.warning("pool %s: client setup failed (%d); retrying every %.1f s",
                            config.describe(), rc, config.retry_after_s)
            self._ready.set()  # opening stops waiting: calls are misses until it connects
            time.sleep(config.retry_after_s)

"""Which stored pages left the pool: keyspace notifications, where the server sends them.

Two sources, one at a time, both filed into the shared ``HeldRemovalLog``
(offload/storage/removals.py), which keeps the storage contract's order:

* **Keyspace notifications** (where the server sends them: its
  ``notify-keyspace-events`` holds ``E`` plus ``g`` (del), ``x`` (expired) and
  ``e`` (evicted), e.g. ``Egxe``): a thread per primary node subscribes to
  ``__keyevent@<db>__:{del,expired,evicted}`` and reports every removal of a
  key of this fingerprint, whoever removed it (another engine's
  ``forget_namespace``, the server's LRU, a TTL, an operator's DEL).
* **Only our own removals** otherwise (``delete``, ``forget_namespace``,
  corrupt records): evictions and expiries by the server are then unknown to
  the engine; it finds out at the next read (a short read is a miss).

A key is handed over by ``take_removed`` only after every put ticket that
stored it finished, and only if this process stored it (a put that wrote it
or found it there).
"""

from __future__ import annotations

import logging
import threading

import redis

from radixcache.offload.storage import RemovalLog

log = logging.getLogger(__name__)

REMOVAL_EVENTS = ("del", "expired", "evicted")
_NEEDED_FLAGS = {"g": "del", "x": "expired", "e": "evicted"}


def notifications_cover_removals(flags: str) -> bool:
    """Whether a ``notify-keyspace-events`` value sends every removal we need."""
    flags = flags.replace("A", "g$lshzxet")  # "A" is the alias for all classes
    return "E" in flags and all(flag in flags for flag in _NEEDED_FLAGS)


class KeyspaceObserver:
    """Subscribes to removal events on every node; feeds a ``RemovalLog``.

    ``prefix`` is the key prefix of this fingerprint's records; events of
    other keys are ignored. One daemon thread per node; ``close`` stops them.
    A lost subscription is re-established; removals in the gap are unknown.
    """

    def __init__(
        self, clients: list[redis.Redis], db: int, prefix: bytes, log_: RemovalLog
    ) -> None:
        self._prefix = prefix
        self._log = log_
        self._stop = threading.Event()
        self._channels = [f"__keyevent@{db}__:{event}" for event in REMOVAL_EVENTS]
        self._threads: list[threading.Thread] = []
        ready = []
        for client in clients:
            event = threading.Event()  # set once subscribed (or the first try failed)
            ready.append(event)
            thread = threading.Thread(
                target=self._listen, args=(client, event), name="radixcache-pool-events", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        for event in ready:  # subscribed before the first put, where the nodes are up
            event.wait(timeout=3.0)

    def _listen(self, client: redis.Redis, ready: threading.Event) -> None:
        while not self._stop.is_set():
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(*self._channels)
                confirmed = 0
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        confirmed += 1
                        if confirmed == len(self._channels):
                            ready.set()
                    elif message["type"] == "message":
                        key = message["data"]
                        if isinstance(key, bytes) and key.startswith(self._prefix):
                            self._log.removed([key[len(self._prefix) :]])
            except (redis.exceptions.RedisError, OSError):
                ready.set()  # do not hold up the opening of the store
                self._stop.wait(0.5)  # the node is down: try again shortly
            finally:
                try:
                    pubsub.close()
                except Exception:  # a broken connection may fail to close
                    pass
        client.close()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5.0)

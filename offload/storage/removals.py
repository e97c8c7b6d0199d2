"""Removal accounting: which stored pages left the store, in an order the owner can publish.

The contract (``contract.py``) promises that a key appears in
``take_removed()`` only after every put ticket that stored it has finished,
so that the owner publishes a page's store before its removal. Two logs keep
that promise, by where a backend learns of its removals:

* ``RemovalLog``: the backend's writer removes records itself, on the same
  thread that finishes the put tickets, and files the removals after the
  tickets of the same step (LMDB: eviction, corruption, ``delete``,
  ``forget_namespace``, one transaction at a time). Removals are handed
  over in the order they were filed.
* ``HeldRemovalLog``: removals also arrive from elsewhere and at any time
  (a shared pool's keyspace notifications: another engine's forget, the
  server's LRU, a TTL). It holds a removal back while a put of that key is
  in flight, and reports only keys this process stored (a put that wrote
  them or found them there), so a removal never overtakes its store and
  never names a page this engine never announced.

Both also collect the page keys this process wrote (``note_written``) for a
shared store's ``take_written``. Every method is thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable


class RemovalLog:
    """Removed page keys, handed over in the order they were filed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._removed: list[bytes] = []  # ready to hand over
        self._written: list[bytes] = []  # page keys this process wrote, not yet taken

    def removed(self, keys: Iterable[bytes]) -> None:
        """Report page keys removed from the store (after the tickets that stored them)."""
        with self._lock:
            self._removed.extend(keys)

    def note_written(self, written: Iterable[bytes]) -> None:
        """A put is about to finish: this process wrote ``written`` (the other
        keys it stored were there already)."""
        with self._lock:
            self._written.extend(written)

    def take(self) -> list[bytes]:
        """Removed page keys since the last call; hands the list over."""
        with self._lock:
            out, self._removed = self._removed, []
        return out

    def take_written(self) -> list[bytes]:
        """Page keys written since the last call; hands the list over."""
        with self._lock:
            out, self._written = self._written, []
        return out


class HeldRemovalLog(RemovalLog):
    """Removed page keys of this process, held back while a put of them runs.

    The writer calls ``begin_put`` when it accepts a put and ``end_put`` when
    its ticket finished; any thread may report ``removed`` keys, of this
    process or not.
    """

    def __init__(self) -> None:
        super().__init__()
        self._known: set[bytes] = set()  # page keys this process stored
        self._inflight: Counter[bytes] = Counter()  # page keys of unfinished puts
        self._held: list[bytes] = []  # removals of keys with a put in flight

    def begin_put(self, keys: Iterable[bytes]) -> None:
        """A put of ``keys`` was accepted: their removals wait for its end."""
        with self._lock:
            self._inflight.update(keys)

    def end_put(self, keys: Iterable[bytes], stored: Iterable[bytes]) -> None:
        """A put ticket finished: ``stored`` (a prefix of ``keys``) are in the store."""
        with self._lock:
            self._known.update(stored)
            self._inflight.subtract(keys)
            self._inflight += Counter()  # drops the zero counts
            if self._held:
                held, self._held = self._held, []
                for key in held:
                    self._file(key)

    def removed(self, keys: Iterable[bytes]) -> None:
        """Report page keys removed from the store (any of them may be foreign)."""
        with self._lock:
            for key in keys:
                self._file(key)

    def _file(self, key: bytes) -> None:
        if key in self._inflight:
            self._held.append(key)
        elif key in self._known:
            self._known.discard(key)
            self._removed.append(key)

"""The in-memory index of an LMDB store: which records exist, their sizes, and
their recency (least recently used first).

Recency is kept in memory only: an ordered dict from record key to value
size, where a put appends and a verified read moves the record to the end.
At open it is rebuilt from the write sequence number in each record header,
so after a restart records are ordered by when they were written, and the
reads of earlier runs are forgotten. This costs no LMDB write per read (a
read-path write would serialize every hit behind the single LMDB writer).

Threads: ``apply`` and ``oldest`` run on the writer thread, ``touch`` on
reader threads, all under one lock; ``__contains__`` is one dict lookup,
atomic under the GIL, and takes no lock, so the owner thread's
``longest_prefix`` never waits on I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping


class RecencyIndex:
    """Record keys -> value sizes, oldest (least recently used) first."""

    __slots__ = ("_lock", "_nbytes", "_order")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _order's order and _nbytes
        self._order: OrderedDict[bytes, int] = OrderedDict()  # key -> value bytes
        self._nbytes = 0  # sum of the values in _order

    def __contains__(self, rkey: object) -> bool:
        return rkey in self._order

    def __len__(self) -> int:
        return len(self._order)

    def keys(self) -> list[bytes]:
        """Every record key, oldest first (a snapshot)."""
        with self._lock:
            return list(self._order)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def load(self, entries: Iterable[tuple[int, bytes, int]]) -> None:
        """Replace the contents with ``(seq, key, size)`` entries, oldest seq first."""
        with self._lock:
            self._order = OrderedDict((key, size) for _seq, key, size in sorted(entries))
            self._nbytes = sum(self._order.values())

    def touch(self, rkeys: Iterable[bytes]) -> None:
        """Mark records as just used (keys no longer present are ignored)."""
        with self._lock:
            order = self._order
            for key in rkeys:
                if key in order:
                    order.move_to_end(key)

    def oldest(self, need_bytes: int, keep: Collection[bytes]) -> list[tuple[bytes, int]]:
        """Least recently used records, skipping ``keep``, whose sizes add up
        to at least ``need_bytes`` (or every other record if they do not)."""
        victims: list[tuple[bytes, int]] = []
        freed = 0
        with self._lock:
            for key, size in self._order.items():
                if freed >= need_bytes:
                    break
                if key in keep:
                    continue
                victims.append((key, size))
                freed += size
        return victims

    def apply(self, added: Mapping[bytes, int], removed: Iterable[bytes]) -> None:
        """Record a committed transaction: ``removed`` first, then ``added``."""
        with self._lock:
            order = self._order
            for key in removed:
                size = order.pop(key, None)
                if size is not None:
                    self._nbytes -= size
            for key, size in added.items():
                old = order.pop(key, None)
                if old is not None:
                    self._nbytes -= old
                order[key] = size
                self._nbytes += size

    def check_integrity(self) -> None:
        """Verify the byte total matches the entries. A size may be 0: the
        index mirrors what the store holds, and a zero-length value (no
        record: written by something else, or damaged) is indexed as it is
        until a read finds it corrupt and deletes it (or eviction takes it
        first: it sorts oldest, having no write sequence number)."""
        with self._lock:
            total = sum(self._order.values())
            assert total == self._nbytes, f"index: sizes sum to {total}, total says {self._nbytes}"
            assert all(size >= 0 for size in self._order.values()), "index: a record of size < 0"

"""Which stored pages left the pool, and which values to rewrite: the pool's page bookkeeping.

Three records, each thread-safe:

* ``ValueIndex``: the values this process stored (wrote, or found there),
  by the record key of each value (its last page's): its pages and its
  namespace. A removal names a value key only; the index turns it into the
  pages that went, and into the namespace set entry to take out (trimming).
  Bounded: past ``limit`` values the oldest are forgotten (their removals
  are then unknown to this engine, as another engine's are).
* ``Suspects``: pages after a record a reader refused, whose values the next
  put rewrites instead of keeping (a put is ``SET NX`` otherwise).
* ``KeyspaceObserver``: keyspace notifications, where the server sends them
  (its ``notify-keyspace-events`` holds ``E`` plus ``g`` (del), ``x``
  (expired) and ``e`` (evicted), e.g. ``Egxe``): a thread per primary
  subscribes to ``__keyevent@<db>__:{del,expired,evicted}`` and reports every
  removal of a value of this fingerprint, whoever removed it (another
  engine's ``forget_namespace``, the server's LRU, a TTL, an operator's
  DEL). ``sync`` follows the cluster's primaries as the link learns them,
  and a node that restarts is subscribed to again (removals in between are
  unknown). Without notifications only this process's own deletions are
  reported; evictions are found at the next read (a short read).

Removals are filed into the shared ``HeldRemovalLog``, which hands a page
over only after every put ticket that stored it finished, and only if this
process stored it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import redis

from radixcache.offload.storage import record as rec

log = logging.getLogger(__name__)

REMOVAL_EVENTS = ("del", "expired", "evicted")
_NEEDED_FLAGS = {"g": "del", "x": "expired", "e": "evicted"}
VALUES_LIMIT = 1 << 20  # values remembered per process (about 150-200 B each)
SUSPECTS_LIMIT = 1 << 16  # pages to rewrite, remembered at most


def notifications_cover_removals(flags: str) -> bool:
    """Whether a ``notify-keyspace-events`` value sends every removal we need."""
    flags = flags.replace("A", "g$lshzxet")  # "A" is the alias for all classes
    return "E" in flags and all(flag in flags for flag in _NEEDED_FLAGS)


class ValueIndex:
    """The values this process stored (see the module docstring). Keys are
    record keys (the fingerprint digest + a page key)."""

    def __init__(self, limit: int = VALUES_LIMIT) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        # value key -> namespace tag id (a one-page value), or (its earlier pages, tag id)
        self._values: OrderedDict[bytes, int | tuple[tuple[bytes, ...], int]] = OrderedDict()
        self._holder: dict[bytes, bytes] = {}  # a page before a value's last -> the value
        self._tags: dict[bytes, int] = {}  # namespace tag -> small id (one copy of each tag)
        self._tag_of: list[bytes] = []
        self._trims: list[tuple[bytes, bytes]] = []  # (value key, tag) to take out of the index

    def add(self, vkey: bytes, rkeys: Sequence[bytes], tag: bytes) -> None:
        """A put is storing the value ``vkey`` of pages ``rkeys`` (the last is ``vkey``)."""
        with self._lock:
            tid = self._tags.get(tag)
            if tid is None:
                tid = self._tags[tag] = len(self._tag_of)
                self._tag_of.append(tag)
            earlier = tuple(rkeys[:-1])
            self._values[vkey] = (earlier, tid) if earlier else tid  # (an int is smaller)
            self._values.move_to_end(vkey)
            for rkey in earlier:
                self._holder[rkey] = vkey
            while len(self._values) > self._limit:
                self._forget(*self._values.popitem(last=False))

    def _forget(self, vkey: bytes, entry: int | tuple[tuple[bytes, ...], int]) -> None:
        for rkey in () if isinstance(entry, int) else entry[0]:
            if self._holder.get(rkey) == vkey:
                del self._holder[rkey]

    def holding(self, rkeys: Iterable[bytes]) -> list[bytes]:
        """The value keys holding pages ``rkeys`` (a page's own key where no
        value this process stored holds it), each once, in order."""
        with self._lock:
            out = [self._holder.get(rkey, rkey) for rkey in rkeys]
        return list(dict.fromkeys(out))

    def removed(self, vkeys: Iterable[bytes]) -> list[bytes]:
        """Values ``vkeys`` left the pool: the page keys they held (a value
        this process does not know: its own page key), for the removal log;
        their namespace index entries are queued for trimming."""
        pages: list[bytes] = []
        with self._lock:
            for vkey in vkeys:
                entry = self._values.pop(vkey, None)
                if entry is not None:
                    self._forget(vkey, entry)
                    earlier, tid = ((), entry) if isinstance(entry, int) else entry
                    pages.extend(rkey[rec.FINGERPRINT_BYTES :] for rkey in earlier)
                    self._trims.append((vkey, self._tag_of[tid]))
                pages.append(vkey[rec.FINGERPRINT_BYTES :])
            del self._trims[: max(0, len(self._trims) - VALUES_LIMIT)]
        return pages

    def take_trims(self) -> list[tuple[bytes, bytes]]:
        """(value key, namespace tag) of values gone since the last call."""
        with self._lock:
            out, self._trims = self._trims, []
        return out


class Suspects:
    """Pages whose values the next put rewrites (see the module docstring)."""

    def __init__(self, limit: int = SUSPECTS_LIMIT) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def add(self, rkeys: Iterable[bytes]) -> None:
        with self._lock:
            for rkey in rkeys:
                self._keys[rkey] = None
            while len(self._keys) > self._limit:
                self._keys.popitem(last=False)

    def take(self, rkeys: Iterable[bytes]) -> set[bytes]:
        """Those of ``rkeys`` that are suspect (no longer listed afterwards)."""
        with self._lock:
            if not self._keys:
                return set()
            found = {rkey for rkey in rkeys if rkey in self._keys}
            for rkey in found:
                del self._keys[rkey]
        return found

    def __len__(self) -> int:
        return len(self._keys)


class KeyspaceObserver:
    """Subscribes to removal events on every primary; reports value keys.

    ``prefix`` is the pool-key prefix of this fingerprint's values; events of
    other keys are ignored. ``report`` gets the record keys of removed values
    (on an observer thread). One daemon thread per node; ``close`` stops them.
    """

    def __init__(self, db: int, prefix: bytes, report: Callable[[list[bytes]], None]) -> None:
        self._prefix = prefix
        self._cut = len(prefix) - rec.FINGERPRINT_BYTES  # pool key[cut:]: record key
        self._report = report
        self._stop = threading.Event()
        self._channels = [f"__keyevent@{db}__:{event}" for event in REMOVAL_EVENTS]
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[threading.Thread, threading.Event]] = {}  # (thread, stop)
        self._subscribed: dict[str, threading.Event] = {}  # name -> set while subscribed

    def sync(self, clients: dict[str, redis.Redis], wait_s: float = 3.0) -> None:
        """Observe exactly the nodes of ``clients`` (name -> client): new ones
        get a thread, gone ones are stopped; returns once every observed node
        is subscribed (again, after a restart), or after ``wait_s``, so that
        puts that follow have their removals reported where the nodes are up."""
        waits: list[threading.Event] = []
        with self._lock:
            for name in list(self._nodes):
                if name not in clients:
                    self._nodes.pop(name)[1].set()
                    self._subscribed.pop(name, None)
            for name, client in clients.items():
                if name in self._nodes or self._stop.is_set():
                    client.close()
                    continue
                stop, subscribed = threading.Event(), threading.Event()
                thread = threading.Thread(
                    target=self._listen, args=(client, subscribed, stop),
                    name="radixcache-pool-events", daemon=True,
                )  # fmt: skip
                self._nodes[name] = (thread, stop)
                self._subscribed[name] = subscribed
                thread.start()
            waits = list(self._subscribed.values())
        deadline = time.monotonic() + wait_s
        for subscribed in waits:
            subscribed.wait(timeout=max(0.0, deadline - time.monotonic()))

    def nodes(self) -> list[str]:
        """The nodes whose removals are observed now (subscribed)."""
        with self._lock:
            return sorted(name for name, sub in self._subscribed.items() if sub.is_set())

    def _listen(
        self, client: redis.Redis, subscribed: threading.Event, stop: threading.Event
    ) -> None:
        while not (self._stop.is_set() or stop.is_set()):
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(*self._channels)
                confirmed = 0
                while not (self._stop.is_set() or stop.is_set()):
                    message = pubsub.get_message(timeout=0.2)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        confirmed += 1
                        if confirmed == len(self._channels):
                            subscribed.set()
                    elif message["type"] == "message":
                        key = message["data"]
                        if isinstance(key, bytes) and key.startswith(self._prefix):
                            self._report([key[self._cut :]])
            except (redis.exceptions.RedisError, OSError):
                subscribed.clear()
                stop.wait(0.1)  # the node is down or restarting: try again shortly
            finally:
                try:
                    pubsub.close()
                except Exception:  # a broken connection may fail to close
                    pass
        client.close()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            threads = [thread for thread, _stop in self._nodes.values()]
        for thread in threads:
            thread.join(timeout=5.0)

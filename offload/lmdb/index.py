"""The in-memory index of an LMDB store: which records exist, their sizes, and
their recency (least recently used first).

Recency is kept in memory only: ordered dicts from record key to value
size, where a put appends and a verified read moves the record to the end.
At open it is rebuilt from the write sequence number in each record header,
so after a restart records are ordered by when they were written, and the
reads of earlier runs are forgotten. This costs no LMDB write per read (a
read-path write would serialize every hit behind the single LMDB writer).

Tenants: every record belongs to one tenant (offload/lmdb/quotas.py), and
the index keeps one recency order and one byte total per tenant, so a
tenant's own eviction walks only its own records. The global order (for
capacity eviction) is the merge of the tenants' orders by a stamp each entry
carries (a counter, bumped by every put and touch).

Threads: ``apply`` and ``oldest`` run on the writer thread, ``touch`` on
reader threads, all under one lock; ``__contains__`` is one dict lookup,
atomic under the GIL, and takes no lock, so the owner thread's
``longest_prefix`` never waits on I/O.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from radixcache.offload.lmdb.quotas import TenantKey

Entry = tuple[int, int]  # (stamp: recency order, value bytes)


class _Tenant:
    """One tenant's records, oldest first, and their byte total."""

    __slots__ = ("nbytes", "order")

    def __init__(self) -> None:
        self.order: OrderedDict[bytes, Entry] = OrderedDict()  # key -> (stamp, size)
        self.nbytes = 0


class RecencyIndex:
    """Record keys -> value sizes and tenants, oldest (least recently used) first."""

    __slots__ = ("_lock", "_nbytes", "_stamp", "_tenant_of", "_tenants")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards every field but reads of _tenant_of
        self._tenant_of: dict[bytes, TenantKey] = {}  # key -> its tenant (every record)
        self._tenants: dict[TenantKey, _Tenant] = {}  # tenants with records
        self._nbytes = 0  # sum of every record's size
        self._stamp = 0  # the stamp of the next put or touch

    def __contains__(self, rkey: object) -> bool:
        return rkey in self._tenant_of

    def __len__(self) -> int:
        return len(self._tenant_of)

    def keys(self) -> list[bytes]:
        """Every record key, oldest first (a snapshot)."""
        with self._lock:
            return [key for _stamp, key, _size, _t in self._merged(self._tenants)]

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def tenant_of(self, rkey: bytes) -> TenantKey:
        """The tenant of a stored record (KeyError if it is not stored)."""
        return self._tenant_of[rkey]

    def size_of(self, rkey: bytes) -> int:
        """The value size of a stored record (KeyError if it is not stored)."""
        with self._lock:
            return self._tenants[self._tenant_of[rkey]].order[rkey][1]

    def tenant_bytes(self, tenant: TenantKey) -> int:
        """Bytes of ``tenant``'s records."""
        with self._lock:
            entry = self._tenants.get(tenant)
            return 0 if entry is None else entry.nbytes

    def tenant_totals(self) -> dict[TenantKey, tuple[int, int]]:
        """tenant -> (records, bytes), for every tenant with records."""
        with self._lock:
            return {t: (len(e.order), e.nbytes) for t, e in self._tenants.items()}

    def load(self, entries: Iterable[tuple[int, bytes, int, TenantKey]]) -> None:
        """Replace the contents with ``(seq, key, size, tenant)`` entries, oldest seq first."""
        with self._lock:
            self._tenant_of, self._tenants, self._nbytes = {}, {}, 0
            for stamp, (_seq, key, size, tenant) in enumerate(sorted(entries, key=_by_seq)):
                self._add(key, size, tenant, stamp)
            self._stamp = len(self._tenant_of)

    def touch(self, rkeys: Iterable[bytes]) -> None:
        """Mark records as just used (keys no longer present are ignored)."""
        with self._lock:
            for key in rkeys:
                tenant = self._tenant_of.get(key, _ABSENT)
                if tenant is _ABSENT:
                    continue
                order = self._tenants[tenant].order  # type: ignore[index]
                order[key] = (self._stamp, order[key][1])
                order.move_to_end(key)
                self._stamp += 1

    def oldest(
        self,
        need_bytes: int,
        keep: Collection[bytes],
        floor: Callable[[TenantKey], int] | None = None,
    ) -> list[tuple[bytes, int]]:
        """Least recently used records over every tenant, skipping ``keep``
        and any record whose eviction would take its tenant below
        ``floor(tenant)``, whose sizes add up to at least ``need_bytes`` (or
        every other record if they do not)."""
        victims: list[tuple[bytes, int]] = []
        freed = 0
        with self._lock:
            if need_bytes <= 0:
                return victims
            left = {t: e.nbytes - (floor(t) if floor else 0) for t, e in self._tenants.items()}
            open_ = {t: e for t, e in self._tenants.items() if left[t] > 0}
            for _stamp, key, size, tenant in self._merged(open_):
                if freed >= need_bytes:
                    break
                if key in keep or size > left[tenant]:
                    continue
                left[tenant] -= size
                victims.append((key, size))
                freed += size
        return victims

    def oldest_of(
        self, tenant: TenantKey, need_bytes: int, keep: Collection[bytes]
    ) -> list[tuple[bytes, int]]:
        """``tenant``'s least recently used records, skipping ``keep``, whose
        sizes add up to at least ``need_bytes`` (or all of them if they do not).
        Walks that tenant's records only."""
        victims: list[tuple[bytes, int]] = []
        freed = 0
        with self._lock:
            entry = self._tenants.get(tenant)
            if entry is None or need_bytes <= 0:
                return victims
            for key, (_stamp, size) in entry.order.items():
                if freed >= need_bytes:
                    break
                if key not in keep:
                    victims.append((key, size))
                    freed += size
        return victims

    def apply(self, added: Mapping[bytes, tuple[int, TenantKey]], removed: Iterable[bytes]) -> None:
        """Record a committed transaction: ``removed`` first, then ``added``
        (key -> (size, tenant))."""
        with self._lock:
            for key in removed:
                self._drop(key)
            for key, (size, tenant) in added.items():
                self._drop(key)
                self._add(key, size, tenant, self._stamp)
                self._stamp += 1

    def _add(self, key: bytes, size: int, tenant: TenantKey, stamp: int) -> None:
        entry = self._tenants.get(tenant)
        if entry is None:
            entry = self._tenants[tenant] = _Tenant()
        entry.order[key] = (stamp, size)
        entry.nbytes += size
        self._tenant_of[key] = tenant
        self._nbytes += size

    def _drop(self, key: bytes) -> None:
        tenant = self._tenant_of.pop(key, _ABSENT)
        if tenant is _ABSENT:
            return
        entry = self._tenants[tenant]  # type: ignore[index]
        _stamp, size = entry.order.pop(key)
        entry.nbytes -= size
        self._nbytes -= size
        if not entry.order:
            del self._tenants[tenant]  # type: ignore[arg-type]

    @staticmethod
    def _merged(tenants: Mapping[TenantKey, _Tenant]) -> Iterator[tuple[int, bytes, int, TenantKey]]:
        """Every record of ``tenants`` as (stamp, key, size, tenant), oldest first."""
        def walk(t: TenantKey, e: _Tenant) -> Iterator[tuple[int, bytes, int, TenantKey]]:
            return ((stamp, key, size, t) for key, (stamp, size) in e.order.items())

        return heapq.merge(*(walk(t, e) for t, e in tenants.items()))

    def check_integrity(self) -> None:
        """Verify the byte totals (global and per tenant) match the entries.
        A size may be 0: the index mirrors what the store holds, and a
        zero-length value (no record: written by something else, or damaged)
        is indexed as it is until a read finds it corrupt and deletes it (or
        eviction takes it first: it sorts oldest, having no write sequence
        number)."""
        with self._lock:
            total = 0
            for tenant, entry in self._tenants.items():
                sizes = [size for _stamp, size in entry.order.values()]
                assert entry.order, "index: a tenant without records is listed"
                assert sum(sizes) == entry.nbytes, (
                    f"index: a tenant's sizes sum to {sum(sizes)}, its total says {entry.nbytes}"
                )
                assert all(size >= 0 for size in sizes), "index: a record of size < 0"
                assert all(self._tenant_of.get(k, _ABSENT) == tenant for k in entry.order), (
                    "index: a record is listed under another tenant"
                )
                total += entry.nbytes
            assert total == self._nbytes, f"index: sizes sum to {total}, total says {self._nbytes}"
            assert sum(len(e.order) for e in self._tenants.values()) == len(self._tenant_of), (
                "index: the tenants' records and the key map differ"
            )


_ABSENT: object = object()  # not a tenant (None is one)


def _by_seq(entry: tuple[int, bytes, int, TenantKey]) -> tuple[int, bytes]:
    return entry[0], entry[1]

"""MooncakeStorage: the storage tier as a pool on Mooncake Store, shared by engines.

Objects in the pool (offload/mooncake/keys.py)::

    <prefix><fingerprint hex>/<page key hex>                  -> storage record
    <prefix><fingerprint hex>/ns/<ns tag hex>/<page key hex>  -> namespace marker

A page key already binds its namespace and its whole prefix; the fingerprint
binds the model, KV layout and rank (invariant 8), so engines of one model
share pages and engines of another never see them. Every record carries its
full key, token ids and a checksum, and is verified on every read: a value
that is corrupt, truncated, or was copied under another key is a miss
(deleted and counted as corrupt), never a hit.

Where the bytes live: in the memory segments that Mooncake clients
contribute, placed by the master. Engines contribute none by default
(``MooncakeConfig.segment_mib``): a dedicated holder process keeps the
memory, so an engine that exits or crashes takes no pages with it. When a
holder exits, the pages in its segment are gone (a graceful exit unmounts
it at once; a killed one is unreadable until the master's ``client_ttl``):
misses, never wrong bytes.

Tags: a put's tags list its namespace in the pool (offload/mooncake/tags.py)
and ``invalidate_tag`` forgets the namespaces a tag lists, whoever wrote
them. Retention is not supported yet: a put with a deadline writes nothing
(counted in ``MooncakePoolStats.past_deadline``).

Leases: a read (and an existence check) leases the object for the master's
``default_kv_lease_ttl``; a read that outlives its lease reports
LEASE_EXPIRED and is a miss, its bytes never used. Eviction (the master's
watermark LRU) and lost segments are not reported to clients: the PyPI build
of Mooncake has no KV event publisher (``--enable_kv_events`` binds
nothing), so ``take_removed`` lists only this process's own removals and an
eviction shows as a miss when a page is read.

Failures: a master that is down makes every call a miss (``longest_prefix``
0, ``get`` short, ``put`` short), counted, never raised; it is tried again
after ``retry_after_s`` and used again once it answers (its pages are lost
with it: the master keeps its index in memory). See offload/mooncake/link.py.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from radixcache.events.types import EXTERNAL, Medium
from radixcache.offload.mooncake.config import MooncakeConfig
from radixcache.offload.mooncake.keys import PoolKeys
from radixcache.offload.mooncake.link import RPC_FAIL, MooncakeLink, PoolUnavailable
from radixcache.offload.mooncake.reader import MooncakeReader
from radixcache.offload.mooncake.writer import MooncakeWriter
from radixcache.offload.storage import (
    HeldRemovalLog,
    ModelFingerprint,
    RecordMeta,
    StorageBase,
    StoreSizes,
    TagJob,
)
from radixcache.offload.storage.checks import check_tag
from radixcache.transfer.ticket import FutureTicket, Ticket
from radixcache.transfer.layout import KVSpec

log = logging.getLogger(__name__)

_SIZES_EVERY_S = 1.0  # refresh of the pool's key count and memory figures


@dataclass(frozen=True, slots=True)
class MooncakePoolStats:
    """The pool's own figures, beside the ``StorageStats`` every backend has."""

    connected: bool  # the client is set up and the master answered lately
    connects: int  # successful client setups (1, or 0 while the master was never reached)
    unavailable: int  # calls answered as misses because the master was down or unreachable
    size_lookups: int  # get_size calls a reader made to learn a record head's size
    orphans: int  # records read without their namespace marker (forgotten; deleted)
    removals_observed: bool  # always False: Mooncake's PyPI build reports no removals
    past_deadline: int  # pages not written: they carried a retention deadline (not supported yet)
    tag_full: int  # pages not written: a tag of theirs lists TAG_SLOTS namespaces already


class MooncakeStorage(StorageBase):
    """The ``Storage`` protocol on a Mooncake Store pool (see the module docstring).

    Its transport: the link (one client, its health), the reader and the
    writer; the calls themselves are ``StorageBase``'s. Public methods are
    called by the owner thread; ``longest_prefix`` is the only one that waits
    on the network (one existence check).
    """

    medium: Medium = EXTERNAL  # the event medium of its pages (SGLang's name for a shared pool)
    pages_name = "pool"
    _writer: MooncakeWriter
    _reader: MooncakeReader

    def __init__(self, config: MooncakeConfig, spec: KVSpec, fingerprint: ModelFingerprint) -> None:
        if not isinstance(config, MooncakeConfig):
            raise TypeError(f"config must be a MooncakeConfig, got {type(config).__name__}")
        super().__init__(spec, fingerprint)
        self.config = config
        self.keys = PoolKeys(config.key_prefix, self._digest)
        self._link = MooncakeLink(config)
        self._held = HeldRemovalLog()
        self._removals = self._held
        self._pool_sizes = StoreSizes(0, 0, 0)
        self._sizes_at = 0.0
        self._lookup_unavailable = 0
        self._writer = MooncakeWriter(
            self.where, self._counters, self._held, self._link, self.keys, spec.page_size,
            before_job=self._refresh_sizes,
        )  # fmt: skip
        self._reader = MooncakeReader(self._link, self.keys, self._writer, spec.page_size)

    @property
    def where(self) -> str:
        return f"storage {self.config.describe()}"

    def pool_names(self, keys: Sequence[bytes]) -> list[str]:
        """The pool's record names of page keys (validated: bytes of 1 to 256)."""
        return self.keys.records(self.record_keys(keys))

    # -- Storage protocol ----------------------------------------------------------------
    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` whose records the pool holds, in one existence
        check; 0 while the master is down. It leases what it finds (for the
        master's lease time: protected from eviction until read). A page
        another engine forgot may still count here until a read meets it."""
        self._check_open()
        names = self.pool_names(keys)
        if not names:
            return 0
        try:
            found: list[int] = self._link.run(lambda store: store.batch_is_exist(names))
        except PoolUnavailable:
            self._lookup_unavailable += 1
            return 0
        n = 0
        for value in found:
            if value != 1:
                if value == RPC_FAIL:
                    self._link.mark_down("a lookup found the master unreachable")
                    self._lookup_unavailable += 1
                break
            n += 1
        return n

    def invalidate_tag(self, tag: str) -> Ticket:
        """Forget every namespace of this model that a put (of any engine)
        tagged with ``tag`` (offload/mooncake/tags.py); result: the pages
        removed (their markers). The ticket fails (``PoolUnavailable``) when
        the master cannot be reached. ValueError / TypeError for a tag that
        is not 1-128 printable ASCII characters without spaces."""
        self._check_open()
        ticket = FutureTicket()
        self._writer.submit(TagJob(b"", ticket, tag=check_tag(tag)))
        return ticket

    def scan(self) -> Iterator[RecordMeta]:
        """Nothing: the pool's records belong to every engine that uses it, so an
        engine announces only the pages it wrote (as it writes them)."""
        return iter(())

    def _sizes(self) -> StoreSizes:
        return self._pool_sizes

    def pool_stats(self) -> MooncakePoolStats:
        """The pool's own figures (see ``MooncakePoolStats``)."""
        return MooncakePoolStats(
            connected=self._link.available(),
            connects=self._link.connects,
            unavailable=self._reader.unavailable + self._writer.unavailable + self._lookup_unavailable,
            size_lookups=self._reader.size_lookups,
            orphans=self._reader.orphans,
            removals_observed=False,
            past_deadline=self._writer.past_deadline,
            tag_full=self._writer.tag_full,
        )

    def _release(self) -> None:
        self._link.close()

    def __repr__(self) -> str:
        return f"MooncakeStorage({self.config.describe()}, {self.fingerprint.describe()!r})"

    # -- helpers ---------------------------------------------------------------------------
    def _refresh_sizes(self) -> None:
        """Pool-wide key count, bytes in use and capacity from the master's
        metrics server, at most once a second (writer thread)."""
        url = self.config.metrics_url
        now = time.monotonic()
        if url is None or now - self._sizes_at < _SIZES_EVERY_S:
            return
        self._sizes_at = now
        try:
            figures = master_metrics(url)
        except Exception:  # figures only; the data calls notice a dead master
            return
        self._pool_sizes = StoreSizes(
            records=int(figures.get("master_key_count", 0)),
            stored_bytes=int(figures.get("master_allocated_bytes", 0)),
            capacity_bytes=int(figures.get("master_total_capacity_bytes", 0)),
        )


def master_metrics(url: str, timeout_s: float = 0.5) -> dict[str, float]:
    """The unlabelled gauges of a master's Prometheus ``/metrics`` page
    (``master_key_count``, ``master_allocated_bytes``, ...). Raises OSError."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode()
    figures: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line.startswith("master_") and "{" not in name:
            try:
                figures[name] = float(value)
            except ValueError:
                continue
    return figures


def master_health(url: str, timeout_s: float = 0.5) -> dict[str, object]:
    """A master's ``/health`` answer (``service_ready`` says it serves). Raises OSError."""
    with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as reply:
        answer = json.loads(reply.read())
    return answer if isinstance(answer, dict) else {}

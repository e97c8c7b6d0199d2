"""What one LMDB write transaction does: write, remove, forget, invalidate and evict records.

``TxnBody`` holds the store's databases (``LmdbEnv``) and runs the jobs of one step
inside one write transaction; it records what the transaction changed in a
``TxnEffects``, which the writer applies (index, counters, tickets, removal
log) only once the transaction committed (offload/lmdb/writer.py). Nothing
here commits, touches the index or finishes a ticket. Writer thread only.

Tenants (offload/lmdb/quotas.py): the ``tenants`` database maps each
namespace tag to the id of the tenant its first put named (``encode_tenant``;
an id, never the tenant itself), written
in the transaction that writes the namespace's first record and deleted by
``forget``. A record's tenant is its namespace's, so at open the index gets
every record's tenant id from the namespace tag in its header (in the clear in
sealed records too) through that map: the per-tenant totals after a restart
are those before it. (The engine's namespaces each have one tenant, their
salt; a namespace put under two tenants counts for the first.) Records of a
namespace not in the map (written before there was one) count for None.

Retention and tags (offload/lmdb/retention.py): a put writes each new
record's deadline into ``expiry`` and its namespace's (tag, namespace) pairs
into ``tags``; removing a record removes its deadline; forgetting a namespace
removes its pairs; invalidating a tag forgets every namespace under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lmdb
import numpy as np
import numpy.typing as npt

from radixcache.offload.lmdb.env import LmdbEnv, encode_tenant
from radixcache.offload.lmdb.quotas import TenantCounters, TenantKey, tenant_id
from radixcache.offload.lmdb.slots import slot_body, stored_size, unwrap, wrap
from radixcache.offload.lmdb.retention import TagJob, TagPair, encode_deadline, tag_key
from radixcache.offload.storage import ForgetJob, PutJob
from radixcache.offload.storage import record as rec

Txn = lmdb.Transaction  # a write transaction with buffers=True (values are memoryviews)


@dataclass(slots=True)
class TxnEffects:
    """What one write transaction changed; applied once it committed."""

    added: dict[bytes, tuple[int, TenantKey]] = field(default_factory=dict)  # new -> (bytes, tenant id)
    dropped: list[bytes] = field(default_factory=list)  # keys to drop from the index
    removed: list[bytes] = field(default_factory=list)  # records removed (to publish)
    touched: list[bytes] = field(default_factory=list)  # stored keys a put found
    written: int = 0  # records written
    skipped: int = 0  # put keys found already stored
    evicted: int = 0  # records evicted for room
    deleted: int = 0  # records removed by delete()/forget_namespace()/invalidate_tag()
    expired: int = 0  # records removed past their retention deadline
    freed: int = 0  # bytes of the records removed (reusable two commits later)
    tagged: dict[bytes, TenantKey] = field(default_factory=dict)  # namespace tags -> tenant id, new
    untagged: set[bytes] = field(default_factory=set)  # namespace tags forgotten
    quota_evicted: dict[TenantKey, int] = field(default_factory=dict)  # evicted for a limit
    dropped_pages: dict[TenantKey, int] = field(default_factory=dict)  # put pages not written
    deadlines: dict[bytes, float] = field(default_factory=dict)  # new records' deadlines
    tag_changes: dict[TagPair, bool] = field(default_factory=dict)  # (tag, ns) pairs: added?
    taken: list[int] = field(default_factory=list)  # slots written (given back on abort)
    freed_slots: list[int] = field(default_factory=list)  # slots of records removed

    def count(self, counts: dict[TenantKey, int], tenant: TenantKey, n: int = 1) -> None:
        """Add ``n`` to ``tenant``'s entry of ``counts`` (one of the dicts above)."""
        counts[tenant] = counts.get(tenant, 0) + n


class TxnBody:
    """The record operations of write transactions on one environment."""

    def __init__(self, store: LmdbEnv, next_seq: int, counters: TenantCounters) -> None:
        self._pages = store.pages  # record key -> record
        self._ns = store.ns  # namespace tag -> record keys (dupsort)
        self._meta = store.meta  # store-wide records (fingerprint, tick)
        self._tenants = store.tenants  # namespace tag -> tenant (see the module docstring)
        self._tag_tenant = store.tag_tenant  # ... in memory; changed by the writer after a commit
        self._secret = store.tenant_secret  # the key of tenant ids
        self._counters = counters  # learns which tenant each id is
        self._index = store.index  # read here, changed by the writer after a commit
        self._expiry = store.expiry  # record key -> deadline
        self._tags = store.tags  # tag -> namespace tags (dupsort)
        self._deadlines = store.deadlines  # ... in memory; changed by the writer after a commit
        self._tag_book = store.tag_book  # namespace tag -> tags, likewise
        self._next_seq = next_seq  # write sequence number of the next record
        self._staging = bytearray(0)  # each inline record is built here, then put (reused)
        self._slots = store.slots if store.writes_slots else None  # KV bytes outside the map
        self._ticks = 0  # commits made only to advance LMDB's transaction id

    def tenant_of(self, job: PutJob) -> TenantKey:
        """The tenant id a put job's new records will count for (as committed so far)."""
        if job.ns_tag in self._tag_tenant:
            return self._tag_tenant[job.ns_tag]
        return self.tenant_id(job.tenant)

    def tenant_id(self, tenant: TenantKey) -> TenantKey:
        """The id of ``tenant`` in this store (offload/lmdb/quotas.py)."""
        return tenant_id(self._secret, tenant)

    def put(
        self,
        txn: Txn,
        job: PutJob,
        effects: TxnEffects,
        budget: int,
        limits: dict[TenantKey, int],
    ) -> int:
        """Write one put job's records into ``txn`` (keys already stored are
        kept); returns the byte budget left. ``limits``: the bytes each tenant
        with a limit may still add (this job's use is taken off). Pages past
        the first that fits in neither are dropped (counted)."""
        host_bytes = job.host.as_bytes()
        gone = set(effects.dropped)
        tenant = self._tenant(txn, job, effects)
        deadline = None if job.meta is None else job.meta.expires_at
        if job.meta is not None and job.meta.tags:
            self._tag(txn, job.ns_tag, job.meta.tags, effects)
        slotted = self._slots is not None and slot_body(job) <= self._slots.slot_bytes
        for i, rkey in enumerate(job.keys):
            if rkey in effects.added or (rkey in self._index and rkey not in gone):
                effects.touched.append(rkey)
                effects.skipped += 1
                job.result += 1
                continue
            size = job.record_bytes(i)
            if size > budget or size > limits.get(tenant, size):
                # no room left, even after evicting every older record it may
                effects.count(effects.dropped_pages, tenant, len(job.keys) - i)
                break
            kv = host_bytes[job.host_pages[i]]
            if slotted:
                existing = txn.get(rkey, db=self._pages)
                if existing is None:  # the KV bytes into a slot, the rest into LMDB
                    txn.put(rkey, self._slotted(job, i, kv, effects), db=self._pages)
            else:
                if len(self._staging) != size:
                    self._staging = bytearray(size)
                job.encode_into(self._staging, i, self._next_seq, kv)
                self._next_seq += 1
                existing = None
                if not txn.put(rkey, self._staging, overwrite=False, db=self._pages):
                    existing = txn.get(rkey, db=self._pages)  # (LMDB copied the new one)
                    assert existing is not None, "put(overwrite=False) refused a missing key"
            if existing is None:
                txn.put(job.ns_tag, rkey, db=self._ns)
                if deadline is not None:
                    txn.put(rkey, encode_deadline(deadline), db=self._expiry)
                    effects.deadlines[rkey] = deadline
                effects.added[rkey] = (size, tenant)
                effects.written += 1
                budget -= size
                if tenant in limits:
                    limits[tenant] -= size
            else:  # on disk but not in the index: written by another process
                effects.added[rkey] = (stored_size(existing), tenant)
                effects.skipped += 1
            job.result += 1
        return budget

    def _slotted(
        self, job: PutJob, i: int, kv: npt.NDArray[np.uint8], effects: TxnEffects
    ) -> bytes:
        """Write page ``i``'s record: its body (the KV bytes, straight from
        the page; sealed: their ciphertext and tag) into a new slot; returns
        the envelope of its head, for LMDB (offload/lmdb/slots.py)."""
        assert self._slots is not None
        head, body = job.encode_parts(i, self._next_seq, kv)
        self._next_seq += 1
        view = memoryview(body).cast("B")
        slot = self._slots.take()
        effects.taken.append(slot)
        self._slots.write(slot, [view])
        return wrap(slot, len(view), head)

    def _tenant(self, txn: Txn, job: PutJob, effects: TxnEffects) -> TenantKey:
        """The tenant id of the job's namespace, recording it in ``txn`` if new."""
        tag = job.ns_tag
        if tag in effects.tagged:
            return effects.tagged[tag]
        if tag in self._tag_tenant and tag not in effects.untagged:
            return self._tag_tenant[tag]
        tid = self.tenant_id(job.tenant)
        self._counters.saw(tid, job.tenant)
        txn.put(tag, encode_tenant(tid), db=self._tenants)
        effects.tagged[tag] = tid
        return tid

    def _tag(self, txn: Txn, ns_tag: bytes, tags: tuple[str, ...], effects: TxnEffects) -> None:
        """List namespace ``ns_tag`` under each of ``tags`` (pairs already listed are kept)."""
        for tag in tags:
            pair = (tag_key(self._secret, tag), ns_tag)
            listed = effects.tag_changes.get(pair)
            if listed or (listed is None and self._tag_book.has(pair)):
                continue
            txn.put(pair[0], ns_tag, db=self._tags)
            effects.tag_changes[pair] = True

    def forget(self, txn: Txn, job: ForgetJob, effects: TxnEffects) -> None:
        """Remove every record of the job's namespace (a ``TagJob``: of every
        namespace listed under its tag, and the tag's entries)."""
        if isinstance(job, TagJob):
            cursor = txn.cursor(db=self._tags)
            found = cursor.set_key(job.tag)
            namespaces = [bytes(v) for v in cursor.iternext_dup()] if found else []
            for ns_tag in namespaces:
                job.result += self._forget(txn, ns_tag, effects)
            txn.delete(job.tag, db=self._tags)  # any entry left
        else:
            job.result += self._forget(txn, job.ns_tag, effects)
        effects.deleted += job.result

    def _forget(self, txn: Txn, ns_tag: bytes, effects: TxnEffects) -> int:
        """Remove every record indexed under ``ns_tag``, its index entry, its
        tenant and its tags; returns the records removed."""
        cursor = txn.cursor(db=self._ns)
        rkeys = [bytes(v) for v in cursor.iternext_dup()] if cursor.set_key(ns_tag) else []
        removed = sum(self.remove(txn, rkey, effects) for rkey in rkeys)
        txn.delete(ns_tag, db=self._ns)  # any entry left whose record was gone
        txn.delete(ns_tag, db=self._tenants)
        effects.tagged.pop(ns_tag, None)
        effects.untagged.add(ns_tag)
        tags = self._tag_book.tags_of(ns_tag)
        tags.update(t for (t, ns), listed in effects.tag_changes.items() if ns == ns_tag and listed)
        for tag in tags:
            txn.delete(tag, ns_tag, db=self._tags)
            effects.tag_changes[(tag, ns_tag)] = False
        return removed

    def remove(self, txn: Txn, rkey: bytes, effects: TxnEffects) -> bool:
        """Delete one record and its namespace entry; False if it did not exist."""
        effects.dropped.append(rkey)
        effects.added.pop(rkey, None)
        value = txn.get(rkey, db=self._pages)
        if value is None:
            return False
        parts = unwrap(value)  # None: the record inline; else its lead, slot, tail
        if parts is not None:
            effects.freed_slots.append(parts[1])
        # a copy: value dies with the next write
        tag = rec.read_namespace_tag(value if parts is None else parts[0])
        effects.freed += len(value)
        txn.delete(rkey, db=self._pages)
        if tag is not None:
            txn.delete(tag, rkey, db=self._ns)
        if effects.deadlines.pop(rkey, None) is not None or self._deadlines.at(rkey) is not None:
            txn.delete(rkey, db=self._expiry)
        effects.removed.append(rkey)
        return True

    def evict(self, txn: Txn, victims: list[tuple[bytes, int]]) -> TxnEffects:
        """Remove ``victims`` (record key, size) for room."""
        effects = TxnEffects()
        for rkey, _size in victims:
            if self.remove(txn, rkey, effects):
                effects.evicted += 1
        return effects

    def tick(self, txn: Txn) -> TxnEffects:
        """Change nothing but a counter: a commit that advances LMDB's
        transaction id, so pages freed two commits ago become reusable."""
        self._ticks += 1
        txn.put(b"tick", self._ticks.to_bytes(8, "little"), db=self._meta)
        return TxnEffects()

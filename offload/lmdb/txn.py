"""What one LMDB write transaction does: write, remove, forget and evict records.

``TxnBody`` holds the store's databases (``LmdbEnv``) and runs the jobs of one step
inside one write transaction; it records what the transaction changed in a
``TxnEffects``, which the writer applies (index, counters, tickets, removal
log) only once the transaction committed (offload/lmdb/writer.py). Nothing
here commits, touches the index or finishes a ticket. Writer thread only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lmdb

from radixcache.offload.lmdb.env import LmdbEnv
from radixcache.offload.storage import ForgetJob, PutJob
from radixcache.offload.storage import record as rec

Txn = lmdb.Transaction  # a write transaction with buffers=True (values are memoryviews)


@dataclass(slots=True)
class TxnEffects:
    """What one write transaction changed; applied once it committed."""

    added: dict[bytes, int] = field(default_factory=dict)  # new records -> value bytes
    dropped: list[bytes] = field(default_factory=list)  # keys to drop from the index
    removed: list[bytes] = field(default_factory=list)  # records removed (to publish)
    touched: list[bytes] = field(default_factory=list)  # stored keys a put found
    written: int = 0  # records written
    skipped: int = 0  # put keys found already stored
    evicted: int = 0  # records evicted for room
    deleted: int = 0  # records removed by delete()/forget_namespace()
    freed: int = 0  # bytes of the records removed (reusable two commits later)


class TxnBody:
    """The record operations of write transactions on one environment."""

    def __init__(self, store: LmdbEnv, next_seq: int) -> None:
        self._pages = store.pages  # record key -> record
        self._ns = store.ns  # namespace tag -> record keys (dupsort)
        self._meta = store.meta  # store-wide records (fingerprint, tick)
        self._index = store.index  # read here, changed by the writer after a commit
        self._next_seq = next_seq  # write sequence number of the next record
        self._staging = bytearray(0)  # each record is built here, then put (reused)
        self._ticks = 0  # commits made only to advance LMDB's transaction id

    def put(self, txn: Txn, job: PutJob, effects: TxnEffects, budget: int) -> int:
        """Write one put job's records into ``txn`` (keys already stored are
        kept); returns the byte budget left."""
        host_bytes = job.host.as_bytes()
        gone = set(effects.dropped)
        for i, rkey in enumerate(job.keys):
            if rkey in effects.added or (rkey in self._index and rkey not in gone):
                effects.touched.append(rkey)
                effects.skipped += 1
                job.result += 1
                continue
            size = job.record_bytes(i)
            if size > budget:
                break  # no room left, even after evicting every older record
            if len(self._staging) != size:
                self._staging = bytearray(size)
            value = self._staging
            job.encode_into(value, i, self._next_seq, host_bytes[job.host_pages[i]])
            self._next_seq += 1
            if txn.put(rkey, value, overwrite=False, db=self._pages):  # LMDB copies it
                txn.put(job.ns_tag, rkey, db=self._ns)
                effects.added[rkey] = len(value)
                effects.written += 1
                budget -= len(value)
            else:  # on disk but not in the index: written by another process
                existing = txn.get(rkey, db=self._pages)
                assert existing is not None, "put(overwrite=False) refused a missing key"
                effects.added[rkey] = len(existing)
                effects.skipped += 1
            job.result += 1
        return budget

    def forget(self, txn: Txn, job: ForgetJob, effects: TxnEffects) -> None:
        """Remove every record indexed under the job's namespace tag, and the index entry."""
        cursor = txn.cursor(db=self._ns)
        rkeys = [bytes(v) for v in cursor.iternext_dup()] if cursor.set_key(job.ns_tag) else []
        for rkey in rkeys:
            job.result += self.remove(txn, rkey, effects)
        txn.delete(job.ns_tag, db=self._ns)  # any entry left whose record was gone
        effects.deleted += job.result

    def remove(self, txn: Txn, rkey: bytes, effects: TxnEffects) -> bool:
        """Delete one record and its namespace entry; False if it did not exist."""
        effects.dropped.append(rkey)
        effects.added.pop(rkey, None)
        value = txn.get(rkey, db=self._pages)
        if value is None:
            return False
        tag = rec.read_namespace_tag(value)  # a copy: value dies with the next write
        effects.freed += len(value)
        txn.delete(rkey, db=self._pages)
        if tag is not None:
            txn.delete(tag, rkey, db=self._ns)
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

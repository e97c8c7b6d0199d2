"""The pool's read and write paths: reader threads and one writer thread.

    get  --> reader pool (num_readers):  per chunk of batch_pages keys, one
                                         pipelined GET; verify each record and
                                         copy its KV into the host page; stop
                                         at the first miss or failed check
    put / delete / forget  --> queue --> writer thread: per chunk, one
                                         pipeline [SADD ns-index keys..., SET
                                         key record NX EX ttl ...]

The records are the storage record (radixcache.offload.record): the same
bytes as in LMDB, bound to the full key they were written under, verified on
every read. ``encode_record`` and ``verify_record`` are the only two places
that know the record format.

A put's index entries go first in its pipeline, so a connection lost half way
leaves at most index entries without records (harmless: ``forget_namespace``
deletes keys that are gone already), never a record missing from its index.

Failures never escape a thread: a pool that is down or times out ends a read
with the pages served so far (a miss for the rest) and a put with the keys
stored so far; both are counted. Nothing here raises into the owner.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from radixcache.offload import record as rec
from radixcache.offload.storage import Counters, HostPages, PageBuffer, PutMeta, TokenPages
from radixcache.offload.valkey_link import PoolLink, PoolUnavailable
from radixcache.offload.valkey_removals import RemovalLog
from radixcache.transfer.ticket import FutureTicket

log = logging.getLogger(__name__)


# -- the record (the one place that knows its format) ---------------------------
def record_bytes(key: bytes, num_tokens: int, kv_bytes: int, info: bytes) -> int:
    """Bytes of the record of one page whose record (full) key is ``key``."""
    return rec.record_size(len(key), len(info), num_tokens, kv_bytes)


def encode_record(
    out: memoryview,
    *,
    key: bytes,
    ns_tag: bytes,
    tokens: npt.NDArray[np.int32] | None,
    kv: npt.NDArray[np.uint8],
    seq: int,
    meta: PutMeta | None,
    index: int,
) -> None:
    """Write the record of page ``index`` of a put (``meta`` gives its event ids)."""
    rec.encode_into(
        out,
        key=key,
        ns_tag=ns_tag,
        tokens=tokens,
        kv=kv,
        seq=seq,
        block_id=None if meta is None else int(meta.block_ids[index]),
        parent_block_id=(
            None
            if meta is None
            else meta.parent_block_id if index == 0 else int(meta.block_ids[index - 1])
        ),
        depth=0 if meta is None else meta.first_depth + index,
        info=b"" if meta is None else meta.info,
    )


def verify_record(
    value: bytes,
    *,
    key: bytes,
    ns_tag: bytes | None,
    tokens: npt.NDArray[np.int32] | None,
    dst: npt.NDArray[np.uint8],
) -> bool:
    """Verify a record read under ``key`` and copy its KV bytes into ``dst``."""
    return rec.read_into(value, key=key, ns_tag=ns_tag, tokens=tokens, dst=dst)


# -- jobs -------------------------------------------------------------------------
@dataclass(slots=True)
class PutJob:
    """Write host pages as the records of ``rkeys`` (keys already there are kept)."""

    rkeys: list[bytes]  # pool keys (key prefix + record key)
    fkeys: list[bytes]  # record keys (fingerprint digest + page key), stored in each record
    pkeys: list[bytes]  # the page keys (for the removal log)
    tokens: TokenPages | None  # [n, P] token ids, a private copy; None: raw pages
    host: PageBuffer  # the caller's pages (read on the writer thread)
    host_pages: HostPages  # [n] page ids in ``host`` holding the pages
    ns_key: bytes  # the namespace index set
    ns_tag: bytes  # the namespace tag in each record
    meta: PutMeta | None  # event ids, parent, depth, info
    ticket: FutureTicket  # finished with the leading keys stored


@dataclass(slots=True)
class DeleteJob:
    """Remove the records of ``rkeys``."""

    rkeys: list[bytes]
    pkeys: list[bytes]
    ticket: FutureTicket | None  # None: a record a reader found corrupt


@dataclass(slots=True)
class ForgetJob:
    """Remove every record listed in one namespace index, then the index."""

    ns_key: bytes
    cut: int  # length of the pool-key prefix before the page key
    ticket: FutureTicket


Job = PutJob | DeleteJob | ForgetJob


class PoolWriter:
    """Runs put/delete/forget jobs in order on one thread."""

    def __init__(
        self,
        *,
        link: PoolLink,
        counters: Counters,
        removals: RemovalLog,
        ttl_s: int | None,
        batch_pages: int,
        first_seq: int,
        after_job: Callable[[], None],
    ) -> None:
        self._link = link
        self._counters = counters
        self._removals = removals
        self._ttl = ttl_s
        self._batch = batch_pages
        self._seq = first_seq  # write sequence number of the next record
        self._after_job = after_job  # e.g. refresh the pool's size figures
        self._staging = bytearray()  # records of one chunk, sent by one pipeline
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.unavailable = 0  # jobs cut short because the pool was down
        self._thread = threading.Thread(target=self._run, name="radixcache-pool-write", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        if isinstance(job, PutJob):
            self._removals.begin_put(job.pkeys)
        self._queue.put(job)

    def close(self) -> None:
        """Run every job queued so far, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                if isinstance(job, PutJob):
                    self._put(job)
                elif isinstance(job, DeleteJob):
                    self._delete(job)
                else:
                    self._forget(job)
                self._after_job()
            except Exception as exc:  # a bug must not stop the thread or hang a ticket
                log.exception("pool write job failed")
                if job.ticket is not None and not job.ticket.done():
                    job.ticket.fail(exc)
                if isinstance(job, PutJob):
                    self._removals.end_put(job.pkeys, [])

    # -- put ---------------------------------------------------------------------
    def _put(self, job: PutJob) -> None:
        stored = written = skipped = 0
        host_bytes = job.host.as_bytes()
        try:
            for start in range(0, len(job.rkeys), self._batch):
                keys = job.rkeys[start : start + self._batch]
                values = self._encode(job, start, len(keys), host_bytes)
                replies = self._link.run(lambda pipe: self._queue_puts(pipe, job.ns_key, keys, values))
                ok = True
                for reply in replies[1:]:
                    if isinstance(reply, Exception):  # e.g. OOM under noeviction
                        log.warning("pool put refused: %s", reply)
                        ok = False
                        break
                    stored += 1
                    written += reply is True
                    skipped += reply is not True
                if not ok:
                    self._counters.add(failed_ops=1)
                    break
        except PoolUnavailable:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        self._counters.add(puts=written, put_skipped=skipped, write_txns=1)
        job.ticket.finish(stored)
        self._removals.end_put(job.pkeys, job.pkeys[:stored])

    def _encode(
        self, job: PutJob, start: int, count: int, host_bytes: npt.NDArray[np.uint8]
    ) -> list[memoryview]:
        t = 0 if job.tokens is None else job.tokens.shape[1]
        info = b"" if job.meta is None else job.meta.info
        fkeys = job.fkeys[start : start + count]
        sizes = [record_bytes(key, t, host_bytes.shape[1], info) for key in fkeys]
        if len(self._staging) < sum(sizes):
            self._staging = bytearray(sum(sizes))
        view = memoryview(self._staging)
        values = []
        at = 0
        for j, (key, size) in enumerate(zip(fkeys, sizes)):
            i = start + j
            out = view[at : at + size]
            encode_record(
                out,
                key=key,
                ns_tag=job.ns_tag,
                tokens=None if job.tokens is None else job.tokens[i],
                kv=host_bytes[job.host_pages[i]],
                seq=self._seq,
                meta=job.meta,
                index=i,
            )
            self._seq += 1
            values.append(out)
            at += size
        return values

    def _queue_puts(
        self, pipe: object, ns_key: bytes, keys: list[bytes], values: list[memoryview]
    ) -> None:
        pipe.sadd(ns_key, *keys)  # type: ignore[attr-defined]
        for key, value in zip(keys, values):
            pipe.set(key, value, nx=True, ex=self._ttl)  # type: ignore[attr-defined]

    # -- delete / forget -------------------------------------------------------
    def _delete(self, job: DeleteJob) -> None:
        removed = self._delete_keys(job.rkeys, job.pkeys)
        if job.ticket is not None:
            self._counters.add(deleted=removed)
            job.ticket.finish(removed)

    def _delete_keys(self, rkeys: list[bytes], pkeys: list[bytes]) -> int:
        removed = 0
        gone: list[bytes] = []
        try:
            for start in range(0, len(rkeys), self._batch):
                chunk = rkeys[start : start + self._batch]
                replies = self._link.run(lambda pipe: [pipe.delete(k) for k in chunk])
                for j, reply in enumerate(replies):
                    if reply == 1:
                        removed += 1
                        gone.append(pkeys[start + j])
        except PoolUnavailable:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        self._removals.removed(gone)
        return removed

    def _forget(self, job: ForgetJob) -> None:
        removed = 0
        try:
            members: list[bytes] = self._link.run(lambda pipe: pipe.smembers(job.ns_key))[0]
            if isinstance(members, Exception):
                raise PoolUnavailable(f"reading the namespace index failed: {members}")
            rkeys = sorted(members)
            removed = self._delete_keys(rkeys, [k[job.cut :] for k in rkeys])
            self._link.run(lambda pipe: pipe.delete(job.ns_key))
        except PoolUnavailable as exc:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
            job.ticket.fail(exc)  # the namespace may still be in the pool: say so
            return
        self._counters.add(deleted=removed)
        job.ticket.finish(removed)


class PoolReader:
    """Serves ``get`` on ``num_readers`` threads."""

    def __init__(
        self,
        *,
        link: PoolLink,
        counters: Counters,
        writer: PoolWriter,
        batch_pages: int,
        num_readers: int,
        key_cut: int,
    ) -> None:
        self._cut = key_cut  # pool key[key_cut:] is the record key
        self._link = link
        self._counters = counters
        self._writer = writer  # deletes records that fail verification
        self._batch = batch_pages
        self._pool = ThreadPoolExecutor(num_readers, thread_name_prefix="radixcache-pool-read")
        self.unavailable = 0  # reads cut short because the pool was down

    def submit(
        self,
        rkeys: list[bytes],
        pkeys: list[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        ns_tag: bytes | None,
        ticket: FutureTicket,
    ) -> None:
        self._pool.submit(self._read, rkeys, pkeys, tokens, host, host_pages, ns_tag, ticket)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _read(
        self,
        rkeys: list[bytes],
        pkeys: list[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        ns_tag: bytes | None,
        ticket: FutureTicket,
    ) -> None:
        served = 0
        try:
            served, corrupt = self._read_pages(rkeys, tokens, host.as_bytes(), host_pages, ns_tag)
            if corrupt is not None:
                log.warning("pool record %s failed verification; deleting it", rkeys[corrupt].hex())
                self._writer.submit(DeleteJob([rkeys[corrupt]], [pkeys[corrupt]], None))
            self._counters.add(corrupt=corrupt is not None)
        except _Partial as exc:
            served = exc.served  # those pages were read and verified
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        except Exception:  # a bug must not hang the ticket: a miss, logged
            log.exception("pool read failed")
            self._counters.add(failed_ops=1)
        self._counters.add(hits=served, misses=len(rkeys) - served)
        ticket.finish(served)

    def _read_pages(
        self,
        rkeys: list[bytes],
        tokens: TokenPages | None,
        host_bytes: npt.NDArray[np.uint8],
        host_pages: HostPages,
        ns_tag: bytes | None,
    ) -> tuple[int, int | None]:
        """Returns (leading pages served, index of a record that failed its checks).

        Raises ``_Partial`` (with the pages served so far) when the pool is lost.
        """
        for start in range(0, len(rkeys), self._batch):
            chunk = rkeys[start : start + self._batch]
            try:
                values = self._link.run(lambda pipe: [pipe.get(k) for k in chunk])
            except PoolUnavailable as exc:
                raise _Partial(start) from exc
            for j, value in enumerate(values):
                i = start + j
                if not isinstance(value, bytes):  # gone (evicted, expired) or an error reply
                    return i, None
                if not verify_record(
                    value,
                    key=rkeys[i][self._cut :],
                    ns_tag=ns_tag,
                    tokens=None if tokens is None else tokens[i],
                    dst=host_bytes[host_pages[i]],
                ):
                    return i, i
        return len(rkeys), None


class _Partial(PoolUnavailable):
    """The pool went away after ``served`` leading pages were read."""

    def __init__(self, served: int) -> None:
        super().__init__(f"pool lost after {served} pages")
        self.served = served

"""The pool's write transport: the shared writer thread encodes, a sender thread sends.

    put / delete / forget  --> queue --> writer thread --> sender thread:
                                         (encoder: the    per send chunk (at most
                                         values of one    batch_pages pages, ~16 MiB):
                                         job, chunk by    [SADD ns-index shard values...]
                                         chunk)           [SET value NX EX ttl, GETRANGE...]

A put's pages are cut into values (offload/valkey/layout.py); each value is
the chunk head (values of several pages) and, per page, its record head
plus the host page itself: no KV byte is copied on the way out.

``SET NX``: a value already there is kept (another engine wrote the same
pages; its first 8 bytes, read back in the same round trip, say how many
pages it reaches back over, and a value that reaches back over fewer than
this put's is replaced by this one). A value whose page a reader refused
(offload/valkey/reader.py: ``Suspects``) is rewritten (``SET`` without NX).

Index before records: a put's SADDs open its pipeline, and each value's
index set lives on the value's own node (offload/valkey/layout.py), so a
connection lost half way leaves index entries without values (harmless);
a value whose SADD failed (on the rare set kept on another node) is
deleted again, so forget_namespace finds every value that stays.

Failures never escape a thread: a pool that is down, a node that is down or
a refused SET (out of memory under ``noeviction``: warned at most once per
30 s) ends a put with the pages stored so far; a forget fails its ticket
(the namespace may still be in the pool). Nothing here raises into the owner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.transfer.workers import DaemonPool
from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage import (
    Counters,
    DeleteJob,
    ForgetJob,
    HeldRemovalLog,
    JobWriter,
    PutJob,
    WriteJob,
)
from radixcache.offload.storage import chunk
from radixcache.offload.valkey.layout import Cuts, IndexSets, value_pages, wrote
from radixcache.offload.valkey.link import Command, PoolLink, PoolUnavailable
from radixcache.offload.valkey.nodes import Scattered
from radixcache.offload.valkey.removals import Suspects, ValueIndex

log = logging.getLogger(__name__)

_AHEAD = 4  # send chunks encoded ahead of the sender at most
# A send chunk holds at most this many KV bytes (and at least one value), so
# that the sender starts on the first chunk while the encoder checksums the
# next: 64 pages of 2 MiB in one chunk would be checksummed whole (~10 ms
# here) before the first byte went out. Each chunk costs one round trip.
_CHUNK_BYTES = 16 << 20
_DELETE_BATCH = 256  # values deleted per round trip


@dataclass(slots=True, eq=False)
class _Run:
    """One value of a put: pages ``start`` to ``end`` of the job."""

    start: int
    end: int
    key: bytes  # its pool key (the key prefix + the record key of its last page)
    value: Scattered
    rewrite: bool  # a reader refused a page of it: replace what is there


@dataclass(slots=True)
class _PutProgress:
    """A put job's send chunks so far (updated on the sender thread)."""

    pkeys: list[bytes]  # the job's page keys (for the removal log)
    stored: int = 0  # leading pages in the pool
    written: int = 0  # pages this put wrote
    wrote: list[bytes] = field(default_factory=list)  # page keys this put wrote (not found there)
    skipped: int = 0  # pages found there already
    stopped: bool = False  # a chunk failed: the later ones are not sent


class PoolWriter(JobWriter):
    """Runs put/delete/forget jobs in order, in two stages::

        queue --> writer thread: a put's values, chunk by chunk (checksums)
              --> sender thread: every network call, in job order; finishes
                                 the tickets

    so the values of chunk k+1 (or of the next put) are built while chunk k
    is on the wire. At most ``_AHEAD`` chunks wait for the sender.
    """

    def __init__(
        self,
        where: str,
        counters: Counters,
        removals: HeldRemovalLog,
        link: PoolLink,
        *,
        cuts: Cuts,
        values: ValueIndex,
        suspects: Suspects,
        check_first: bool,
        after_job: Callable[[], None],
    ) -> None:
        """``check_first``: ask which values are there before sending any
        (ranks that share one copy of every page); ``after_job``: called on
        the sender thread after each job (e.g. to refresh size figures)."""
        config = link.config
        self._link = link
        self._held = removals  # removals wait for the puts of their keys
        self._values = values
        self._suspects = suspects
        self._cuts = cuts
        self._check_first = check_first
        self._key_prefix = config.key_prefix  # pool key = key prefix + record key
        self._cut = len(config.key_prefix)  # pool key[cut:]: record key
        self._sets = IndexSets(config.namespace_shards)
        self._ttl = config.ttl_s
        self._batch = config.batch_pages  # pages per send chunk at most
        self._seq = time.time_ns() // 1000  # write seq of the next record: ordered across engines
        self._after_job = after_job
        self._refused = RateLimitedLog(log)  # puts refused by a full pool repeat
        self._ahead = threading.BoundedSemaphore(_AHEAD)
        self._sender = DaemonPool(1, "radixcache-pool-send")
        self.unavailable = 0  # jobs cut short because the pool (or a node) was down
        super().__init__(  # one job per step: a put pipelines its own chunks
            where, counters, removals, merge_pages=1, thread_name="radixcache-pool-write"
        )

    def submit(self, job: WriteJob) -> None:
        if isinstance(job, PutJob):
            self._held.begin_put(job.page_keys())
        super().submit(job)

    def close(self) -> None:
        """Run every job queued so far, then stop the threads."""
        super().close()
        self._sender.shutdown(wait=True)

    def _run_batch(self, batch: list[WriteJob]) -> None:
        for job in batch:
            if isinstance(job, PutJob):
                try:
                    self._put(job)
                except Exception as exc:  # a bug must not stop the thread or hang a ticket
                    self._send(self._fail, job, exc)
            elif isinstance(job, DeleteJob):
                self._send(self._delete, job)
            else:
                self._send(self._forget, job)

    def _send(self, step: Callable[..., None], *args: Any) -> None:
        """Queue ``step(*args)`` on the sender thread (in order; never raises there)."""
        self._ahead.acquire()

        def run() -> None:
            try:
                step(*args)
            except Exception as exc:  # a bug must not stop the sender or hang a ticket
                job = args[0]
                log.exception("pool write job failed")
                self._fail(job, exc)
            finally:
                self._ahead.release()

        self._sender.submit(run)

    def _fail(self, job: WriteJob, exc: Exception) -> None:
        self._fail_tickets([job], exc)
        if isinstance(job, PutJob):
            self._held.end_put(job.page_keys(), [])

    # -- put ---------------------------------------------------------------------
    def _put(self, job: PutJob) -> None:
        """Encode the job's values here, chunk by chunk; the sender sends them
        and finishes the job."""
        host_bytes = job.host.as_bytes()
        progress = _PutProgress(job.page_keys())
        page_bytes = max(1, int(host_bytes.shape[1]))
        runs = self._cuts.runs(job.keys, raw=job.tokens is None)
        per_chunk = max(1, min(self._batch, _CHUNK_BYTES // page_bytes))
        rewrite = self._suspects.take(job.keys)
        chunk_runs: list[_Run] = []
        pages = 0
        for k, (start, end) in enumerate(runs):
            value = self._encode(job, start, end, host_bytes)
            key = job.keys[end - 1]
            self._values.add(key, job.keys[start:end], job.ns_tag)
            suspect = any(page in rewrite for page in job.keys[start:end])
            chunk_runs.append(_Run(start, end, self._key_prefix + key, value, suspect))
            pages += end - start
            if pages >= per_chunk or k + 1 == len(runs):
                self._send(self._send_chunk, job, progress, chunk_runs, k + 1 == len(runs))
                chunk_runs, pages = [], 0

    def _encode(
        self, job: PutJob, start: int, end: int, host_bytes: npt.NDArray[np.uint8]
    ) -> Scattered:
        """The value of pages ``start`` to ``end``: the chunk head (several
        pages), then each record framed (or sealed) on its own, as its head
        and body: the host page itself in the clear (never copied; the caller
        leaves it untouched until the ticket is done), sealed its ciphertext."""
        parts: list[bytes | memoryview] = [chunk.chunk_head(end - start)] if end - start > 1 else []
        for i in range(start, end):
            kv = host_bytes[job.host_pages[i]]
            parts += job.encode_parts(i, self._seq, kv)  # (head, body)
            self._seq += 1
        if len(parts) > 2:  # the chunk head joins the first record head (one small buffer)
            parts[0:2] = [bytes(parts[0]) + bytes(parts[1])]
        return Scattered(*parts)

    def _send_chunk(
        self, job: PutJob, progress: _PutProgress, runs: list[_Run], last: bool
    ) -> None:
        if not progress.stopped:
            self._store(job, progress, runs)
        if last:
            self._counters.add(puts=progress.written, put_skipped=progress.skipped, write_txns=1)
            # what it wrote is on record before the ticket says done, so the
            # engine landing the put knows which pages to announce
            self._held.note_written(progress.wrote)
            job.ticket.finish(progress.stored)
            self._held.end_put(progress.pkeys, progress.pkeys[: progress.stored])
            self._done()

    def _store(self, job: PutJob, progress: _PutProgress, runs: list[_Run]) -> None:
        """Index, (check,) and SET one chunk's values in one round trip; add
        the outcome to ``progress``.

        Per value, ``before``: how many of its pages (from its end) a value
        already under its key covered; the pages before those are this put's
        to announce. A value there that reaches back over fewer pages than
        this put's is replaced in a second round trip. A value whose index
        entry could not be written (its set's node down) ends the put there,
        and is deleted again if it was written (best effort)."""
        sets = self._index_sets(job.ns_tag, runs)
        there = self._present(runs) if self._check_first else [0] * len(runs)
        commands: list[Command] = [("SADD", key, *members) for key, members in sets.items()]
        set_at = {key: i for i, key in enumerate(sets)}
        at: list[int] = []  # per run, where its replies start (-1: not sent)
        for run, found in zip(runs, there):
            if found >= run.end - run.start:
                at.append(-1)  # there already (checked first): nothing sent
                continue
            at.append(len(commands))
            head = ("GETRANGE", run.key, 0, chunk.PREFIX_BYTES - 1)
            if run.rewrite:  # what was there, then the value in its place
                commands += [head, ("SET", run.key, run.value, *self._expiry())]
            else:  # the value unless one is there (then, for several pages, what is)
                commands.append(("SET", run.key, run.value, "NX", *self._expiry()))
                commands += [head] if run.end - run.start > 1 else []
        nbytes = sum(run.value.nbytes for run, i in zip(runs, at) if i >= 0)
        replies = self._link.run(commands, nbytes=nbytes)
        before: list[int | None] = []  # per run; None: failed (the put stops there)
        short: list[_Run] = []
        orphans: list[bytes] = []
        for run, found, i in zip(runs, there, at):
            pages = run.end - run.start
            indexed = replies[set_at[self._sets.key(self._key_prefix, job.ns_tag, run.key)]]
            if not self._ok((indexed,)):
                if i >= 0 and (wrote(replies[i]) or run.rewrite):
                    orphans.append(run.key)  # written, but not in its namespace's index
                before.append(None)
                break
            if i < 0:
                before.append(pages)
                continue
            first = replies[i]
            second = replies[i + 1] if run.rewrite or pages > 1 else b"\x00" * chunk.PREFIX_BYTES
            if not self._ok((first, second)):
                before.append(None)
                break
            if run.rewrite:
                before.append(min(pages, value_pages(first)))
            elif wrote(first):
                before.append(0)
            else:
                covered = min(pages, value_pages(second))
                before.append(covered)
                if covered < pages:  # another engine's value there reaches back over fewer
                    short.append(run)
        if orphans:
            self._link.run([("DEL", key) for key in orphans])
        replaced = self._replace(short) if short else set()
        shorter = {id(run) for run in short}
        for run, had in zip(runs, before):
            if had is None or (id(run) in shorter and id(run) not in replaced):
                return _stop(progress)
            pages = run.end - run.start
            written = pages - had  # the leading pages no value covered before
            progress.written += written
            progress.skipped += pages - written
            progress.wrote.extend(progress.pkeys[run.start : run.start + written])
            progress.stored = run.end
        if len(before) < len(runs):
            _stop(progress)

    def _replace(self, runs: list[_Run]) -> set[int]:
        """SET values over shorter ones another engine left; ids of the runs done."""
        replies = self._link.run(
            [("SET", run.key, run.value, *self._expiry()) for run in runs],
            nbytes=sum(run.value.nbytes for run in runs),
        )
        done: set[int] = set()
        for run, reply in zip(runs, replies):
            if not wrote(reply):
                self._ok((reply,))
                break
            done.add(id(run))
        return done

    def _present(self, runs: list[_Run]) -> list[int]:
        """Pages each run's value reaches back over now (0: none, or unknown)."""
        replies = self._link.run([("GETRANGE", run.key, 0, chunk.PREFIX_BYTES - 1) for run in runs])
        return [value_pages(reply) for reply in replies]

    def _index_sets(self, ns_tag: bytes, runs: list[_Run]) -> dict[bytes, list[bytes]]:
        """The namespace index sets ``runs``' values go into, and their members."""
        sets: dict[bytes, list[bytes]] = {}
        for run in runs:
            sets.setdefault(self._sets.key(self._key_prefix, ns_tag, run.key), []).append(run.key)
        return sets

    def _ok(self, replies: Sequence[Any]) -> bool:
        """False (counted; a refusal warned, rate-limited) if a reply failed."""
        for reply in replies:
            if isinstance(reply, PoolUnavailable):
                self.unavailable += 1
                self._counters.add(failed_ops=1)
                return False
            if isinstance(reply, Exception):  # e.g. OOM under noeviction
                self._refused.warning("pool put refused: %s", reply)
                self._counters.add(failed_ops=1)
                return False
        return True

    def _expiry(self) -> tuple[Any, ...]:
        return () if self._ttl is None else ("EX", self._ttl)

    # -- delete / forget -------------------------------------------------------
    def _delete(self, job: DeleteJob) -> None:
        rkeys = self._values.holding(job.keys)
        removed = self._delete_values([self._key_prefix + k for k in rkeys])
        if job.ticket is not None:
            self._counters.add(deleted=removed)
            job.ticket.finish(removed)
        self._done()

    def _delete_values(self, vkeys: list[bytes]) -> int:
        """DEL the values ``vkeys`` (pool keys); returns the pages they held."""
        removed = 0
        gone: list[bytes] = []
        for start in range(0, len(vkeys), _DELETE_BATCH):
            part = vkeys[start : start + _DELETE_BATCH]
            commands: list[Command] = []
            for key in part:
                commands.append(("GETRANGE", key, 0, chunk.PREFIX_BYTES - 1))
                commands.append(("DEL", key))
            replies = self._link.run(commands)
            for k, key in enumerate(part):
                head, deleted = replies[2 * k], replies[2 * k + 1]
                if isinstance(deleted, PoolUnavailable):
                    self.unavailable += 1
                    self._counters.add(failed_ops=1)
                elif deleted == 1:
                    removed += max(1, value_pages(head))
                    gone.append(key[self._cut :])
        self._held.removed(self._values.removed(gone))
        return removed

    def _forget(self, job: ForgetJob) -> None:
        sets = self._sets.every(self._key_prefix, job.ns_tag)
        replies = self._link.run([("SMEMBERS", key) for key in sets])
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        members = sorted({m for reply in replies if isinstance(reply, (set, list)) for m in reply})
        removed = self._delete_values(members)
        cleared = self._link.run([("DEL", key) for key in sets]) if failed is None else []
        failed = failed or next((r for r in cleared if isinstance(r, Exception)), None)
        if failed is not None:
            self.unavailable += 1
            self._counters.add(failed_ops=1)
            job.ticket.fail(PoolUnavailable(f"reading the namespace index failed: {failed}"))
            return  # the namespace may still be in the pool: say so
        self._counters.add(deleted=removed)
        job.ticket.finish(removed)
        self._done()

    def _done(self) -> None:
        """After a job, on the sender thread: trim the index, then ``after_job``."""
        self._trim()
        self._after_job()

    def _trim(self) -> None:
        """Take the values this process saw removed out of their namespace's
        index sets (best effort: what fails stays listed until a forget)."""
        gone = self._values.take_trims()
        if gone:
            pkeys = [(self._key_prefix + key, tag) for key, tag in gone]
            self._link.run([
                ("SREM", self._sets.key(self._key_prefix, tag, pkey), pkey) for pkey, tag in pkeys
            ])  # fmt: skip



def _stop(progress: _PutProgress) -> None:
    progress.stopped = True

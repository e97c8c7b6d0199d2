"""One send chunk of a put: its index entries, tags and values, in one or two round trips.

The writer's sender thread (offload/valkey/writer.py) hands each chunk of
a put to ``ChunkSender.store``::

    [SADD ns-index shard values...] [SADD tag-set ns (first chunk)]
    [SET value NX PX ms, GETRANGE...]           one round trip, or, for a
                                                tenant with a byte limit:
    [EVAL quota script per node]                a second one (lifetime/quotas.py)

and learns what the put stored: per value, how many of its pages a value
already there covered (those are not this put's to announce), which values
to replace (shorter ones another engine left), and where the put stops (a
node down, an index entry lost, a value over its tenant's limit, the
put's retention deadline passed: lifetime/retention.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage import Counters, PutJob
from radixcache.offload.storage import chunk
from radixcache.offload.storage import record as rec
from radixcache.offload.valkey.layout import IndexSets, value_pages, wrote
from radixcache.offload.valkey.lifetime.forget import PoolRemover
from radixcache.offload.valkey.lifetime.quotas import (
    DROPPED,
    WROTE,
    QuotaBook,
    QuotaReply,
    QuotaValue,
    TenantLimits,
)
from radixcache.offload.valkey.lifetime.retention import Retention
from radixcache.offload.valkey.lifetime.tags import TagSets
from radixcache.offload.valkey.link import Command, PoolLink, PoolUnavailable
from radixcache.offload.valkey.nodes import Scattered

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Run:
    """One value of a put: pages ``start`` to ``end`` of the job."""

    start: int
    end: int
    key: bytes  # its pool key (the key prefix + the record key of its last page)
    value: Scattered
    rewrite: bool  # a reader refused a page of it: replace what is there
    seq: int  # the write seq of its last record (its place in a tenant's write order)


@dataclass(slots=True)
class PutProgress:
    """A put job's send chunks so far (updated on the sender thread)."""

    pkeys: list[bytes]  # the job's page keys (for the removal log)
    seqs: tuple[int, int]  # the write seqs of its first and last record
    stored: int = 0  # leading pages in the pool
    written: int = 0  # pages this put wrote
    wrote: list[bytes] = field(default_factory=list)  # page keys this put wrote (not found there)
    skipped: int = 0  # pages found there already
    stopped: bool = False  # a chunk failed: the later ones are not sent
    tagged: bool = False  # its tags are recorded (sent with its first chunk)

class ChunkSender:
    """Stores a put's chunks (see the module docstring); the sender thread calls it."""

    def __init__(
        self,
        link: PoolLink,
        counters: Counters,
        remover: PoolRemover,
        *,
        sets: IndexSets,
        tags: TagSets,
        limits: TenantLimits,
        quotas: QuotaBook,
    ) -> None:
        config = link.config
        self._link = link
        self._counters = counters
        self._remover = remover
        self._sets = sets
        self._tags = tags
        self._limits = limits
        self._quotas = quotas
        self._retention = Retention(config.ttl_s, config.clock)
        self._key_prefix = config.key_prefix  # pool key = key prefix + record key
        self._cut = len(config.key_prefix)  # pool key[cut:]: record key
        self._refused = RateLimitedLog(log)  # puts refused by a full pool repeat
        self.unavailable = 0  # puts cut short because the pool (or a node) was down
        self.past_deadline = 0  # pages not written: their retention deadline had passed

    def present(self, runs: list[Run]) -> list[int]:
        """Pages each run's value reaches back over now (0: none, or unknown)."""
        replies = self._link.run([("GETRANGE", run.key, 0, chunk.PREFIX_BYTES - 1) for run in runs])
        return [value_pages(reply) for reply in replies]

    def store(self, job: PutJob, progress: PutProgress, runs: list[Run], there: list[int]) -> None:
        """Index and SET one chunk's values (``there``: per run, the pages a
        value there reaches back over, when checked first; else 0); add the
        outcome to ``progress``. One round trip; two for a tenant with a limit (the
        index first, then the quota script: offload/valkey/lifetime/quotas.py).

        Per value, ``before``: how many of its pages (from its end) a value
        already under its key covered; the pages before those are this put's
        to announce. A value there that reaches back over fewer pages than
        this put's is replaced in a second round trip. A value whose index
        entry (or the put's tag entries) could not be written (a node down)
        ends the put there, and is deleted again if it was written (best
        effort). A put past its retention deadline, or a value over its
        tenant's limit, ends the put there too (counted, per tenant)."""
        meta = job.meta
        ms = self._retention.expiry_ms(None if meta is None else meta.expires_at)
        if ms is None:
            self.past_deadline += len(job.keys) - progress.stored
            self._limits.count(job.tenant, past=len(job.keys) - progress.stored)
            return stop(progress)
        limit = self._limits.limit(job.tenant)
        sets = self._index_sets(job.ns_tag, runs)
        commands: list[Command] = [("SADD", key, *members) for key, members in sets.items()]
        set_at = {key: i for i, key in enumerate(sets)}
        tags_at = len(commands)
        if meta is not None and meta.tags and not progress.tagged:
            commands += self._tags.adds(meta.tags, job.ns_tag)
        sent = [found < run.end - run.start for run, found in zip(runs, there)]
        if limit is None:
            replies, answers = self._send_values(commands, runs, sent, ms)
        else:  # the index first: a value the script writes is indexed
            replies = self._link.run(commands)
            answers = [None if not s else _NOT_INDEXED for s in sent]
            if not any(isinstance(r, Exception) for r in replies):
                answers = self._quota_values(job, limit, runs, sent, ms, progress)
        tagged = self._ok(replies[tags_at:])  # counted once if not
        progress.tagged = progress.tagged or tagged
        before: list[int | None] = []  # per run; None: failed (the put stops there)
        short: list[Run] = []
        orphans: list[bytes] = []
        dropped = False
        for run, answer in zip(runs, answers):
            pages = run.end - run.start
            indexed_run = replies[set_at[self._sets.key(self._key_prefix, job.ns_tag, run.key)]]
            if not tagged or not self._ok((indexed_run,)):
                if isinstance(answer, tuple) and (wrote(answer[0]) or run.rewrite):
                    orphans.append(run.key)  # written, but not in its namespace's index
                before.append(None)
                break
            if answer is None:
                before.append(pages)  # there already (checked first): nothing sent
                continue
            if answer is _DROPPED or answer is _NOT_INDEXED or not self._ok(answer):
                dropped = answer is _DROPPED
                before.append(None)
                break
            set_reply, head = answer
            if run.rewrite:
                before.append(min(pages, value_pages(head)))
            elif wrote(set_reply):
                before.append(0)
            else:
                covered = min(pages, value_pages(head))
                before.append(covered)
                if covered < pages:  # another engine's value there reaches back over fewer
                    short.append(run)
        if orphans:
            self._link.run([("DEL", key) for key in orphans])
        replaced = self._replace(job, short, ms, progress, limit) if short else set()
        shorter = {id(run) for run in short}
        for run, had in zip(runs, before):
            if had is None or (id(run) in shorter and id(run) not in replaced):
                break
            pages = run.end - run.start
            written = pages - had  # the leading pages no value covered before
            progress.written += written
            progress.skipped += pages - written
            progress.wrote.extend(progress.pkeys[run.start : run.start + written])
            progress.stored = run.end
        else:
            if len(before) == len(runs):
                return
        if dropped:
            self._limits.count(job.tenant, dropped=len(job.keys) - progress.stored)
        stop(progress)

    def _send_values(
        self, commands: list[Command], runs: list[Run], sent: list[bool], ms: int
    ) -> tuple[list[Any], list[Any]]:
        """Send the index ``commands`` and the runs' SETs (those ``sent``) in
        one round trip; the index replies and, per run, None (not sent) or
        (SET reply, head of the value there before: for several pages)."""
        at: list[int] = []
        indexing = len(commands)
        expiry = Retention.args(ms)
        for run, send in zip(runs, sent):
            at.append(len(commands) if send else -1)
            if not send:
                continue
            head = ("GETRANGE", run.key, 0, chunk.PREFIX_BYTES - 1)
            if run.rewrite:  # what was there, then the value in its place
                commands += [head, ("SET", run.key, run.value, *expiry)]
            else:  # the value unless one is there (then, for several pages, what is)
                commands.append(("SET", run.key, run.value, "NX", *expiry))
                commands += [head] if run.end - run.start > 1 else []
        nbytes = sum(run.value.nbytes for run, send in zip(runs, sent) if send)
        replies = self._link.run(commands, nbytes=nbytes)
        answers: list[Any] = []
        for run, i in zip(runs, at):
            if i < 0:
                answers.append(None)
            elif run.rewrite:
                answers.append((replies[i + 1], replies[i]))
            else:
                many = run.end - run.start > 1
                answers.append((replies[i], replies[i + 1] if many else _ONE_PAGE_HEAD))
        return replies[:indexing], answers

    def _quota_values(
        self, job: PutJob, limit: int, runs: list[Run], sent: list[bool], ms: int,
        progress: PutProgress,
    ) -> list[Any]:  # fmt: skip
        """Write the runs ``sent`` through the quota script; per run, None (not
        sent), (SET reply, head before), ``_DROPPED`` or the error."""
        chosen = [run for run, send in zip(runs, sent) if send]
        values = [QuotaValue(run.key, run.value, run.rewrite, run.seq) for run in chosen]
        replies = self._store_quota(job, limit, values, ms, progress)
        by_run = {id(run): reply for run, reply in zip(chosen, replies)}
        return [_answer(by_run[id(run)]) if send else None for run, send in zip(runs, sent)]

    def _store_quota(
        self, job: PutJob, limit: int, values: list[QuotaValue], ms: int, progress: PutProgress
    ) -> list[QuotaReply | Exception]:
        """``QuotaBook.store``, with its evictions reported and counted."""
        replies, gone, _stale = self._quotas.store(job.tenant, limit, values, ms, progress.seqs)
        if gone:
            mine = self._key_prefix + job.keys[0][: rec.FINGERPRINT_BYTES]
            self._remover.report([k[self._cut :] for k in gone if k.startswith(mine)])
            self._counters.add(evicted=len(gone))
            self._limits.count(job.tenant, evicted=len(gone))
        return replies

    def _replace(
        self, job: PutJob, runs: list[Run], ms: int, progress: PutProgress, limit: int | None
    ) -> set[int]:
        """SET values over shorter ones another engine left; ids of the runs done."""
        if limit is not None:
            values = [QuotaValue(run.key, run.value, True, run.seq) for run in runs]
            answers = [_answer(r) for r in self._store_quota(job, limit, values, ms, progress)]
            replies = [a[0] if isinstance(a, tuple) else a for a in answers]
        else:
            replies = self._link.run(
                [("SET", run.key, run.value, *Retention.args(ms)) for run in runs],
                nbytes=sum(run.value.nbytes for run in runs),
            )
        done: set[int] = set()
        for run, reply in zip(runs, replies):
            if not wrote(reply):
                if reply is not _DROPPED:
                    self._ok((reply,))
                break
            done.add(id(run))
        return done

    def _index_sets(self, ns_tag: bytes, runs: list[Run]) -> dict[bytes, list[bytes]]:
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
            if isinstance(reply, Exception):  # e.g. OOM under noeviction, a script refused
                self._refused.warning("pool put refused: %s", reply)
                self._counters.add(failed_ops=1)
                return False
        return True

_DROPPED = object()  # a value over its tenant's limit: not written
_NOT_INDEXED = object()  # a value not sent: the index entries of its chunk failed
_ONE_PAGE_HEAD = b"\x00" * chunk.PREFIX_BYTES  # a one-page value: covers its one page


def _answer(reply: QuotaReply | Exception) -> Any:
    """A quota script's reply as the plain path's (SET reply, head before)."""
    if isinstance(reply, Exception):
        return (reply, reply)
    if reply.outcome == DROPPED:
        return _DROPPED
    return (b"OK" if reply.outcome == WROTE else None, reply.head or _ONE_PAGE_HEAD)


def stop(progress: PutProgress) -> None:
    progress.stopped = True

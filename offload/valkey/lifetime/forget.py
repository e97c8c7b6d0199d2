"""Values leaving the pool on request: deletes, forgotten namespaces, invalidated tags.

Runs on the writer's sender thread (offload/valkey/writer.py), in job order
with the puts:

* ``delete``: the values holding the job's pages (this process's value
  index knows which value holds a page; a page's own key otherwise) are
  deleted, each with a look at its head first (how many pages it held);
* ``forget``: the namespace's index sets (``namespace_shards`` of them,
  one per slot range, and the one set of older pools) are read, every
  value they list is deleted, then the sets themselves;
* ``invalidate``: every namespace a tag's set lists is forgotten, then
  those members leave the set (offload/valkey/lifetime/tags.py).

Every value deleted is reported as a removal (``HeldRemovalLog``) and its
pages counted as ``deleted``, as the server's own removals are when
keyspace notifications arrive. A node that is down fails a forget's or an
invalidation's ticket (the namespace may still be in the pool: the caller
is told); a delete counts what it could delete.
"""

from __future__ import annotations

from typing import Any

from radixcache.offload.storage import Counters, DeleteJob, ForgetJob, HeldRemovalLog, TagJob
from radixcache.offload.storage import chunk
from radixcache.offload.valkey.layout import IndexSets, value_pages
from radixcache.offload.valkey.lifetime.tags import TagSets
from radixcache.offload.valkey.link import Command, PoolLink, PoolUnavailable
from radixcache.offload.valkey.lifetime.removals import ValueIndex

DELETE_BATCH = 256  # values deleted per round trip


class PoolRemover:
    """Deletes, forgets and invalidates for one writer (see the module docstring)."""

    def __init__(
        self,
        link: PoolLink,
        counters: Counters,
        removals: HeldRemovalLog,
        values: ValueIndex,
        sets: IndexSets,
        tags: TagSets,
    ) -> None:
        self._link = link
        self._counters = counters
        self._held = removals
        self._values = values
        self._sets = sets
        self._tags = tags
        self._key_prefix = link.config.key_prefix  # pool key = key prefix + record key
        self._cut = len(self._key_prefix)
        self.unavailable = 0  # jobs cut short because a node was down

    def delete(self, job: DeleteJob) -> None:
        rkeys = self._values.holding(job.keys)
        removed = self.delete_values([self._key_prefix + k for k in rkeys])
        if job.ticket is not None:
            self._counters.add(deleted=removed)
            job.ticket.finish(removed)

    def delete_values(self, vkeys: list[bytes]) -> int:
        """DEL the values ``vkeys`` (pool keys), reporting each one gone;
        returns the pages they held."""
        removed = 0
        gone: list[bytes] = []
        for start in range(0, len(vkeys), DELETE_BATCH):
            part = vkeys[start : start + DELETE_BATCH]
            commands: list[Command] = []
            for key in part:
                commands.append(("GETRANGE", key, 0, chunk.PREFIX_BYTES - 1))
                commands.append(("DEL", key))
            replies = self._link.run(commands)
            for k, key in enumerate(part):
                head, deleted = replies[2 * k], replies[2 * k + 1]
                if isinstance(deleted, PoolUnavailable):
                    self._failed()
                elif deleted == 1:
                    removed += max(1, value_pages(head))
                    gone.append(key[self._cut :])
        self.report(gone)
        return removed

    def report(self, gone: list[bytes]) -> None:
        """Values ``gone`` (record keys) left the pool: their pages are removals."""
        if gone:
            self._held.removed(self._values.removed(gone))

    def forget(self, job: ForgetJob) -> None:
        try:
            removed = self._forget(job.ns_tag)
        except PoolUnavailable as exc:
            job.ticket.fail(exc)  # the namespace may still be in the pool: say so
            return
        self._counters.add(deleted=removed)
        job.ticket.finish(removed)

    def _forget(self, ns_tag: bytes) -> int:
        """Delete every value of namespace ``ns_tag`` and its index sets;
        returns the pages removed. Raises PoolUnavailable if an index set
        could not be read or cleared."""
        sets = self._sets.every(self._key_prefix, ns_tag)
        replies = self._link.run([("SMEMBERS", key) for key in sets])
        failed = _first_error(replies)
        members = sorted({m for reply in replies if isinstance(reply, (set, list)) for m in reply})
        removed = self.delete_values(members)
        if failed is None:
            failed = _first_error(self._link.run([("DEL", key) for key in sets]))
        if failed is not None:
            self._failed()
            raise PoolUnavailable(f"reading the namespace index failed: {failed}")
        return removed

    def invalidate(self, job: TagJob) -> None:
        """Forget every namespace of ``job.tag``'s set, then take them out of it."""
        key = self._tags.key(job.tag)
        reply = self._link.run([("SMEMBERS", key)])[0]
        if isinstance(reply, Exception):
            self._failed()
            job.ticket.fail(PoolUnavailable(f"reading the tag's set failed: {reply}"))
            return
        members = sorted(reply)
        removed = 0
        try:
            for ns_tag in members:
                removed += self._forget(ns_tag)
        except PoolUnavailable as exc:
            job.ticket.fail(exc)  # the set still lists every namespace: a retry finds them
            return
        if members:
            cleared = self._link.run([("SREM", key, *members)])[0]
            if isinstance(cleared, Exception):
                self._failed()  # forgotten already; a later call forgets them again (harmless)
        self._counters.add(deleted=removed)
        job.ticket.finish(removed)

    def trim(self) -> None:
        """Take the values this process saw removed out of their namespace's
        index sets (best effort: what fails stays listed until a forget)."""
        gone = self._values.take_trims()
        if gone:
            pkeys = [(self._key_prefix + key, tag) for key, tag in gone]
            self._link.run([
                ("SREM", self._sets.key(self._key_prefix, tag, pkey), pkey) for pkey, tag in pkeys
            ])  # fmt: skip

    def _failed(self) -> None:
        self.unavailable += 1
        self._counters.add(failed_ops=1)


def _first_error(replies: list[Any]) -> Exception | None:
    return next((r for r in replies if isinstance(r, Exception)), None)

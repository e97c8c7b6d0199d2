"""Forgotten namespaces below the device: epochs, and deletions storage owes.

``forget_namespace(ns)`` promises that no page of ``ns`` cached before the
call is served again (invariant 9). Below the device that takes two things:

* an **epoch** per namespace (how many times it was forgotten), stamped on
  every job at submission: a job of an older epoch lands nowhere;
* the deletion of the namespace's **stored records**. When storage cannot
  delete them (a storage error, a failed ticket), their keys are still
  those a new request of the namespace would look up (keys bind tokens and
  namespace, not the epoch), so the namespace is **blocked**: it is never
  fetched from storage while the deletion is owed. Each ``poll`` retries it
  without waiting (one deletion in flight per namespace); ``close`` makes a
  last, waiting attempt and logs what storage still holds (a later process
  on the same store could serve it).

``Forgets`` belongs to one ``HostTiers``; owner thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from radixcache.namespace import Namespace
from radixcache.offload.storage import Storage
from radixcache.transfer import Ticket

log = logging.getLogger(__name__)

Failed = Callable[[str, BaseException], None]  # counts and logs a failed storage call
K = TypeVar("K", Namespace, str)  # what a deletion is owed for: a namespace, a tag


class Forgets:
    """Epochs of forgotten namespaces and the storage deletions still owed."""

    def __init__(self, storage: Callable[[], Storage], failed: Failed) -> None:
        self._storage = storage  # the tier's storage now (tests may swap it)
        self._failed = failed
        self._epochs: dict[Namespace, int] = {}  # forgets per namespace
        self.owed: dict[Namespace, Ticket | None] = {}  # deletions owed; their retry in flight
        self.owed_tags: dict[str, Ticket | None] = {}  # tag invalidations owed (see ``invalidate``)

    def epoch(self, namespace: Namespace) -> int:
        """How many times ``namespace`` was forgotten (stamped on jobs)."""
        return self._epochs.get(namespace, 0)

    def may_land(self, namespace: Namespace, epoch: int) -> bool:
        """Whether a job started at ``epoch`` may still add pages of ``namespace``."""
        return self._epochs.get(namespace, 0) == epoch

    def blocked(self, namespace: Namespace) -> bool:
        """Storage may still hold pages of ``namespace`` from before a forget
        (or, while a tag invalidation is owed, of any namespace)."""
        return namespace in self.owed or bool(self.owed_tags)

    def invalidate(self, tag: str) -> None:
        """Remove every record storage holds under ``tag`` and wait. If that
        fails, it is owed: no page is fetched from storage at all (the tag's
        namespaces are not all known here) until a ``poll`` retried it."""
        self.owed_tags.pop(tag, None)
        if self._finished(tag, self._start_tag(tag), wait=True) is False:
            self.owed_tags[tag] = None

    def _start_tag(self, tag: str) -> Ticket | None:
        try:
            return self._storage().invalidate_tag(tag)
        except Exception as exc:
            self._failed("invalidating a tag in storage", exc)
            return None

    def bump(self, namespace: Namespace) -> None:
        """``namespace`` is forgotten: jobs in flight for it land nowhere."""
        self._epochs[namespace] = self._epochs.get(namespace, 0) + 1

    def delete(self, namespace: Namespace) -> None:
        """Delete ``namespace``'s records from storage and wait; owed if that fails."""
        self.owed.pop(namespace, None)
        if self._finished(namespace, self._start(namespace), wait=True) is False:
            self.owed[namespace] = None

    def retry(self) -> None:
        """Go on with the owed deletions without waiting (called by ``poll``)."""
        self._retry(self.owed, self._start)
        self._retry(self.owed_tags, self._start_tag)

    def _retry(self, owed: dict[K, Ticket | None], start: Callable[[K], Ticket | None]) -> None:
        for what, ticket in list(owed.items()):
            if ticket is None:
                owed[what] = start(what)
                continue
            done = self._finished(what, ticket, wait=False)
            if done is True:
                del owed[what]
            elif done is False:
                owed[what] = None  # failed: start again at the next poll

    def settle(self) -> None:
        """A last, waiting attempt at every owed deletion (at close)."""
        for namespace, ticket in list(self.owed.items()):
            if ticket is None:
                ticket = self._start(namespace)
            if self._finished(namespace, ticket, wait=True):
                del self.owed[namespace]
            else:
                log.error(
                    "storage still holds pages of forgotten namespace %r: a later cache on "
                    "this store may serve them; forget it again there", namespace,
                )
        for tag, ticket in list(self.owed_tags.items()):
            if self._finished(tag, ticket if ticket is not None else self._start_tag(tag), wait=True):
                del self.owed_tags[tag]
            else:
                log.error("storage still holds records tagged %r: a later cache on this "
                          "store may serve them; invalidate the tag again there", tag)

    def _start(self, namespace: Namespace) -> Ticket | None:
        try:
            return self._storage().forget_namespace(namespace.digest())
        except Exception as exc:
            self._failed("forgetting a namespace in storage", exc)
            return None

    def _finished(self, what: Namespace | str, ticket: Ticket | None, wait: bool) -> bool | None:
        """True: deleted; False: failed (counted); None: still running."""
        if ticket is None:
            return False
        if wait:
            ticket.wait()
        elif not ticket.done():
            return None
        if ticket.error is not None:
            action = "invalidating a tag" if isinstance(what, str) else "forgetting a namespace"
            self._failed(f"{action} in storage", ticket.error)
            return False
        return True

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

from radixcache.namespace import Namespace
from radixcache.offload.storage import Storage
from radixcache.transfer import Ticket

log = logging.getLogger(__name__)

Failed = Callable[[str, BaseException], None]  # counts and logs a failed storage call


class Forgets:
    """Epochs of forgotten namespaces and the storage deletions still owed."""

    def __init__(self, storage: Callable[[], Storage], failed: Failed) -> None:
        self._storage = storage  # the tier's storage now (tests may swap it)
        self._failed = failed
        self._epochs: dict[Namespace, int] = {}  # forgets per namespace
        self.owed: dict[Namespace, Ticket | None] = {}  # deletions owed; their retry in flight

    def epoch(self, namespace: Namespace) -> int:
        """How many times ``namespace`` was forgotten (stamped on jobs)."""
        return self._epochs.get(namespace, 0)

    def may_land(self, namespace: Namespace, epoch: int) -> bool:
        """Whether a job started at ``epoch`` may still add pages of ``namespace``."""
        return self._epochs.get(namespace, 0) == epoch

    def blocked(self, namespace: Namespace) -> bool:
        """Storage may still hold pages of ``namespace`` from before a forget."""
        return namespace in self.owed

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
        for namespace, ticket in list(self.owed.items()):
            if ticket is None:
                self.owed[namespace] = self._start(namespace)
                continue
            done = self._finished(namespace, ticket, wait=False)
            if done is True:
                del self.owed[namespace]
            elif done is False:
                self.owed[namespace] = None  # failed: start again at the next poll

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

    def _start(self, namespace: Namespace) -> Ticket | None:
        try:
            return self._storage().forget_namespace(namespace.digest())
        except Exception as exc:
            self._failed("forgetting a namespace in storage", exc)
            return None

    def _finished(self, namespace: Namespace, ticket: Ticket | None, wait: bool) -> bool | None:
        """True: deleted; False: failed (counted); None: still running."""
        if ticket is None:
            return False
        if wait:
            ticket.wait()
        elif not ticket.done():
            return None
        if ticket.error is not None:
            self._failed("forgetting a namespace in storage", ticket.error)
            return False
        return True

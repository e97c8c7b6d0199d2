"""What happens to objects that own threads, locks or file descriptors when
the process forks.

``fork()`` copies the memory of the process but only the calling thread:
in the child, a copy engine's worker, a store's writer and reader threads
and a publisher's thread are gone, so any ticket handed out there would
never finish, and a lock held through an inherited descriptor (``flock``)
stays held until the child closes its copy. Such objects register here
with ``on_fork_in_child(owner, handler)``: in every child forked after
that, ``handler(owner)`` runs before the child does anything else (from
``os.register_at_fork``). A handler only marks the owner unusable and
closes the child's copies of descriptors; it must not release anything the
parent still uses (no ``flock(LOCK_UN)``, no thread join, no commit).

Owners are held weakly: registering keeps nothing alive.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["forked_message", "on_fork_in_child"]

log = logging.getLogger(__name__)

_handlers: weakref.WeakKeyDictionary[Any, list[Callable[[Any], None]]] = weakref.WeakKeyDictionary()


def on_fork_in_child(owner: Any, handler: Callable[[Any], None]) -> None:
    """Run ``handler(owner)`` in every child forked from now on, while
    ``owner`` is alive. ``handler`` must not hold ``owner`` itself (pass a
    function of it, not a bound method of it, or it is never collected)."""
    _handlers.setdefault(owner, []).append(handler)


def forked_message(what: str, owner_pid: int) -> str:
    """The error text for a use of ``what`` in a forked child."""
    return (
        f"{what} was created in process {owner_pid}; this is process {os.getpid()}, a child "
        f"forked from it, where its threads and locks do not exist: create a new one here"
    )


def _after_fork_in_child() -> None:
    for owner, handlers in list(_handlers.items()):
        for handler in handlers:
            try:
                handler(owner)
            except Exception:  # a handler must not stop the child, nor the other handlers
                log.exception("fork handler of %r failed", type(owner).__name__)


os.register_at_fork(after_in_child=_after_fork_in_child)

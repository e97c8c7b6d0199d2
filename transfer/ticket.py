"""Tickets: the handle every piece of asynchronous work returns.

A ticket is created by the owner thread when it submits work and is finished
exactly once by whoever does the work (a worker thread, or a CUDA event that
the ticket polls). The owner observes it with ``done()`` / ``wait()`` and reads
``error`` / ``result()``; it never blocks unless it calls ``wait``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Ticket(Protocol):
    """What the owner thread may ask of any in-flight operation."""

    def done(self) -> bool:
        """True once the work finished, successfully or not. Never blocks."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds (forever if None); True if done."""
        ...

    @property
    def error(self) -> BaseException | None:
        """The exception the work failed with, or None (also while running)."""
        ...

    def result(self) -> Any:
        """The work's result; raises its error if it failed. Call after done()."""
        ...


class FutureTicket:
    """A ticket finished by a worker thread through ``finish``/``fail``."""

    __slots__ = ("_event", "_error", "_result")

    def __init__(self) -> None:
        self._event = threading.Event()  # set once, when the work has ended
        self._error: BaseException | None = None  # failure, if any
        self._result: Any = None  # value handed over by the worker

    @classmethod
    def completed(cls, result: Any = None) -> FutureTicket:
        """A ticket that is already done (for work that needed no thread)."""
        ticket = cls()
        ticket.finish(result)
        return ticket

    @classmethod
    def failed(cls, error: BaseException) -> FutureTicket:
        """A ticket that already failed with ``error``."""
        ticket = cls()
        ticket.fail(error)
        return ticket

    # -- worker side -------------------------------------------------------
    def finish(self, result: Any = None) -> None:
        """Mark the work done with ``result``. Exactly once."""
        assert not self._event.is_set(), "ticket finished twice"
        self._result = result
        self._event.set()

    def fail(self, error: BaseException) -> None:
        """Mark the work failed with ``error``. Exactly once."""
        assert not self._event.is_set(), "ticket finished twice"
        self._error = error
        self._event.set()

    # -- owner side --------------------------------------------------------
    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        if not self._event.is_set():
            raise RuntimeError("ticket is not done yet; call wait() first")
        if self._error is not None:
            raise self._error
        return self._result

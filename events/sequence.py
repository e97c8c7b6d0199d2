"""Sequence numbers that never go backwards across restarts of an engine.

A consumer (NVIDIA Dynamo's indexer, our ``EventSubscriber``) tracks the
last sequence number it applied per worker and ignores numbers it has seen.
A restarted engine that started again from 0 would be ignored until it passed
its previous incarnation's count, and its ``AllBlocksCleared`` never applied.
So each incarnation starts above anything the previous one can have used:

clock base
    The first number is the wall clock in microseconds since the epoch
    (about 1.8e15, far below 2**63). An incarnation that started at clock
    ``T0`` and published ``N`` batches reached ``T0 + N``; its successor
    starts at ``T1 > T0 + (seconds it ran) * 1e6``. So numbers only go back
    if an engine published more than a million batches per second over its
    whole life (engines publish one batch per step: hundreds to thousands
    per second), or if the wall clock is set back between the two.

persisted reservation (``seq_file``, optional)
    Against a clock set back, the source writes ``next + 2**20`` to a small
    file when it starts and each time it crosses that mark (once per 2**20
    batches: the write stays off the hot path), and a new incarnation starts
    at ``max(clock, the file's number)``. Keep the file beside the storage
    the engine restarts on.

Only the owner thread calls ``take``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RESERVE = 1 << 20  # numbers reserved per write of the sequence file
LIMIT = 1 << 62  # a base beyond this is refused (leaves 2**62 numbers of room)


def clock_base() -> int:
    """Microseconds since the epoch: the default first number of an incarnation."""
    return time.time_ns() // 1_000


class SequenceSource:
    """Hands out consecutive sequence numbers from a restart-safe base."""

    __slots__ = ("_next", "_path", "_reserved", "first")

    def __init__(self, base: int | None = None, path: str | os.PathLike[str] | None = None) -> None:
        start = clock_base() if base is None else base
        self._path = Path(path) if path is not None else None
        if self._path is not None:
            start = max(start, self._read(self._path))
        if not 0 <= start < LIMIT:
            raise ValueError(f"sequence base {start} is outside [0, 2**62)")
        self.first = start  # the number of this incarnation's first batch
        self._next = start
        self._reserved = start
        if self._path is not None:
            self._reserve()

    @property
    def next(self) -> int:
        """The number the next ``take`` returns."""
        return self._next

    def take(self) -> int:
        """The next number (owner thread)."""
        seq = self._next
        self._next = seq + 1
        if self._path is not None and self._next >= self._reserved:
            self._reserve()
        return seq

    @staticmethod
    def _read(path: Path) -> int:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return 0
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"sequence file {str(path)!r} holds {text[:40]!r}, not an integer") from None

    def _reserve(self) -> None:
        assert self._path is not None
        self._reserved = self._next + RESERVE
        tmp = self._path.with_name(self._path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(f"{self._reserved}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)

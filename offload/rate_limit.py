"""Warnings that repeat under load, logged at most once per interval.

A storage tier that cannot write (a full disk, a failing device) fails every
batch; one log line per batch would flood the log (about 1,500 lines per 500
requests were seen). ``RateLimitedLog`` logs the first occurrence at once,
then at most one line per ``interval_s``, saying how many it held back.
Callable from any thread.
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """``warning`` that logs at most once per ``interval_s`` seconds."""

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self._log = logger
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last = float("-inf")  # monotonic time of the last line logged
        self.suppressed = 0  # held back since the last line logged
        self.total = 0  # every call, logged or not

    def warning(self, message: str, *args: object) -> bool:
        """Log ``message % args`` unless a line went out less than
        ``interval_s`` ago; True if it was logged."""
        now = time.monotonic()
        with self._lock:
            self.total += 1
            if now - self._last < self.interval_s:
                self.suppressed += 1
                return False
            held, self.suppressed, self._last = self.suppressed, 0, now
        if held:
            self._log.warning(
                message + " (%d more like this in the last %.0f s)", *args, held, self.interval_s
            )
        else:
            self._log.warning(message, *args)
        return True

"""A value's expiry in the pool: the config's TTL, never past the put's retention deadline.

A put may carry a deadline (``PutMeta.expires_at``, wall-clock seconds as
``time.time()``; the cache derives it from the tenant's ``ttl_s``). Every
value the put writes gets an expiry of at most that deadline: ``PX`` with
``min(ttl_s, deadline - now)`` in whole milliseconds, rounded down, so the
server drops the value by the deadline and never serves it after. The
remaining time is measured on the writer's clock (``ValkeyConfig.clock``)
when the values are sent, and given to the server as a relative time, so a
server whose clock differs from the engine's still expires them on time.

A put whose deadline has passed (less than a millisecond left) writes
nothing: its pages are counted (``PoolStats.past_deadline``) and its ticket
says how many leading pages were stored before (none, or those of chunks
sent in time).
"""

from __future__ import annotations

import math
from typing import Any

from radixcache.offload.storage.contract import Clock

NO_EXPIRY: tuple[Any, ...] = ()


class Retention:
    """Expiry arguments of SET for the values of a put (see the module docstring)."""

    def __init__(self, ttl_s: int | None, clock: Clock) -> None:
        self._ttl_ms = None if ttl_s is None else ttl_s * 1000
        self._clock = clock

    def expiry_ms(self, deadline: float | None) -> int | None:
        """Milliseconds a value written now may live (0: no expiry), or None
        when ``deadline`` has passed: the value must not be written."""
        if deadline is None:
            return 0 if self._ttl_ms is None else self._ttl_ms
        left = math.floor((deadline - self._clock()) * 1000.0)
        if left < 1:
            return None
        return left if self._ttl_ms is None else min(left, self._ttl_ms)

    @staticmethod
    def args(ms: int) -> tuple[Any, ...]:
        """SET's expiry arguments for ``ms`` (0: none)."""
        return ("PX", ms) if ms else NO_EXPIRY

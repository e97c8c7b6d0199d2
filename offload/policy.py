"""Write and prefetch policies: small strategy objects, chosen by name.

Write policies decide *when* a device page gets a host copy:

* ``write_through``: as soon as it is inserted;
* ``write_through_selective``: once its node has been hit ``threshold`` times;
* ``write_back``: only when it is evicted from the device (the eviction waits
  for the copy).

With storage enabled, every complete host copy is written on to storage,
whatever the write policy.

Prefetch policies decide how long a request waits for pages that are still
being loaded (from host or storage) before it recomputes them instead:

* ``best_effort``: not at all; use what has arrived when the runner asks;
* ``wait_complete``: until everything arrived (or failed);
* ``timeout``: up to ``base_s + per_token_s * tokens`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class WritePolicy(Protocol):
    """When a device page gets a host copy. Pure decisions; no side effects."""

    @property
    def name(self) -> str: ...

    def backup_on_insert(self) -> bool:
        """Back a node up as soon as its pages are inserted."""
        ...

    def backup_on_hit(self, hit_count: int) -> bool:
        """Back a node up now that it has been hit ``hit_count`` times."""
        ...

    def backup_on_evict(self) -> bool:
        """Back a node up (and wait) before dropping its device pages."""
        ...


@dataclass(frozen=True, slots=True)
class WriteThrough:
    name: str = "write_through"

    def backup_on_insert(self) -> bool:
        return True

    def backup_on_hit(self, hit_count: int) -> bool:
        return False

    def backup_on_evict(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class WriteThroughSelective:
    threshold: int = 2  # hits before a node earns a host copy
    name: str = "write_through_selective"

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, int) or self.threshold < 1:
            raise ValueError(f"write_through_selective threshold must be >= 1, got {self.threshold!r}")

    def backup_on_insert(self) -> bool:
        return False

    def backup_on_hit(self, hit_count: int) -> bool:
        return hit_count >= self.threshold

    def backup_on_evict(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class WriteBack:
    name: str = "write_back"

    def backup_on_insert(self) -> bool:
        return False

    def backup_on_hit(self, hit_count: int) -> bool:
        return False

    def backup_on_evict(self) -> bool:
        return True


_WRITE: dict[str, Callable[..., WritePolicy]] = {
    "write_through": WriteThrough,
    "write_through_selective": WriteThroughSelective,
    "write_back": WriteBack,
}


def write_policy_names() -> list[str]:
    """The registered write policies, sorted (e.g. for a command line's choices)."""
    return sorted(_WRITE)


def make_write_policy(name: str, **options: int) -> WritePolicy:
    """A write policy by name; options go to its constructor (e.g. ``threshold``)."""
    try:
        factory = _WRITE[name]
    except KeyError:
        raise ValueError(f"unknown write policy {name!r}; choose one of {sorted(_WRITE)}") from None
    try:
        return factory(**options)
    except TypeError as err:
        raise ValueError(f"write policy {name!r} does not take {sorted(options)}: {err}") from None


class PrefetchPolicy(Protocol):
    """How long a request waits for pages still on their way."""

    @property
    def name(self) -> str: ...

    def wait_seconds(self, tokens: int) -> float | None:
        """Seconds to wait for ``tokens`` tokens in flight; None means until done."""
        ...


@dataclass(frozen=True, slots=True)
class BestEffort:
    name: str = "best_effort"

    def wait_seconds(self, tokens: int) -> float | None:
        return 0.0


@dataclass(frozen=True, slots=True)
class WaitComplete:
    name: str = "wait_complete"

    def wait_seconds(self, tokens: int) -> float | None:
        return None


@dataclass(frozen=True, slots=True)
class Timeout:
    base_s: float = 0.002  # fixed allowance per request
    per_token_s: float = 2e-7  # plus this much per token in flight
    name: str = "timeout"

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.per_token_s < 0:
            raise ValueError(
                f"timeout budgets must be >= 0, got base_s={self.base_s}, per_token_s={self.per_token_s}"
            )

    def wait_seconds(self, tokens: int) -> float | None:
        return self.base_s + self.per_token_s * tokens


_PREFETCH: dict[str, Callable[..., PrefetchPolicy]] = {
    "best_effort": BestEffort,
    "wait_complete": WaitComplete,
    "timeout": Timeout,
}


def prefetch_policy_names() -> list[str]:
    """The registered prefetch policies, sorted (e.g. for a command line's choices)."""
    return sorted(_PREFETCH)


def make_prefetch_policy(name: str, **options: float) -> PrefetchPolicy:
    """A prefetch policy by name; options go to its constructor."""
    try:
        factory = _PREFETCH[name]
    except KeyError:
        raise ValueError(
            f"unknown prefetch policy {name!r}; choose one of {sorted(_PREFETCH)}"
        ) from None
    try:
        return factory(**options)
    except TypeError as err:
        raise ValueError(f"prefetch policy {name!r} does not take {sorted(options)}: {err}") from None

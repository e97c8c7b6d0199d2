"""Benchmarks, each printing one JSON object with ratios against a baseline
measured in the same run: ``python -m radixcache.cli.bench NAME [--quick]``.

A run whose figures are not the measurement (``--quick`` sizes, or a machine
busy with other work when it started) says so in a ``"note"`` field, and its
pass/fail verdicts are marked as indicative (``with_note``, ``verdict``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# Load average per core above which a run is taken as loaded (its absolute
# figures drift with the other work; same-run ratios hold better).
LOADED_PER_CORE = 0.5


def run_note(quick: bool) -> str | None:
    """Why this run's figures are not the measurement, or None when they are."""
    reasons = []
    if quick:
        reasons.append("a --quick smoke run (small sizes, few repeats)")
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        load = 0.0
    cores = os.cpu_count() or 1
    if load > LOADED_PER_CORE * cores:
        reasons.append(f"the machine was loaded (load average {load:.2f} on {cores} cores)")
    if not reasons:
        return None
    return "not the measurement: " + " and ".join(reasons) + "; run without --quick on a quiet machine"


def verdict(ok: bool, note: str | None) -> str:
    """``"pass"``/``"fail"``, marked indicative when ``note`` says the run is not the measurement."""
    word = "pass" if ok else "fail"
    return word if note is None else f"{word} (indicative only: see note)"


def with_note(report: dict[str, Any], note: str | None) -> dict[str, Any]:
    """``report`` with a leading ``"note"`` when the run is not the measurement."""
    return report if note is None else {"note": note, **report}


def timed(run: Callable[[], None], setup: Callable[[], None] | None = None) -> float:
    """Seconds ``run()`` takes (after an untimed ``setup()``, if given)."""
    if setup is not None:
        setup()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def rate(nbytes: int, pages: int, runs: list[float]) -> dict[str, Any]:
    """Rates of the median run; every run's seconds are kept to show the spread."""
    seconds = statistics.median(runs)
    return {
        "gb_per_s": round(nbytes / seconds / 1e9, 3),
        "pages_per_s": round(pages / seconds, 1),
        "seconds": round(seconds, 4),
        "runs_s": [round(t, 4) for t in runs],
    }


def pin_cores(value: str, error: Callable[[str], Any]) -> tuple[int, int] | None:
    """``--cores`` of a two-process benchmark: ``auto`` (the first two usable
    cores, None with fewer), ``none``, or ``A,B``; ``error`` reports a bad value."""
    if value == "none":
        return None
    if value == "auto":
        usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        return (usable[0], usable[1]) if len(usable) >= 2 else None
    try:
        a, b = (int(x) for x in value.split(","))
    except ValueError:
        error(f"--cores needs two core numbers like 0,1, got {value!r}")
        raise
    return a, b

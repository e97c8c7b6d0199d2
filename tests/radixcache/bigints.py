"""Ints too long for Python to print, in generated test data.

Python refuses to convert an int of more than 4,300 digits to text, and
hypothesis prints what it generates (and pytest the parameters of a failing
test). ``HUGE`` stands for such an int (``10**5000``) in generated data;
``unmark`` turns it into the int where the test uses it."""

from __future__ import annotations

from typing import Any


class _Huge:
    """Stands for an int of 5,000 digits in generated data: Python refuses
    to repr such an int (the 4,300-digit limit), and hypothesis reprs what
    it generates. ``unmark`` turns it into the int."""

    def __repr__(self) -> str:
        return "10**5000"


HUGE = _Huge()


def unmark(value: Any) -> Any:
    """``value`` with ``HUGE`` (also inside tuples and lists) replaced by 10**5000."""
    if value is HUGE:
        return 10**5000
    if isinstance(value, (tuple, list)):
        return type(value)(unmark(v) for v in value)
    return value

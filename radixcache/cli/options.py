"""Argparse value types shared by every subcommand: each checks one kind of
value and, when it is wrong, raises ``ArgumentTypeError`` with a message that
names the value; argparse then reports ``argument --x: <message>`` on one line.

    add("--device-pages", type=positive_int, default=384, help=...)
"""

from __future__ import annotations

import argparse
import json
from urllib.parse import urlsplit
import math
from typing import Any


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def power_of_two(text: str) -> int:
    """A positive power of two (page sizes)."""
    value = positive_int(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    value = _float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def positive_int_list(text: str) -> list[int]:
    """Comma-separated integers >= 1, e.g. ``8,32``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return [positive_int(p) for p in parts]


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given inline, e.g. ``'{"enable_kv_cache_events": true}'``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(
            f"malformed JSON: {err.msg} at column {err.colno} of {text!r}"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object ({{...}}), got {type(value).__name__}: {text!r}"
        )
    return value


AUTO_POOL = "valkey://auto"  # a scratch pool the command starts (and stops) itself
AUTO_CLUSTER = "valkey://auto?cluster=true"  # ... a scratch 3-node cluster


def storage_url(text: str) -> str:
    """A storage backend as ``TierConfig(storage=...)`` takes it: an LMDB
    directory or ``lmdb://`` URL, a ``valkey://``/``valkeys://``/``redis://``/
    ``rediss://`` pool URL, or ``valkey://auto`` with the pool URL's options
    (e.g. ``valkey://auto?cluster=true&chunk_pages=16``).
    Checked here, returned as given; messages show the URL with its password
    as ``***``."""
    from radixcache.offload import storage_config

    parts = urlsplit(text.strip())
    if parts.scheme.lower() == "valkey" and parts.netloc.lower() == "auto":  # options of a scratch pool
        try:
            storage_config(f"valkey://127.0.0.1?{parts.query}" if parts.query else "valkey://127.0.0.1")
        except (ValueError, TypeError) as err:
            raise argparse.ArgumentTypeError(str(err).replace("127.0.0.1", "auto")) from None
        return text.strip()
    try:
        storage_config(text)
    except (ValueError, TypeError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text

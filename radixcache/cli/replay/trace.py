"""Mooncake traces: reading the JSONL lines, and the tokens a line stands for.

A line names a request's prompt by block hashes (one id per 512-token block,
the last block possibly short); ``prompt_tokens`` turns every id into a fixed
run of pseudo-random tokens (a function of the id and the position in the
block only), so equal ids give equal tokens and equal prefixes share pages.
``radixcache.cli.replay.run`` replays the requests through the cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.cli.replay.presets import BLOCK_SIZE
from radixcache.tokens import TokenArray

_KEYS = ("input_length", "output_length", "hash_ids")  # required on every line


class TraceError(ValueError):
    """A trace that is not valid Mooncake JSONL; the message names the line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One trace line."""

    line: int  # 1-based line number in the trace file
    input_length: int  # prompt tokens
    output_length: int  # generated tokens
    hash_ids: npt.NDArray[np.int64]  # one id per prompt block (the last may be partial)


def _id_limit(block_size: int) -> int:
    """Ids below this keep every prompt input ``id * block_size + j`` below 2**63."""
    return (1 << 63) // block_size


def _int_field(rec: dict[str, Any], key: str, lowest: int, where: str) -> int:
    value = rec[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        raise TraceError(f"{where}: {key} must be an int >= {lowest}, got {value!r}")
    return value


def parse_request(text: str, line: int, where: str, block_size: int = BLOCK_SIZE) -> TraceRequest:
    """Validate one JSON line; raises TraceError naming ``where`` (file:line)."""
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where}: malformed JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in _KEYS if k not in rec]
    if missing:
        raise TraceError(f"{where}: missing key(s) {', '.join(missing)}")
    ts = rec.get("timestamp", 0)
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise TraceError(f"{where}: timestamp must be a number, got {ts!r}")
    input_length = _int_field(rec, "input_length", 1, where)
    output_length = _int_field(rec, "output_length", 0, where)
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or not ids:
        raise TraceError(f"{where}: hash_ids must be a non-empty list of ints, got {ids!r:.60}")
    top = _id_limit(block_size)
    if not all(type(i) is int and 0 <= i < top for i in ids):
        bad = next(i for i in ids if not (type(i) is int and 0 <= i < top))
        raise TraceError(f"{where}: hash_ids must be ints in [0, {top}), got {bad!r}")
    lo, hi = (len(ids) - 1) * block_size + 1, len(ids) * block_size
    if not lo <= input_length <= hi:
        raise TraceError(
            f"{where}: input_length {input_length} does not match {len(ids)} hash_ids of "
            f"{block_size} tokens (expected {lo}..{hi})"
        )
    return TraceRequest(line, input_length, output_length, np.asarray(ids, dtype=np.int64))


def load_trace(
    path: str | os.PathLike[str], block_size: int = BLOCK_SIZE, limit: int | None = None
) -> list[TraceRequest]:
    """Parse a Mooncake JSONL trace (blank lines skipped), at most ``limit`` requests.

    Raises TraceError (a ValueError) with ``path:line`` for a bad line or an
    empty trace, OSError if the file cannot be read.
    """
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if text.strip():
                out.append(parse_request(text, n, f"{os.fspath(path)}:{n}", block_size))
    if not out:
        raise TraceError(f"{os.fspath(path)}: no requests")
    return out


# ---------------------------------------------------------------------- tokens
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_DECODE_DOMAIN = np.uint64(1 << 63)  # decode inputs have the top bit set, prompt inputs not


def _mix(x: npt.NDArray[np.uint64]) -> TokenArray:
    """splitmix64's finalizer, top 31 bits: a fixed, well-spread token per input."""
    x = x ^ (x >> np.uint64(30))
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(33)).astype(np.int32)


def prompt_tokens(req: TraceRequest, block_size: int = BLOCK_SIZE) -> TokenArray:
    """The prompt of ``req``: block ``b`` holds tokens mix(b * block_size + j),
    j < block_size; the last block is cut to what ``input_length`` leaves."""
    ids = req.hash_ids.astype(np.uint64) * np.uint64(block_size)
    pos = (ids[:, None] + np.arange(block_size, dtype=np.uint64)).ravel()
    return _mix(pos[: req.input_length])


def decode_tokens(index: int, n: int) -> TokenArray:
    """``n`` generated tokens for request ``index``: unique to it, never in a prompt."""
    base = _DECODE_DOMAIN | (np.uint64(index) << np.uint64(32))
    return _mix(base + np.arange(n, dtype=np.uint64))


# ---------------------------------------------------------------------- config

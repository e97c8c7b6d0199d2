"""The memory floor under the tree benchmark's lookups and insert.

Whatever else a cache does, ``admit`` copies the prompt into memory it owns
(a runner reuses its ``input_ids`` buffer, radixcache/tokens.py) and checks
its sign, and a hit compares every cached token with the prompt's: the
prompt is read once, its copy written once, and the cached tokens read
once. An insert also keeps the new pages' tokens, in memory the process
has not touched before while the tree grows (a page fault per 4 KiB).

The floor does exactly that and nothing else, with the fastest calls this
installation has (the compiled core's copy and compare; numpy's on the
pure-Python path), and is timed interleaved with the figures it sits under
(``tree_targets``), so the same cache state and the same machine drift
fall on both. A figure minus its floor is bookkeeping; a bound below its
floor cannot be met by a cache that copies the prompt and compares tokens.
The cached tokens the floor compares with are a copy of the prompt's
pages of their own, as cold as the tree's own keys after the other side's
turn.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from radixcache.native import compiled as native_core  # None on the pure-Python path

P = 16  # tokens per page (the benchmark's page size)

IMPLEMENTATION = "numpy" if native_core is None else "compiled"


def _copy(tokens: np.ndarray) -> np.ndarray:
    """The owned copy with its sign checked, as ``as_tokens(copy=True)`` takes it."""
    if native_core is not None:
        out = native_core.owned_tokens(tokens)
        if out is None:
            raise ValueError("negative token id")
        return out
    out = tokens.copy()
    if out.size and out.min() < 0:
        raise ValueError("negative token id")
    return out


def _same(cached: np.ndarray, tokens: np.ndarray) -> int:
    """How many leading tokens agree (whole pages), as the tree compares."""
    if native_core is not None:
        return native_core.common_len(cached, tokens, 0, cached.size, P)
    return cached.size if np.array_equal(cached, tokens[: cached.size]) else 0


def cached_tokens(prompt: np.ndarray) -> np.ndarray:
    """A full hit's cached tokens for ``prompt``: its whole pages but the
    last token (always computed), in memory of their own."""
    usable = prompt.size - 1
    return prompt[: usable - usable % P].copy()


def lookup(prompts: list[np.ndarray], hit: bool) -> Callable[[int], object]:
    """The floor of ``admit`` + ``release`` of ``prompts[i % len]``: the copy,
    and on a hit the compare with its cached tokens (a miss compares at most
    one page, which is noise here)."""
    cached = [cached_tokens(p) for p in prompts] if hit else []
    n = len(prompts)

    def floor(i: int) -> object:
        own = _copy(prompts[i % n])
        return _same(cached[i % n], own) if hit else own

    return floor


def insert(prompts: list[np.ndarray], shared: int) -> tuple[Callable[[int], object], list[np.ndarray]]:
    """The floor of inserting ``prompts[i]`` whose first ``shared`` tokens
    are cached: the copy, the compare of the shared part, and a kept copy of
    the new tokens (returned list: it grows as the tree's keys do)."""
    kept: list[np.ndarray] = []
    cached = [p[:shared].copy() for p in prompts]

    def floor(i: int) -> object:
        own = _copy(prompts[i])
        _same(cached[i], own)
        kept.append(_copy(own[shared:]))
        return own

    return floor, kept

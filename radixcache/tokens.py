"""Token validation at the public boundary.

Tokens arrive as numpy integer arrays, CPU torch tensors or Python sequences.
They are checked once here (1-D, integer, 0 <= id < 2**31) and become int32
numpy arrays; everything behind this boundary trusts them. An int32 numpy
array passes without a copy; lists are converted (slow for long prompts: pass
arrays on hot paths).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

TOKEN_DTYPE = np.int32
MAX_TOKEN_ID = 2**31 - 1

TokenArray = npt.NDArray[np.int32]
TokensLike = npt.NDArray[np.integer] | torch.Tensor | Sequence[int]


def as_tokens(tokens: object, what: str = "tokens") -> TokenArray:
    """Validate ``tokens`` and return them as a 1-D int32 array.

    Raises TypeError for non-integer input and ValueError for wrong shapes or
    ids outside ``[0, 2**31)``.
    """
    if (
        type(tokens) is np.ndarray
        and tokens.dtype == TOKEN_DTYPE
        and tokens.ndim == 1
        and tokens.flags.c_contiguous
    ):
        # The hot path: int32 ids cannot exceed MAX_TOKEN_ID, so one pass
        # (the sign) is the whole check, and the array is used as it is.
        if tokens.size and int(tokens.min()) < 0:
            raise ValueError(
                f"{what}: token id out of range [0, {MAX_TOKEN_ID}]: min {int(tokens.min())}"
            )
        return tokens
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif isinstance(tokens, torch.Tensor):
        if tokens.device.type != "cpu":
            raise ValueError(f"{what}: tensor must be on the CPU, got {tokens.device}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(f"{what}: tensor must hold integers, got {tokens.dtype}")
        arr = tokens.detach().contiguous().numpy()
    elif isinstance(tokens, (list, tuple, range)):
        if len(tokens) == 0:
            return np.empty(0, dtype=TOKEN_DTYPE)
        for t in tokens:
            if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
                raise TypeError(f"{what}: token ids must be ints, got {type(t).__name__} {t!r}")
        arr = np.asarray(tokens)
        if arr.dtype == object:
            raise ValueError(f"{what}: token id out of range [0, {MAX_TOKEN_ID}]")
    else:
        raise TypeError(
            f"{what}: expected a numpy array, a CPU torch tensor or a list of ints, "
            f"got {type(tokens).__name__}"
        )
    if arr.ndim != 1:
        raise ValueError(f"{what}: must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: must hold integers, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > MAX_TOKEN_ID:
            raise ValueError(
                f"{what}: token id out of range [0, {MAX_TOKEN_ID}]: min {lo}, max {hi}"
            )
    if arr.dtype != TOKEN_DTYPE or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=TOKEN_DTYPE)
    return arr

"""Token validation at the public boundary.

Tokens arrive as numpy integer arrays, CPU torch tensors or Python sequences.
They are checked once here (1-D, integer, 0 <= id < 2**31) and become int32
numpy arrays; everything behind this boundary trusts them.

``as_tokens(..., copy=True)`` returns memory the cache owns: never a view of
the caller's array or tensor (a runner reuses one ``input_ids`` buffer for
every step; a view of it would change under the cache). An int32 numpy array
costs one memcpy then (about a microsecond for 4k tokens) and one pass for
the sign; other integer dtypes, non-contiguous views and tensors are
converted in one numpy pass; lists are converted element by element (slow
for long prompts: pass arrays on hot paths). Without ``copy`` (a read-only
lookup such as ``peek``) an int32 array is used as it is.

A masked array is refused: its masked entries hold values that are no token
ids (``np.ma.array([5, -1], mask=[0, 1])`` keeps the -1 underneath), and
which of ``compressed()`` (drop them) or ``filled(x)`` (replace them) the
caller meant is theirs to say.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from radixcache.native import compiled as native_core  # None on the pure-Python path

TOKEN_DTYPE = np.int32
MAX_TOKEN_ID = 2**31 - 1

TokenArray = npt.NDArray[np.int32]
TokensLike = npt.NDArray[np.integer] | torch.Tensor | Sequence[int]


def _out_of_range(what: str, lo: int, hi: int) -> ValueError:
    return ValueError(f"{what}: token id out of range [0, {MAX_TOKEN_ID}]: min {lo}, max {hi}")


def as_tokens(tokens: object, what: str = "tokens", *, copy: bool = False) -> TokenArray:
    """Validate ``tokens`` and return them as a 1-D, C-contiguous int32 array.

    With ``copy`` the result never shares memory with ``tokens``. Raises
    TypeError for non-integer input (masked arrays included) and ValueError
    for wrong shapes, GPU tensors or ids outside ``[0, 2**31)``. Nothing is
    validated per token in Python except for lists and tuples.
    """
    # The hot path, a 1-D C-contiguous int32 array: int32 ids cannot exceed
    # MAX_TOKEN_ID, so one pass (the sign) is the whole check. The copy is
    # taken first and checked: what is validated is what the cache keeps.
    if copy and _owned is not None and type(tokens) is np.ndarray:
        owned = _owned(tokens)  # the shape checks, the copy and the sign in one C call
        if owned is None:
            raise _out_of_range(what, int(tokens.min()), int(tokens.max()))
        if owned is not NotImplemented:
            return owned
    if (
        type(tokens) is np.ndarray
        and tokens.dtype == TOKEN_DTYPE
        and tokens.ndim == 1
        and tokens.flags.c_contiguous
    ):
        arr = tokens.copy() if copy else tokens
        if arr.size:
            lo = int(arr.min())
            if lo < 0:
                raise _out_of_range(what, lo, int(arr.max()))
        return arr
    owned = False  # whether ``arr`` is already memory of our own
    if isinstance(tokens, np.ma.MaskedArray):
        raise TypeError(
            f"{what}: a masked array is refused (its masked entries are no token ids); "
            f"pass tokens.compressed() or tokens.filled(value)"
        )
    if isinstance(tokens, np.ndarray):
        arr = np.asarray(tokens)  # a plain ndarray view (memmap and other subclasses)
    elif isinstance(tokens, torch.Tensor):
        if tokens.device.type != "cpu":
            raise ValueError(f"{what}: tensor must be on the CPU, got {tokens.device}")
        dtype = tokens.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"{what}: tensor must hold integers, got {dtype}")
        try:
            arr = tokens.detach().numpy()  # a view of the tensor's memory, any strides
        except (TypeError, RuntimeError) as exc:  # quantized and other non-numpy dtypes
            raise TypeError(f"{what}: tensor must hold plain integers, got {dtype}: {exc}") from None
    elif isinstance(tokens, (list, tuple, range)):
        if len(tokens) == 0:
            return np.empty(0, dtype=TOKEN_DTYPE)
        for t in tokens:
            if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
                raise TypeError(f"{what}: token ids must be ints, got {type(t).__name__} {t!r}")
        try:
            arr = np.asarray(tokens)
        except OverflowError:
            raise ValueError(f"{what}: token id out of range [0, {MAX_TOKEN_ID}]") from None
        if arr.dtype == object:
            raise ValueError(f"{what}: token id out of range [0, {MAX_TOKEN_ID}]")
        owned = True
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
            raise _out_of_range(what, lo, hi)
    out = np.ascontiguousarray(arr, dtype=TOKEN_DTYPE)  # the same array when nothing changes
    if copy and out is arr and not owned:
        out = out.copy()  # an int32 view of the caller's memory
    return out


# The compiled copy-and-check of the hot path (radixcache/native/_core.pyx
# ``owned_tokens``: the copy above, then its sign, in one pass); None on the
# pure-Python path.
_owned = None if native_core is None else native_core.owned_tokens

"""Exact-size page-locked (pinned) host memory.

``tensor.pin_memory()`` and ``torch.empty(..., pin_memory=True)`` go through
torch's caching host allocator, which rounds each request up to a power of two
and keeps freed blocks cached: a 40 GiB host pool would lock 64 GiB. The host
tier must take exactly the bytes configured, so this module asks CUDA for
exactly ``nbytes``:

1. with cupy installed: ``cudaHostAlloc`` through ``cupy.cuda.PinnedMemory``
   (not cupy's pinned memory *pool*, which caches and rounds as well);
2. otherwise: a plain host allocation of ``nbytes``, page-locked in place with
   ``cudaHostRegister`` (through ``torch.cuda.cudart()``) and unregistered when
   its tensor dies.

cupy is imported only when an allocation is made, never at module import.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

CUPY = "cupy.cuda.PinnedMemory"
HOST_REGISTER = "cudaHostRegister"


@dataclass(frozen=True, slots=True)
class PinnedBytes:
    """``nbytes`` of page-locked host memory as a ``uint8[nbytes]`` CPU tensor.

    The memory (and its registration) lives as long as ``tensor`` or any view
    of it; this record itself need not be kept.
    """

    tensor: torch.Tensor  # uint8[nbytes], page-locked
    backend: str  # CUPY or HOST_REGISTER


def _unregister(ptr: int) -> None:
    # Runs from a finalizer: never raise (the CUDA context may be gone).
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # best effort at teardown
        log.debug("cudaHostUnregister(%#x) failed", ptr, exc_info=True)


def _with_cupy(nbytes: int) -> PinnedBytes | None:
    try:
        import cupy
    except ImportError:
        return None
    mem = cupy.cuda.PinnedMemory(nbytes)  # cudaHostAlloc of exactly nbytes
    ptr = cupy.cuda.PinnedMemoryPointer(mem, 0)
    # The ndarray keeps ``ptr`` (and so ``mem``) alive; torch keeps the ndarray.
    array = np.ndarray((nbytes,), dtype=np.uint8, buffer=ptr)
    return PinnedBytes(torch.from_numpy(array), CUPY)


def _with_host_register(nbytes: int) -> PinnedBytes:
    array = np.empty(nbytes, dtype=np.uint8)  # plain malloc/mmap, exact size
    ptr = int(array.ctypes.data)
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))
    # torch's storage holds ``array`` until the last view of the tensor is gone,
    # and numpy runs weakref callbacks before it frees the memory, so the
    # registration ends exactly when the memory does. (A finalizer on the
    # tensor object would fire while views of it still use the memory.)
    finalizer = weakref.finalize(array, _unregister, ptr)
    finalizer.atexit = False  # at interpreter exit the process unpins everything anyway
    return PinnedBytes(torch.from_numpy(array), HOST_REGISTER)


def allocate_pinned(nbytes: int) -> PinnedBytes:
    """Exactly ``nbytes`` of zeroed page-locked host memory. Needs CUDA.

    Raises RuntimeError when CUDA is unavailable or refuses to pin.
    """
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("pinned host memory needs CUDA, which is not available")
    # torch reports memory pinned by someone else (cupy, cudaHostRegister) as
    # pinned only once its own CUDA state is up: without this, a process whose
    # first CUDA call is this allocation gets a buffer that ``is_pinned()``
    # calls pageable.
    torch.cuda.init()
    block = _with_cupy(nbytes)
    if block is None:
        block = _with_host_register(nbytes)
    block.tensor.zero_()
    log.debug("pinned %d B of host memory with %s", nbytes, block.backend)
    return block

"""Page-first host KV buffer (pinned on GPU machines).

    data[page] : [2 (K, V), num_layers, P, H, D]   one contiguous block per page

so a page is one copy and one LMDB value. ``as_bytes()`` views the same memory
as ``uint8[num_pages, page_bytes]`` for zero-copy I/O.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from radixcache.transfer.layout import KVSpec, _positive_int, available_bytes
from radixcache.transfer.pinned import allocate_pinned


class HostKVBuffer:
    """Host memory for ``num_pages`` whole pages in the page-first layout.

    ``pin`` asks for page-locked memory of exactly ``num_pages * page_bytes``
    bytes (only meaningful with CUDA; ignored without it). Pinned memory comes
    from ``transfer.pinned`` (cupy's ``cudaHostAlloc`` or ``cudaHostRegister``),
    never from torch's caching host allocator, which rounds up to a power of two.
    ``pin_backend`` names the mechanism used, or is None when not pinned.

    The buffer owns ``data``; whoever holds the matching host page ids (the host
    pool) decides who may write which page, and copy engines write only the
    pages named in a copy.
    """

    def __init__(self, spec: KVSpec, num_pages: int, pin: bool = False) -> None:
        _positive_int("num_pages", num_pages)
        self.spec = spec
        self.num_pages = num_pages
        need = num_pages * spec.page_bytes
        have = available_bytes(torch.device("cpu"))
        if need > have:
            raise MemoryError(
                f"host KV buffer of {num_pages} pages x {spec.page_bytes} B = {need} B "
                f"does not fit: {have} B of host memory available"
            )
        self.pinned = bool(pin and torch.cuda.is_available())
        self.pin_backend: str | None = None  # how the memory was pinned, if it was
        self.data = self._allocate(need)  # [num_pages, 2, L, P, H, D]

    def _allocate(self, nbytes: int) -> torch.Tensor:
        shape = (self.num_pages, *self.spec.host_page_shape)
        if not self.pinned:
            return torch.zeros(shape, dtype=self.spec.dtype)
        block = allocate_pinned(nbytes)  # exactly nbytes, zeroed
        self.pin_backend = block.backend
        return block.tensor.view(self.spec.dtype).view(shape)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page."""
        return self.spec.page_bytes

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.spec.page_bytes

    def as_bytes(self) -> npt.NDArray[np.uint8]:
        """The whole buffer as ``uint8[num_pages, page_bytes]`` (shares memory)."""
        flat = self.data.view(self.num_pages, -1).view(torch.uint8)
        return flat.numpy()

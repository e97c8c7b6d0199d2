"""KV layouts: the model's KV description and the device (layer-first) buffer.

Device layout, layer-first, as attention kernels read it::

    k[layer] : [num_pages, page_size, num_kv_heads, head_dim]   (same for v)
    stored as one tensor per K and V: [num_layers, num_pages, P, H, D]

Host layout (page-first, one contiguous block per page, used by the host pool
and as one LMDB value)::

    host[page] : [2 (K, V), num_layers, P, H, D]

A token at position ``pos`` of a request lives in slot
``page_table[pos // P] * P + pos % P`` of the flattened ``[num_pages * P, H, D]``
view of each layer.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

log = logging.getLogger(__name__)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class KVSpec:
    """One model's KV geometry. Immutable; validated on construction."""

    num_layers: int  # transformer layers holding KV
    num_kv_heads: int  # KV heads per layer (after GQA grouping, per TP rank)
    head_dim: int  # elements per head
    dtype: torch.dtype = torch.float16  # element type of K and V
    page_size: int = 16  # tokens per page (P); a positive power of two

    def __post_init__(self) -> None:
        _positive_int("num_layers", self.num_layers)
        _positive_int("num_kv_heads", self.num_kv_heads)
        _positive_int("head_dim", self.head_dim)
        if not isinstance(self.page_size, int) or isinstance(self.page_size, bool):
            raise ValueError(f"page_size must be an int, got {self.page_size!r}")
        if self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a positive power of two, got {self.page_size}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def page_shape(self) -> tuple[int, int, int]:
        """Shape of one page of one layer's K (or V): (P, H, D)."""
        return (self.page_size, self.num_kv_heads, self.head_dim)

    @property
    def layer_page_numel(self) -> int:
        """Elements in one page of one layer's K (or V)."""
        return self.page_size * self.num_kv_heads * self.head_dim

    @property
    def page_numel(self) -> int:
        """Elements in one whole page: K and V of every layer."""
        return 2 * self.num_layers * self.layer_page_numel

    @property
    def page_bytes(self) -> int:
        """Bytes of one whole page (K and V of every layer)."""
        return self.page_numel * self.itemsize

    @property
    def host_page_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one page in the page-first host layout."""
        return (2, self.num_layers, self.page_size, self.num_kv_heads, self.head_dim)

    def describe(self) -> str:
        """A stable text form (used in fingerprints and logs)."""
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"layers={self.num_layers},kv_heads={self.num_kv_heads},head_dim={self.head_dim},"
            f"dtype={dtype},page_size={self.page_size}"
        )


def resolve_device(requested: str | torch.device) -> torch.device:
    """``cuda`` when asked for and present, else ``cpu`` (logged)."""
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        log.warning("CUDA was requested but is not available; using the CPU")
        return torch.device("cpu")
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"unsupported device {requested!r}; use 'cuda' or 'cpu'")
    return dev


def available_bytes(device: torch.device) -> int:
    """Memory that an allocation on ``device`` can still take, best effort."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


class DeviceKVBuffer:
    """The device tier's KV storage: layer-first K and V for ``num_pages`` pages.

    Owned by the model runner's thread. The buffer itself knows nothing of
    which pages are in use; a ``PageAllocator`` does that.
    """

    def __init__(self, spec: KVSpec, num_pages: int, device: str | torch.device = "cpu") -> None:
        _positive_int("num_pages", num_pages)
        self.spec = spec
        self.device = resolve_device(device)
        self.num_pages = num_pages
        need = num_pages * spec.page_bytes
        have = available_bytes(self.device)
        if need > have:
            raise MemoryError(
                f"device KV buffer of {num_pages} pages x {spec.page_bytes} B = {need} B "
                f"does not fit: {have} B available on {self.device}"
            )
        shape = (spec.num_layers, num_pages, *spec.page_shape)
        self.k = torch.zeros(shape, dtype=spec.dtype, device=self.device)  # [L, N, P, H, D]
        self.v = torch.zeros(shape, dtype=spec.dtype, device=self.device)  # [L, N, P, H, D]

    @classmethod
    def from_bytes(
        cls, spec: KVSpec, nbytes: int, device: str | torch.device = "cpu"
    ) -> DeviceKVBuffer:
        """A buffer of as many whole pages as ``nbytes`` holds (at least one)."""
        pages = int(nbytes) // spec.page_bytes
        if pages <= 0:
            raise ValueError(
                f"{nbytes} B holds no page: one page is {spec.page_bytes} B ({spec.describe()})"
            )
        return cls(spec, pages, device)

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.spec.page_bytes

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, each ``[num_pages, P, H, D]`` (views, no copy)."""
        return self.k[layer], self.v[layer]

    def layer_slots(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer flattened to ``[num_pages * P, H, D]`` (views)."""
        spec = self.spec
        flat = (self.num_pages * spec.page_size, spec.num_kv_heads, spec.head_dim)
        return self.k[layer].view(flat), self.v[layer].view(flat)

    def slots(self, page_table: npt.ArrayLike, start: int, count: int) -> torch.Tensor:
        """Flat slot indices of token positions ``[start, start + count)``.

        ``page_table[i]`` is the page holding positions ``[i*P, (i+1)*P)``.
        """
        table = np.asarray(page_table, dtype=np.int64)
        pos = np.arange(start, start + count, dtype=np.int64)
        p = self.spec.page_size
        if count and (pos[-1] // p) >= table.size:
            raise ValueError(
                f"positions up to {start + count - 1} need {pos[-1] // p + 1} pages, "
                f"the page table has {table.size}"
            )
        slots = table[pos // p] * p + pos % p
        return torch.from_numpy(slots).to(self.device)

"""The page buffers and tickets of ``PageStore`` (radixcache.integrations.pagestore).

``RawPages`` is a caller-owned buffer of fixed-size chunks, seen as
``uint8[num_pages, page_bytes]`` without copying (the ``PageBuffer`` a
storage backend reads from and writes into); ``PageTicket`` is the handle of
one put or get, with per-key success once done. No engine imports.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from radixcache.transfer.ticket import Ticket

Slots = Sequence[int] | npt.NDArray[np.integer[Any]]  # chunk index per key


class RawPages:
    """A caller-owned buffer of ``num_pages`` chunks of ``page_bytes`` bytes each,
    seen as ``uint8[num_pages, page_bytes]`` without copying (a ``PageBuffer``).

    The caller owns the memory and keeps it alive while any ticket that names
    its chunks is running.
    """

    __slots__ = ("_pages", "num_pages")

    def __init__(self, buffer: Any, page_bytes: int) -> None:
        """``buffer``: anything with the buffer protocol (memoryview, bytearray,
        numpy array) or a CPU ``torch.Tensor``; C-contiguous, a whole number of
        pages long."""
        if not isinstance(page_bytes, int) or isinstance(page_bytes, bool) or page_bytes <= 0:
            raise ValueError(f"page_bytes must be a positive int, got {page_bytes!r}")
        if isinstance(buffer, torch.Tensor):
            if buffer.device.type != "cpu":
                raise ValueError(f"the page buffer must be in host memory, got {buffer.device}")
            buffer = buffer.detach().numpy()
        array = np.asarray(buffer)
        if not array.flags.c_contiguous:
            raise ValueError("the page buffer must be C-contiguous (one chunk after another)")
        flat = array.reshape(-1).view(np.uint8)
        if flat.size == 0 or flat.size % page_bytes:
            raise ValueError(
                f"the page buffer holds {flat.size} B: not a positive multiple of "
                f"page_bytes={page_bytes}"
            )
        self._pages = flat.reshape(-1, page_bytes)
        self.num_pages = int(self._pages.shape[0])

    @classmethod
    def from_pointer(cls, address: int, nbytes: int, page_bytes: int) -> RawPages:
        """Wrap ``nbytes`` of host memory at ``address`` (the caller keeps it alive)."""
        if not isinstance(address, int) or address <= 0:
            raise ValueError(f"address must be a positive int, got {address!r}")
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
        memory = (ctypes.c_uint8 * nbytes).from_address(address)
        return cls(np.frombuffer(memoryview(memory).cast("B"), dtype=np.uint8), page_bytes)

    @property
    def page_bytes(self) -> int:
        return int(self._pages.shape[1])

    def as_bytes(self) -> npt.NDArray[np.uint8]:
        return self._pages


class PageTicket:
    """The handle of one put or get: per-key success once done.

    The backend serves the LEADING keys of a call: keys ``[:n]`` succeeded and
    the rest did not (a miss, a failed check, no room, or an error).
    """

    __slots__ = ("_n", "_ticket")

    def __init__(self, ticket: Ticket, num_keys: int) -> None:
        self._ticket = ticket  # the backend's ticket; result: leading keys served
        self._n = num_keys

    def done(self) -> bool:
        return self._ticket.done()

    def wait(self, timeout: float | None = None) -> bool:
        return self._ticket.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        """The storage error the call failed with (every key then failed), or None."""
        return self._ticket.error

    def count(self) -> int:
        """How many leading keys succeeded (0 on an error). Call once done."""
        if not self._ticket.done():
            raise RuntimeError("ticket is not done yet; call wait() first")
        if self._ticket.error is not None:
            return 0
        return int(self._ticket.result())

    def results(self) -> list[bool]:
        """One bool per key, in call order. Call once done."""
        n = self.count()
        return [True] * n + [False] * (self._n - n)

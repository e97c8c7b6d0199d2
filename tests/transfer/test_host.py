"""HostKVBuffer: exactly the bytes configured, page-first, views share memory."""

from __future__ import annotations

import pytest
import torch

from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.pinned import CUPY, HOST_REGISTER, allocate_pinned

# 3 layers * 2 * 4 tokens * 3 heads * 5 dim * 2 B = 720 B per page: no power of two
ODD = KVSpec(num_layers=3, num_kv_heads=3, head_dim=5, dtype=torch.float16, page_size=4)


def test_takes_exactly_the_configured_bytes() -> None:
    host = HostKVBuffer(ODD, 7)
    assert ODD.page_bytes == 720
    assert host.nbytes == 7 * 720
    assert host.data.untyped_storage().nbytes() == 7 * 720
    assert host.data.shape == (7, 2, 3, 4, 3, 5)
    assert host.data.is_contiguous()
    assert not host.data.any()  # zeroed


def test_pages_are_contiguous_blocks_in_order() -> None:
    host = HostKVBuffer(ODD, 5)
    base = host.data.data_ptr()
    for page in range(5):
        assert host.data[page].is_contiguous()
        assert host.data[page].data_ptr() == base + page * ODD.page_bytes


def test_as_bytes_is_a_zero_copy_page_view() -> None:
    host = HostKVBuffer(ODD, 4)
    raw = host.as_bytes()
    assert raw.shape == (4, 720) and raw.dtype.name == "uint8"
    raw[2, :] = 0xFF
    assert bool(torch.isnan(host.data[2]).all())  # 0xFFFF is a NaN in fp16
    assert not host.data[1].any() and not host.data[3].any()


def test_pin_is_ignored_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: covered by the gpu tests")
    host = HostKVBuffer(ODD, 3, pin=True)
    assert host.pinned is False and host.pin_backend is None
    assert host.data.untyped_storage().nbytes() == 3 * 720
    with pytest.raises(RuntimeError, match="needs CUDA"):
        allocate_pinned(720)


def test_allocate_pinned_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="positive int"):
        allocate_pinned(0)


def pinned_by_torch() -> int | None:
    """Bytes held by torch's (rounding) caching host allocator, if it says."""
    stats = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    for key in ("allocated_bytes.current", "allocated_bytes.all.current"):
        if key in stats:
            return int(stats[key])
    return None


@pytest.mark.gpu
def test_pinned_buffer_is_exact_and_page_locked() -> None:
    torch.cuda.init()  # torch's host-memory statistics exist once its CUDA state is up
    before = pinned_by_torch()
    host = HostKVBuffer(ODD, 1001, pin=True)  # 720_720 B: a power-of-two allocator takes 1 MiB
    assert host.pinned and host.pin_backend in (CUPY, HOST_REGISTER)
    assert host.data.is_pinned()
    assert host.data.untyped_storage().nbytes() == 1001 * 720
    assert pinned_by_torch() == before  # nothing came from torch's caching host allocator
    assert not host.data.any()


@pytest.mark.gpu
def test_host_register_fallback_is_exact_and_page_locked() -> None:
    from radixcache.transfer.pinned import _with_host_register

    block = _with_host_register(720_720)
    assert block.backend == HOST_REGISTER
    assert block.tensor.is_pinned()
    assert block.tensor.untyped_storage().nbytes() == 720_720
    dev = (torch.arange(720_720, device="cuda") % 251).to(torch.uint8)
    block.tensor.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(block.tensor, dev.cpu())

"""Factories for the transfer tests: tiny specs and buffers filled with random bits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tests.transfer.transfer_testkit import fill_random

from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer, KVSpec

Buffers = tuple[DeviceKVBuffer, HostKVBuffer]
MakeBuffers = Callable[..., Buffers]


@pytest.fixture
def spec() -> KVSpec:
    return KVSpec(num_layers=3, num_kv_heads=2, head_dim=8, dtype=torch.float16, page_size=4)


@pytest.fixture
def make_buffers() -> MakeBuffers:
    def make(
        spec: KVSpec,
        device_pages: int = 12,
        host_pages: int = 10,
        device: str = "cpu",
        pin: bool = False,
        seed: int = 0,
    ) -> Buffers:
        dev = DeviceKVBuffer(spec, device_pages, device)
        host = HostKVBuffer(spec, host_pages, pin=pin)
        fill_random(dev.k, seed)
        fill_random(dev.v, seed + 1)
        fill_random(host.data, seed + 2)
        return dev, host

    return make

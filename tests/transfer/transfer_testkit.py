"""Helpers shared by the transfer tests: random-bit fills and bitwise views."""

from __future__ import annotations

import torch


def fill_random(t: torch.Tensor, seed: int) -> None:
    """Random *bits* (every byte pattern, NaN payloads included), so that a byte
    moved to the wrong place, or converted on the way, breaks bitwise equality."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, (t.numel() * t.element_size(),), dtype=torch.uint8, generator=g)
    t.view(-1).view(torch.uint8).copy_(bits.to(t.device))


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """A same-width integer view, so equality is bitwise (NaN == NaN)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])

"""What a caller passes in is copied into memory the cache owns, whatever
its container, and refused when it cannot be carried.

Issue 21 (1): runners reuse one ``input_ids`` tensor for every step. The
cache used to keep a view of an int32 CPU tensor, so rewriting the buffer
after ``admit`` changed the request's tokens under the cache: the KV of
1000..1016 was cached as the KV of 5000..5016 and served as such. (5): a
masked array passed the range check with -1 under its mask."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from radixcache import CacheConfig, KVSpec, RadixCache
from radixcache.tokens import as_tokens
from tests.radixcache.tiers.tierkit import assert_kv_correct, compute, kv_value

SPEC = KVSpec(2, 1, 2, torch.float32, 4)


def _cache() -> RadixCache:
    return RadixCache(CacheConfig(spec=SPEC, device_pages=64))


def test_the_reused_int32_tensor_of_the_issue_is_copied() -> None:
    c = _cache()
    buf = torch.arange(1000, 1017, dtype=torch.int32)
    r = c.admit(buf)
    c.reserve(r, 17)
    buf[:] = torch.arange(5000, 5017, dtype=torch.int32)  # the runner's next step
    compute_commit(c, r, 17)
    c.release(r)
    later = c.admit(np.arange(5000, 5017, dtype=np.int32))
    assert later.cached_len == 0, "the KV of 1000..1016 was served for 5000..5016"
    same = c.admit(np.arange(1000, 1017, dtype=np.int32))
    assert same.cached_len == 16
    assert_kv_correct(c, same)
    c.check_integrity()


def compute_commit(c: RadixCache, r: Any, n: int) -> None:
    """Write the prefix-derived KV of the request's own tokens, commit."""
    kv = c.kv
    assert kv is not None
    compute_at = r.num_computed
    r_tokens = r.tokens
    slots = kv.slots(r.page_table, compute_at, n)
    vals = torch.tensor([kv_value(r_tokens[: pos + 1]) for pos in range(compute_at, compute_at + n)])
    for layer in range(SPEC.num_layers):
        k, v = kv.layer_slots(layer)
        k[slots] = (vals + layer).view(-1, 1, 1)
        v[slots] = (-vals - layer).view(-1, 1, 1)
    c.commit(r, n)


# (make a buffer holding 1000..1016, rewrite it in place to 5000..5016)
Buffers = list[tuple[str, Callable[[], Any], Callable[[Any], None]]]


def _np_set(buf: Any) -> None:
    buf[:] = np.arange(5000, 5017)


def _torch_set(buf: Any) -> None:
    buf[:] = torch.arange(5000, 5017)


class _Sub(np.ndarray):  # type: ignore[type-arg]
    """An ndarray subclass (as memmap is)."""


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    _BASES[id(view)] = a
    return view


_BASES: dict[int, np.ndarray] = {}


def _np_writable_set(buf: Any) -> None:
    _BASES[id(buf)][:] = np.arange(5000, 5017)  # the owner rewrites what the cache saw read-only


BUFFERS: Buffers = [
    ("torch int32", lambda: torch.arange(1000, 1017, dtype=torch.int32), _torch_set),
    ("torch int64", lambda: torch.arange(1000, 1017, dtype=torch.int64), _torch_set),
    ("torch uint16", lambda: torch.arange(1000, 1017).to(torch.uint16), _torch_set),
    ("torch int32 strided view",
     lambda: torch.arange(1000, 1017, dtype=torch.int32).repeat_interleave(2)[::2], _torch_set),
    ("torch int32 view of a bigger buffer",
     lambda: torch.arange(990, 1030, dtype=torch.int32)[10:27], _torch_set),
    ("numpy int32", lambda: np.arange(1000, 1017, dtype=np.int32), _np_set),
    ("numpy int32 read-only", lambda: _readonly(np.arange(1000, 1017, dtype=np.int32)), _np_writable_set),
    ("numpy int32 strided view", lambda: np.repeat(np.arange(1000, 1017, dtype=np.int32), 2)[::2], _np_set),
    ("numpy big-endian int32", lambda: np.arange(1000, 1017, dtype=">i4"), _np_set),
    ("numpy uint16", lambda: np.arange(1000, 1017, dtype=np.uint16), _np_set),
    ("numpy int64", lambda: np.arange(1000, 1017, dtype=np.int64), _np_set),
    ("numpy memmap-like subclass", lambda: np.arange(1000, 1017, dtype=np.int32).view(_Sub), _np_set),
]



@pytest.mark.parametrize(("kind", "make", "rewrite"), BUFFERS, ids=[b[0] for b in BUFFERS])
def test_no_container_is_aliased(kind: str, make: Callable[[], Any], rewrite: Callable[[Any], None]) -> None:
    c = _cache()
    buf = make()
    r = c.admit(buf)
    assert r.tokens.tolist() == list(range(1000, 1017)), kind
    c.reserve(r, 17)
    rewrite(buf)
    assert np.asarray(buf).tolist() == list(range(5000, 5017)), "the rewrite took"
    assert r.tokens.tolist() == list(range(1000, 1017)), f"{kind}: the request saw the rewrite"
    compute_commit(c, r, 17)
    c.release(r)
    assert c.admit(np.arange(5000, 5017, dtype=np.int32)).cached_len == 0
    same = c.admit(np.arange(1000, 1017, dtype=np.int32))
    assert same.cached_len == 16
    assert_kv_correct(c, same)


def test_extend_copies_the_buffer_it_is_given() -> None:
    c = _cache()
    r = c.admit(np.arange(1000, 1008, dtype=np.int32))
    step = torch.tensor([1008], dtype=torch.int32)
    c.extend(r, step)
    step[0] = 7
    assert r.tokens.tolist() == list(range(1000, 1009))
    compute(c, r, 9)
    c.check_integrity()


def test_the_fast_path_copy_is_what_is_checked() -> None:
    src = np.arange(10, dtype=np.int32)
    out = as_tokens(src, copy=True)
    assert not np.shares_memory(out, src) and out.flags.writeable
    assert as_tokens(src) is src, "without copy (peek), an int32 array is used as it is"


@pytest.mark.parametrize(
    "dtype",
    [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64, torch.uint64],
)
def test_every_integer_tensor_dtype_is_accepted(dtype: torch.dtype) -> None:
    t = torch.arange(0, 100).to(dtype)
    out = as_tokens(t, copy=True)
    assert out.dtype == np.int32 and out.tolist() == list(range(100))
    assert not np.shares_memory(out, t.numpy())


@pytest.mark.filterwarnings("ignore:.*quantize.*:UserWarning")
def test_a_quantized_tensor_is_refused() -> None:
    q = torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match="plain integers"):
        as_tokens(q)


def test_masked_arrays_are_refused_whatever_the_mask() -> None:
    c = _cache()
    before = c.stats()
    for masked in (
        np.ma.array([5, 6, -1, 7, 8], mask=[0, 0, 1, 0, 0]),  # the issue's: -1 under the mask
        np.ma.array([5, 6, 7], mask=[0, 0, 0]),  # nothing masked: refused all the same
        np.ma.array(np.arange(9, dtype=np.int32)),
    ):
        with pytest.raises(TypeError, match="masked array"):
            c.admit(masked)
        with pytest.raises(TypeError, match="masked array"):
            c.peek(masked)
    assert c.stats() == before
    r = c.admit(np.ma.array([5, 6, -1, 7, 8], mask=[0, 0, 1, 0, 0]).compressed())
    assert r.tokens.tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        ([2**31], ValueError),
        ([2**64], ValueError),
        ([2**70], ValueError),
        (np.array([2**32], dtype=np.uint64), ValueError),
        (np.array([-1], dtype=np.int8), ValueError),
        (torch.tensor([-5]), ValueError),
        (np.array(["1", "2"]), TypeError),
        (np.array([1, 2], dtype=object), TypeError),
        (np.array([True, False]), TypeError),
        (torch.tensor([1, 0], dtype=torch.bool), TypeError),
        (torch.tensor([[1, 2]]), ValueError),
        (np.int32(5), TypeError),
        (b"\x01\x02", TypeError),
        (None, TypeError),
    ],
)
def test_what_cannot_be_a_token_id_is_refused(tokens: object, error: type) -> None:
    c = _cache()
    before = c.stats()
    with pytest.raises(error):
        c.admit(tokens)
    assert c.stats() == before
    c.check_integrity()

"""Layout conversion: bit-exact against a page-by-page reference, and the grouping plan."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.transfer.transfer_testkit import as_bits, fill_random

from radixcache.transfer.convert import (
    PagePairs,
    PageViews,
    PlanKind,
    copy_device_to_host,
    copy_host_to_device,
    copy_small,
    device_page_views,
    execute,
    host_page_views,
    plan_copy,
)
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer, KVSpec

MakeBuffers = Callable[..., tuple[DeviceKVBuffer, HostKVBuffer]]

# min_run_bytes values that force each plan kind for the tiny test spec
NEVER_STAGE = 0
ALWAYS_STAGE = 1 << 40


def pairs(src: list[int], dst: list[int], src_limit: int = 64, dst_limit: int = 64) -> PagePairs:
    return PagePairs.check(
        np.array(src, dtype=np.int32), np.array(dst, dtype=np.int32),
        src_name="src", src_limit=src_limit, dst_name="dst", dst_limit=dst_limit,
    )  # fmt: skip


def reference_d2h(
    dev: DeviceKVBuffer, host: HostKVBuffer, src: list[int], dst: list[int]
) -> torch.Tensor:
    """What host.data must hold after copying device pages src -> host pages dst."""
    want = host.data.clone()
    for s, t in zip(src, dst):
        for layer in range(dev.spec.num_layers):
            want[t, 0, layer] = dev.k[layer, s]
            want[t, 1, layer] = dev.v[layer, s]
    return want


def reference_h2d(
    host: HostKVBuffer, dev: DeviceKVBuffer, src: list[int], dst: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    want_k, want_v = dev.k.clone(), dev.v.clone()
    for s, t in zip(src, dst):
        for layer in range(dev.spec.num_layers):
            want_k[layer, t] = host.data[s, 0, layer]
            want_v[layer, t] = host.data[s, 1, layer]
    return want_k, want_v


def run_d2h(dev: DeviceKVBuffer, host: HostKVBuffer, p: PagePairs, min_run_bytes: int) -> PlanKind:
    plan = plan_copy(p, dev.spec.page_bytes // 2, min_run_bytes)
    for src, dst in zip(device_page_views(dev), host_page_views(host)):
        execute(plan, src, dst)
    return plan.kind


def run_h2d(host: HostKVBuffer, dev: DeviceKVBuffer, p: PagePairs, min_run_bytes: int) -> PlanKind:
    plan = plan_copy(p, dev.spec.page_bytes // 2, min_run_bytes)
    for src, dst in zip(host_page_views(host), device_page_views(dev)):
        execute(plan, src, dst)
    return plan.kind


# (device ids, host ids): scattered both sides, adjacent runs both sides,
# consecutive source only, consecutive destination only, duplicate sources.
CASES = [
    ([7, 0, 11, 3, 5], [2, 9, 4, 0, 6]),
    ([2, 3, 4, 8, 9], [5, 6, 7, 0, 1]),
    ([4, 5, 6, 7], [9, 1, 6, 3]),
    ([10, 1, 6, 3], [2, 3, 4, 5]),
]


@pytest.mark.parametrize("min_run_bytes", [NEVER_STAGE, ALWAYS_STAGE])
@pytest.mark.parametrize(("device_ids", "host_ids"), CASES)
def test_device_to_host_is_bit_exact(
    spec: KVSpec,
    make_buffers: MakeBuffers,
    device_ids: list[int],
    host_ids: list[int],
    min_run_bytes: int,
) -> None:
    dev, host = make_buffers(spec)
    want = reference_d2h(dev, host, device_ids, host_ids)
    device_before = (dev.k.clone(), dev.v.clone())
    run_d2h(dev, host, pairs(device_ids, host_ids, 12, 10), min_run_bytes)
    assert torch.equal(as_bits(host.data), as_bits(want))  # named pages copied, others untouched
    assert torch.equal(as_bits(dev.k), as_bits(device_before[0]))  # source never written
    assert torch.equal(as_bits(dev.v), as_bits(device_before[1]))


@pytest.mark.parametrize("min_run_bytes", [NEVER_STAGE, ALWAYS_STAGE])
@pytest.mark.parametrize(("device_ids", "host_ids"), CASES)
def test_host_to_device_is_bit_exact(
    spec: KVSpec,
    make_buffers: MakeBuffers,
    device_ids: list[int],
    host_ids: list[int],
    min_run_bytes: int,
) -> None:
    dev, host = make_buffers(spec)
    want_k, want_v = reference_h2d(host, dev, host_ids, device_ids)
    host_before = host.data.clone()
    run_h2d(host, dev, pairs(host_ids, device_ids, 10, 12), min_run_bytes)
    assert torch.equal(as_bits(dev.k), as_bits(want_k))
    assert torch.equal(as_bits(dev.v), as_bits(want_v))
    assert torch.equal(as_bits(host.data), as_bits(host_before))


def test_duplicate_sources_fan_out(spec: KVSpec, make_buffers: MakeBuffers) -> None:
    dev, host = make_buffers(spec)
    want_k, want_v = reference_h2d(host, dev, [3, 3, 3], [0, 5, 9])
    copy_host_to_device(host, dev, pairs([3, 3, 3], [0, 5, 9], 10, 12))
    assert torch.equal(as_bits(dev.k), as_bits(want_k))
    assert torch.equal(as_bits(dev.v), as_bits(want_v))


def test_round_trip_restores_pages(make_buffers: MakeBuffers) -> None:
    spec = KVSpec(num_layers=4, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16, page_size=8)
    dev, host = make_buffers(spec, device_pages=32, host_pages=24)
    rng = np.random.default_rng(1)
    device_ids = rng.choice(32, 16, replace=False)
    host_ids = rng.choice(24, 16, replace=False)
    saved_k = dev.k[:, device_ids].clone()
    saved_v = dev.v[:, device_ids].clone()
    copy_device_to_host(dev, host, pairs(device_ids.tolist(), host_ids.tolist(), 32, 24))
    fill_random(dev.k, 99)  # clobber the device
    fill_random(dev.v, 98)
    back = rng.permutation(32)[:16]  # load into other, scattered device pages
    copy_host_to_device(host, dev, pairs(host_ids.tolist(), back.tolist(), 24, 32))
    assert torch.equal(as_bits(dev.k[:, back]), as_bits(saved_k))
    assert torch.equal(as_bits(dev.v[:, back]), as_bits(saved_v))


def test_adjacent_runs_merge_into_slice_copies() -> None:
    # sorted by source: dev 4..6 -> host 20..22 | dev 10 -> host 3
    plan = plan_copy(pairs([10, 4, 5, 6], [3, 20, 21, 22]), page_bytes=1 << 20)
    assert plan.kind is PlanKind.SCATTER  # 2 runs either way: the tie goes to SCATTER
    assert plan.num_runs == 2
    assert plan.bounds.tolist() == [0, 3, 4]
    assert plan.merged.tolist() == [True, True]
    assert plan.src.tolist() == [4, 5, 6, 10]
    assert plan.dst.tolist() == [20, 21, 22, 3]


def test_runs_on_the_destination_side_lead_a_gather() -> None:
    # destinations 0..2 and 7..8 (2 runs), sources scattered (5 runs)
    plan = plan_copy(pairs([9, 3, 6, 1, 2], [7, 0, 1, 2, 8]), page_bytes=1 << 20)
    assert plan.kind is PlanKind.GATHER
    assert plan.bounds.tolist() == [0, 3, 5]
    assert plan.dst.tolist() == [0, 1, 2, 7, 8]
    assert plan.src.tolist() == [3, 6, 1, 9, 2]
    assert plan.merged.tolist() == [False, False]


def test_consecutive_destination_with_scattered_source_is_one_gather() -> None:
    plan = plan_copy(pairs([9, 2, 7, 0], [4, 5, 6, 7]), page_bytes=1 << 20)
    assert (plan.kind, plan.num_runs, plan.merged.tolist()) == (
        PlanKind.GATHER,
        1,
        [False],
    )


def test_consecutive_source_with_scattered_destination_is_one_scatter() -> None:
    plan = plan_copy(pairs([0, 1, 2, 3], [7, 2, 9, 4]), page_bytes=1 << 20)
    assert (plan.kind, plan.num_runs, plan.merged.tolist()) == (
        PlanKind.SCATTER,
        1,
        [False],
    )
    assert plan.src.tolist() == [0, 1, 2, 3]


def test_small_scattered_pages_go_through_staging() -> None:
    p = pairs([5, 1, 9, 3], [2, 8, 0, 6])
    assert plan_copy(p, page_bytes=1024).kind is PlanKind.STAGED
    assert plan_copy(p, page_bytes=1 << 20).kind is PlanKind.SCATTER  # big pages: a call per page


def test_empty_batch_plans_nothing(spec: KVSpec, make_buffers: MakeBuffers) -> None:
    dev, host = make_buffers(spec)
    before = host.data.clone()
    plan = copy_device_to_host(dev, host, pairs([], []))
    assert plan.num_runs == 0
    assert torch.equal(as_bits(host.data), as_bits(before))


def test_mismatched_specs_are_refused(spec: KVSpec) -> None:
    other = KVSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float16, page_size=4)
    with pytest.raises(ValueError, match="same KVSpec"):
        copy_device_to_host(DeviceKVBuffer(spec, 4), HostKVBuffer(other, 4), pairs([0], [0]))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    n=st.integers(min_value=0, max_value=12),
    min_run_bytes=st.sampled_from([NEVER_STAGE, 256, ALWAYS_STAGE]),
)
def test_any_batch_matches_reference(data: st.DataObject, n: int, min_run_bytes: int) -> None:
    spec = KVSpec(num_layers=2, num_kv_heads=1, head_dim=4, dtype=torch.float16, page_size=2)
    dev = DeviceKVBuffer(spec, 14)
    host = HostKVBuffer(spec, 13)
    fill_random(dev.k, n)
    fill_random(dev.v, n + 1)
    fill_random(host.data, n + 2)
    device_ids = data.draw(st.lists(st.integers(0, 13), min_size=n, max_size=n, unique=True))
    host_ids = data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n, unique=True))
    want = reference_d2h(dev, host, device_ids, host_ids)
    run_d2h(dev, host, pairs(device_ids, host_ids, 14, 13), min_run_bytes)
    assert torch.equal(as_bits(host.data), as_bits(want))
    want_k, want_v = reference_h2d(host, dev, host_ids[::-1], device_ids)
    run_h2d(host, dev, pairs(host_ids[::-1], device_ids, 13, 14), min_run_bytes)
    assert torch.equal(as_bits(dev.k), as_bits(want_k))
    assert torch.equal(as_bits(dev.v), as_bits(want_v))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(min_value=0, max_value=12))
def test_a_small_copy_matches_reference(data: st.DataObject, n: int) -> None:
    """``copy_small`` (no plan, one fancy copy per view) is bit-exact both ways,
    for a dtype numpy lacks too."""
    dtype = data.draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
    spec = KVSpec(num_layers=2, num_kv_heads=1, head_dim=4, dtype=dtype, page_size=2)
    dev = DeviceKVBuffer(spec, 14)
    host = HostKVBuffer(spec, 13)
    fill_random(dev.k, n)
    fill_random(dev.v, n + 1)
    fill_random(host.data, n + 2)
    views = PageViews.of(dev, host)
    device_ids = data.draw(st.lists(st.integers(0, 13), min_size=n, max_size=n, unique=True))
    host_ids = data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n, unique=True))
    want = reference_d2h(dev, host, device_ids, host_ids)
    d2h = pairs(device_ids, host_ids, 14, 13)
    assert views.small(d2h)
    copy_small(views.device, views.host, d2h)
    assert torch.equal(as_bits(host.data), as_bits(want))
    want_k, want_v = reference_h2d(host, dev, host_ids[::-1], device_ids)
    copy_small(views.host, views.device, pairs(host_ids[::-1], device_ids, 13, 14))
    assert torch.equal(as_bits(dev.k), as_bits(want_k))
    assert torch.equal(as_bits(dev.v), as_bits(want_v))


def test_large_pages_are_gathered_page_by_page_bit_exact() -> None:
    """Pages of >= LOOP_MIN_PAGE_BYTES per view take the per-page copy path."""
    import torch as _torch

    from radixcache.transfer import DeviceKVBuffer, KVSpec
    from radixcache.transfer.convert import LOOP_MIN_PAGE_BYTES, PagePairs, copy_device_to_host, copy_host_to_device
    from radixcache.transfer.host import HostKVBuffer

    spec = KVSpec(num_layers=2, num_kv_heads=8, head_dim=512, dtype=_torch.float16, page_size=16)
    assert spec.page_bytes // 2 >= LOOP_MIN_PAGE_BYTES
    dev = DeviceKVBuffer(spec, 6)
    host = HostKVBuffer(spec, 5)
    gen = _torch.Generator().manual_seed(3)
    dev.k.copy_(_torch.randn(dev.k.shape, generator=gen).to(dev.k.dtype))
    dev.v.copy_(_torch.randn(dev.v.shape, generator=gen).to(dev.v.dtype))
    src, dst = [4, 0, 5, 2], [1, 2, 3, 4]  # one destination run from scattered sources
    copy_device_to_host(dev, host, PagePairs.check(src, dst, src_name="d", src_limit=6,
                                                    dst_name="h", dst_limit=5))
    for s, d in zip(src, dst):
        assert _torch.equal(host.data[d, 0], dev.k[:, s]) and _torch.equal(host.data[d, 1], dev.v[:, s])
    back = DeviceKVBuffer(spec, 6)
    copy_host_to_device(host, back, PagePairs.check(dst, [3, 1, 0, 5], src_name="h", src_limit=5,
                                                     dst_name="d", dst_limit=6))
    for s, d in zip(src, [3, 1, 0, 5]):
        assert _torch.equal(back.k[:, d], dev.k[:, s]) and _torch.equal(back.v[:, d], dev.v[:, s])

"""RadixcacheTier driven by vLLM's own tier factory and tiering manager (CPU).

The scenarios follow vLLM's tests of its tiers (store, drain, load into other
chunks bit-exact, cascade from the primary tier, promotion), plus restart and
corruption. vLLM's spec is a mock with a real ``OffloadingConfig``, as in
vLLM's own tier tests; the primary tier's region is a mock returning a real
page-aligned tensor's memoryview (no shared memory segment is needed).
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

from tests.radixcache.integrations.conftest import corrupt_record  # noqa: E402
from radixcache.integrations.vllm import RadixcacheTier  # noqa: E402

NUM_CHUNKS = 8
CHUNK_FLOATS = 1024  # 4 KiB chunks
CTX = ReqContext(req_id="req")


def offloading_spec(model: str = "test-model", rank: int = 0, events: bool = True) -> MagicMock:
    spec = MagicMock()
    spec.config = OffloadingConfig(
        groups=(),
        worker_kv_bytes_per_block=4 * CHUNK_FLOATS,
        enable_kv_cache_events=events,
        extra_config={},
        engine_id="engine",
        model=OffloadingModelConfig(name=model, dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    spec.blocks_per_chunk = 1
    return spec


def aligned_tensor(num_chunks: int = NUM_CHUNKS) -> torch.Tensor:
    """A zeroed float32 [num_chunks, CHUNK_FLOATS] tensor starting on a page boundary."""
    nbytes = num_chunks * CHUNK_FLOATS * 4
    raw = torch.zeros(nbytes + mmap.PAGESIZE, dtype=torch.uint8)
    shift = (-raw.data_ptr()) % mmap.PAGESIZE
    return raw[shift : shift + nbytes].view(torch.float32).view(num_chunks, CHUNK_FLOATS)


def key(n: int) -> OffloadKey:
    return make_offload_key(n.to_bytes(32, "big"), 0)  # 32-byte hash + group: 36 bytes


def job(job_id: int, keys: list[OffloadKey], chunks: list[int], load: bool = False) -> TransferJob:
    return TransferJob(job_id=job_id, keys=keys, chunk_ids=np.array(chunks, dtype=np.int64),
                       is_promotion=load, req_context=CTX)


def tier_config(path: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "RadixcacheTier", "module_path": "radixcache.integrations.vllm",
            "path": str(path), "capacity_bytes": 1 << 22, **extra}


def make_tier(path: Path, tensor: torch.Tensor, **extra: Any) -> RadixcacheTier:
    tier = SecondaryTierFactory.create_secondary_tier(
        tier_config(path, **extra), memoryview(tensor.numpy()), offloading_spec()
    )
    assert isinstance(tier, RadixcacheTier)
    return tier


def drain(tier: RadixcacheTier) -> list[Any]:
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


@pytest.fixture
def tensor() -> torch.Tensor:
    return aligned_tensor()


@pytest.fixture
def tier(tmp_path: Path, tensor: torch.Tensor) -> Iterator[RadixcacheTier]:
    tier = make_tier(tmp_path / "store", tensor)
    yield tier
    tier.shutdown()


def test_factory_builds_the_tier_from_module_path(tier: RadixcacheTier) -> None:
    assert tier.tier_type == "RadixcacheTier"
    assert tier.medium is Medium.STORAGE
    assert tier.block_size_bytes == 4 * CHUNK_FLOATS
    assert tier.lookup(key(1), CTX) is LookupResult.MISS


def test_store_drain_lookup_and_load_into_other_chunks_bit_exact(
    tier: RadixcacheTier, tensor: torch.Tensor
) -> None:
    tensor[:] = torch.rand(NUM_CHUNKS, CHUNK_FLOATS)
    keys = [key(i) for i in range(4)]
    expected = tensor[:4].clone()
    tier.submit_store(job(1, keys, [0, 1, 2, 3]))
    assert tier.has_pending_work()
    (result,) = drain(tier)
    assert (result.job_id, result.success, result.transfer_bytes) == (1, True, 4 * 4 * CHUNK_FLOATS)
    assert [tier.lookup(k, CTX) for k in keys] == [LookupResult.HIT] * 4
    tensor.zero_()
    tier.submit_load(job(2, keys, [7, 6, 5, 4], load=True))
    (loaded,) = drain(tier)
    assert loaded.success and loaded.successful_keys is None
    for i, chunk in enumerate([7, 6, 5, 4]):
        assert torch.equal(tensor[chunk], expected[i])
    assert not tier.has_pending_work()


def test_load_of_a_missing_key_fails_with_the_leading_keys_that_loaded(
    tier: RadixcacheTier, tensor: torch.Tensor
) -> None:
    tensor[:2] = torch.rand(2, CHUNK_FLOATS)
    tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
    assert all(r.success for r in drain(tier))
    tier.submit_load(job(2, [key(1), key(99), key(2)], [4, 5, 6], load=True))
    (result,) = drain(tier)
    assert not result.success
    assert list(result.successful_keys) == [key(1)]
    assert torch.equal(tensor[4], tensor[0])
    tier.submit_load(job(3, [key(98)], [7], load=True))
    (none,) = drain(tier)
    assert not none.success and none.successful_keys is None


def test_events_report_stores_then_removals_in_order(tmp_path: Path, tensor: torch.Tensor) -> None:
    # capacity for 3 records of 4 KiB: the 4th store evicts the oldest
    tier = make_tier(tmp_path / "small", tensor, capacity_bytes=3 * (4 * CHUNK_FLOATS + 200))
    try:
        tensor[:] = torch.rand(NUM_CHUNKS, CHUNK_FLOATS)
        for i in range(4):
            tier.submit_store(job(i, [key(i)], [i]))
            assert [r.success for r in drain(tier)] == [True]
        deadline = time.monotonic() + 5
        events: list[OffloadingEvent] = []
        while time.monotonic() < deadline and not any(e.removed for e in events):
            tier.get_finished_jobs()
            events += tier.take_events()
        flat = [(k, e.removed) for e in events for k in e.keys]
        assert flat[:4] == [(key(i), False) for i in range(4)]
        assert flat[4:] == [(key(0), True)]
        assert all(e.medium is Medium.STORAGE for e in events)
        assert tier.lookup(key(0), CTX) is LookupResult.MISS
        assert tier.lookup(key(3), CTX) is LookupResult.HIT
    finally:
        tier.shutdown()


def test_restart_lookups_hit_survivors_are_announced_and_load_bit_exact(
    tmp_path: Path, tensor: torch.Tensor
) -> None:
    tensor[:3] = torch.rand(3, CHUNK_FLOATS)
    expected = tensor[:3].clone()
    first = make_tier(tmp_path / "s", tensor)
    first.submit_store(job(1, [key(1), key(2), key(3)], [0, 1, 2]))
    assert all(r.success for r in drain(first))
    first.shutdown()
    tensor.zero_()
    second = make_tier(tmp_path / "s", tensor)
    try:
        assert [second.lookup(key(i), CTX) for i in (1, 2, 3, 4)] == [LookupResult.HIT] * 3 + [
            LookupResult.MISS
        ]
        (announced,) = list(second.take_events())
        assert not announced.removed and sorted(announced.keys) == [key(1), key(2), key(3)]
        second.submit_load(job(2, [key(1), key(2), key(3)], [5, 6, 7], load=True))
        assert [r.success for r in drain(second)] == [True]
        assert torch.equal(tensor[5:8], expected)
    finally:
        second.shutdown()


def test_another_model_never_hits(tmp_path: Path, tensor: torch.Tensor) -> None:
    first = make_tier(tmp_path / "s", tensor)
    first.submit_store(job(1, [key(1)], [0]))
    drain(first)
    first.shutdown()
    other = make_tier(tmp_path / "s", tensor, model="another-model")
    try:
        assert other.lookup(key(1), CTX) is LookupResult.MISS
    finally:
        other.shutdown()


def test_corrupt_record_fails_the_job_is_removed_and_never_served(
    tmp_path: Path, tensor: torch.Tensor
) -> None:
    tensor[:2] = torch.rand(2, CHUNK_FLOATS)
    first = make_tier(tmp_path / "s", tensor)
    first.submit_store(job(1, [key(1), key(2)], [0, 1]))
    drain(first)
    first.shutdown()
    corrupt_record(tmp_path / "s", key(2))
    second = make_tier(tmp_path / "s", tensor, enable_kv_events=True)
    try:
        list(second.take_events())  # the survivors
        tensor[4:6] = -1.0
        second.submit_load(job(2, [key(1), key(2)], [4, 5], load=True))
        (result,) = drain(second)
        assert not result.success and list(result.successful_keys) == [key(1)]
        assert torch.equal(tensor[4], tensor[0])
        deadline = time.monotonic() + 5
        removed: list[OffloadKey] = []
        while time.monotonic() < deadline and not removed:
            second.get_finished_jobs()
            removed += [k for e in second.take_events() if e.removed for k in e.keys]
        assert removed == [key(2)]
        assert second.lookup(key(2), CTX) is LookupResult.MISS
        assert second.store.stats().corrupt == 1
    finally:
        second.shutdown()


# -- through vLLM's TieringOffloadingManager ------------------------------------


def manager_with_tier(path: Path, tensor: torch.Tensor) -> tuple[TieringOffloadingManager, Any]:
    region = MagicMock()
    region.create_kv_memoryview.return_value = memoryview(tensor.numpy())
    primary = CPUPrimaryTierOffloadingManager(num_chunks=NUM_CHUNKS, mmap_region=region)
    tier = make_tier(path, tensor)
    return TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier]), tier


def end_step(manager: TieringOffloadingManager) -> None:
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))


def test_cascade_from_primary_then_promotion_after_restart(
    tmp_path: Path, tensor: torch.Tensor
) -> None:
    keys = [key(i) for i in range(3)]
    manager, tier = manager_with_tier(tmp_path / "s", tensor)
    manager.on_new_request(CTX)
    prepared = manager.prepare_store(keys, CTX)
    assert prepared is not None and list(prepared.keys_to_store) == keys
    chunks = [int(c) for c in prepared.store_spec.chunk_ids]
    for c in chunks:  # the GPU -> primary copy
        tensor[c] = torch.rand(CHUNK_FLOATS)
    expected = {k: tensor[c].clone() for k, c in zip(keys, chunks)}
    manager.complete_store(keys, CTX, success=True)  # cascades to our tier
    assert tier.has_pending_work()
    tier.drain_jobs()
    end_step(manager)  # prepare_store already polled this step: resets the per-step gate
    end_step(manager)  # harvests the cascade job
    assert not manager.has_pending_work()
    assert [tier.lookup(k, CTX) for k in keys] == [LookupResult.HIT] * 3
    manager.on_request_finished(CTX)
    manager.shutdown()

    tensor.zero_()  # a new process: empty primary tier, same store
    manager, tier = manager_with_tier(tmp_path / "s", tensor)
    try:
        ctx = ReqContext(req_id="again")
        manager.on_new_request(ctx)
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT_PENDING] * 3
        end_step(manager)  # submits the promotion (one load job)
        tier.drain_jobs()
        end_step(manager)  # harvests it
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 3
        spec = manager.prepare_load(keys, ctx)
        for k, c in zip(keys, spec.chunk_ids):
            assert torch.equal(tensor[int(c)], expected[k])
        manager.complete_load(keys, ctx)
        manager.on_request_finished(ctx)
    finally:
        manager.shutdown()


def test_no_events_while_the_engine_publishes_none(tmp_path: Path, tensor: torch.Tensor) -> None:
    tier = SecondaryTierFactory.create_secondary_tier(
        tier_config(tmp_path / "s"), memoryview(tensor.numpy()), offloading_spec(events=False)
    )
    try:
        tier.submit_store(job(1, [key(1)], [0]))
        assert [r.success for r in drain(tier)] == [True]
        assert list(tier.take_events()) == []
    finally:
        tier.shutdown()

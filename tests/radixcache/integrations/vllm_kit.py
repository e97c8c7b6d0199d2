"""vLLM's own offloading stack on the CPU, as ``vllm serve`` builds it.

``OffloadingSpecFactory.create_spec(OffloadingConfig)`` -> ``get_manager()``
builds vLLM's ``TieringOffloadingManager``: a CPU primary tier on a real
``SharedOffloadRegion`` (a file in /dev/shm) and the secondary tiers of
``secondary_tiers``, each made by vLLM's ``SecondaryTierFactory``. Nothing of
vLLM's is mocked; the only thing not run is the GPU (the worker's copies).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from radixcache.integrations.vllm import RadixcacheTier

NUM_CHUNKS = 8
BLOCK_BYTES = 4096  # one block per chunk; the region rounds chunks up to OS pages


def tier_entry(path: Path, **extra: Any) -> dict[str, Any]:
    """A ``secondary_tiers`` entry for our tier (README's keys)."""
    return {"type": "RadixcacheTier", "module_path": "radixcache.integrations.vllm",
            "path": str(path), "capacity_bytes": 1 << 22, **extra}


def offloading_config(
    entries: list[dict[str, Any]], *, events: bool = True, model: str = "test-model",
    rank: int = 0, engine_id: str | None = None,
) -> OffloadingConfig:
    """The ``OffloadingConfig`` vLLM's connector derives from its configs."""
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": NUM_CHUNKS * BLOCK_BYTES,
             "secondary_tiers": entries}
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=BLOCK_BYTES,
        enable_kv_cache_events=events,
        extra_config=extra,
        engine_id=engine_id or f"radixcache-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


@dataclass
class Stack:
    """One engine's scheduler-side offloading stack."""

    spec: Any  # TieringOffloadingSpec
    manager: TieringOffloadingManager
    tier: RadixcacheTier

    def write(self, chunk: int, data: np.ndarray) -> None:
        """Put ``data`` into a primary-tier chunk (as the GPU -> CPU copy does)."""
        rows = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        rows[chunk, : data.size] = data
        del rows  # no buffer export may outlive the call (shutdown releases the view)

    def read(self, chunk: int) -> np.ndarray:
        rows = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        out = rows[chunk, :BLOCK_BYTES].copy()
        del rows
        return out

    def end_step(self) -> None:
        self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))

    def drain(self) -> list[Any]:
        """Finish the tier's jobs and harvest them (the tier alone)."""
        self.tier.drain_jobs()
        return list(self.tier.get_finished_jobs())


@contextmanager
def stack(config: OffloadingConfig) -> Iterator[Stack]:
    """vLLM's spec and manager for ``config``; shut down (region removed) on exit."""
    spec = OffloadingSpecFactory.create_spec(config)
    manager = spec.get_manager()
    assert isinstance(manager, TieringOffloadingManager)
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, RadixcacheTier)
    try:
        yield Stack(spec, manager, tier)
    finally:
        manager.shutdown()


def key(n: int) -> OffloadKey:
    return make_offload_key(n.to_bytes(32, "big"), 0)  # 32-byte hash + group: 36 bytes


def ctx(req_id: str = "req", salt: str | None = None) -> ReqContext:
    params = {"cache_salt": salt} if salt is not None else None
    return ReqContext(req_id=req_id, kv_transfer_params=params)


def job(job_id: int, keys: list[OffloadKey], chunks: list[int], load: bool = False,
        req: ReqContext | None = None) -> TransferJob:
    return TransferJob(job_id=job_id, keys=keys, chunk_ids=np.array(chunks, dtype=np.int64),
                       is_promotion=load, req_context=req or ctx())


def random_block(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)

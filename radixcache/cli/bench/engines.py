"""Engine storage benchmark: radixcache inside vLLM and SGLang against their own
disk backends, on the same bytes, in the same run, in one directory.

    vllm     RadixcacheTier vs vLLM's ``fs`` tier (FileSystemTierManager), both
             built by vLLM's SecondaryTierFactory over one primary-tier tensor:
             store = submit_store of every chunk (jobs of --job-chunks) and
             drain_jobs; load = submit_load of every chunk into other chunks and
             drain_jobs (checked bit-exact).
    sglang   RadixcacheHiCacheStorage (interface v1: batch_set_v1/batch_get_v1 of
             128 pages through get_page_buffer_meta) vs SGLang's ``file``
             backend (HiCacheFile: batch_set/batch_get of flat page tensors,
             which its controller gathers from and scatters into the host
             pool, done here too), over one page-first MHA host pool.
    restart  each store closed and opened again: pages found, reopen seconds.

Durability differs and is reported: vLLM's fs tier and SGLang's file backend
never fsync; radixcache runs "fast" (one synced commit per write batch) and
"safe" (data and meta synced). Loads of every backend read pages the OS page
cache may hold (vLLM's fs tier uses O_DIRECT where the file system allows it).
Each figure is the median of --repeat rounds; ratios are radixcache / engine
backend (above 1: radixcache faster). The machine may be shared: compare only
ratios from one run.

    python -m radixcache.cli.bench.engines [--quick] [--total-mib 64] [--repeat 3] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHUNK_BYTES = 2 << 20  # one vLLM chunk / SGLang page: a 16-token Llama-3-8B block, fp16
SG_PAGE, SG_LAYERS, SG_HEADS, SG_DIM = 16, 32, 8, 128  # SGLang page: 2 MiB in fp16


def _median(runs: list[float], nbytes: int) -> dict[str, Any]:
    s = statistics.median(runs)
    return {"gb_per_s": round(nbytes / s / 1e9, 3), "seconds": round(s, 4),
            "runs_s": [round(r, 4) for r in runs]}


def _ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    return round(float(theirs["seconds"]) / float(ours["seconds"]), 2)


def _figures(
    store_runs: dict[str, list[float]],
    load_runs: dict[str, list[float]],
    nbytes: int,
    restart: dict[str, Any],
    baseline: str,
    ratios_key: str,
) -> dict[str, Any]:
    """One engine's result: median store and load rates per backend, the
    restart figures, and our two backends' ratios against ``baseline``."""
    store = {b: _median(runs, nbytes) for b, runs in store_runs.items()}
    load = {b: _median(runs, nbytes) for b, runs in load_runs.items()}
    return {
        "store": store, "load": load, "restart": restart,
        ratios_key: {
            f"{kind}_{b}": _ratio(figs[b], figs[baseline])
            for kind, figs in (("store", store), ("load", load))
            for b in ("radixcache_fast", "radixcache_safe")
        },
    }


# -- vLLM ------------------------------------------------------------------------


def _vllm_spec() -> Any:
    """vLLM's own ``TieringOffloadingSpec`` (built, its manager never: the
    tiers get the benchmark's own buffer instead of a shared region)."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = OffloadingConfig(
        groups=(), worker_kv_bytes_per_block=CHUNK_BYTES, enable_kv_cache_events=False,
        extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": CHUNK_BYTES},
        engine_id="bench",
        model=OffloadingModelConfig(name="bench-model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return OffloadingSpecFactory.create_spec(config)


def _vllm_tier(config: dict[str, Any], view: memoryview) -> Any:
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    return SecondaryTierFactory.create_secondary_tier(config, view, _vllm_spec())


def bench_vllm(root: Path, n: int, repeat: int, job_chunks: int) -> dict[str, Any]:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    buf = torch.zeros(2 * n * CHUNK_BYTES + 4096, dtype=torch.uint8)
    shift = (-buf.data_ptr()) % 4096
    chunks = buf[shift : shift + 2 * n * CHUNK_BYTES].view(2 * n, CHUNK_BYTES)
    chunks[:n] = torch.randint(0, 256, (n, CHUNK_BYTES), dtype=torch.uint8)
    view = chunks.numpy().data  # memoryview [2n, CHUNK_BYTES]
    backends = {
        "radixcache_fast": {"type": "RadixcacheTier", "module_path": "radixcache.integrations.vllm",
                            "durability": "fast", "capacity_bytes": 4 * n * CHUNK_BYTES},
        "radixcache_safe": {"type": "RadixcacheTier", "module_path": "radixcache.integrations.vllm",
                            "durability": "safe", "capacity_bytes": 4 * n * CHUNK_BYTES},
        "vllm_fs": {"type": "fs", "n_read_threads": 4, "n_write_threads": 4},
    }
    store_runs: dict[str, list[float]] = {b: [] for b in backends}
    load_runs: dict[str, list[float]] = {b: [] for b in backends}
    restart: dict[str, Any] = {}
    for r in range(repeat + 1):  # round 0 warms up, untimed
        for name, cfg in backends.items():
            where = root / f"vllm-{name}-{r}"
            path_key = "root_dir" if cfg["type"] == "fs" else "path"
            tier = _vllm_tier({**cfg, path_key: str(where)}, view)
            keys = [make_offload_key(f"{r}:{i}".encode().ljust(32, b"."), 0) for i in range(n)]

            def jobs(first_id: int, chunk_base: int, load: bool) -> list[Any]:
                return [
                    TransferJob(job_id=first_id + j, keys=keys[j : j + job_chunks],
                                chunk_ids=np.arange(chunk_base + j, chunk_base + min(n, j + job_chunks)),
                                is_promotion=load, req_context=ReqContext(req_id="bench"))
                    for j in range(0, n, job_chunks)
                ]

            t0 = time.perf_counter()
            for job in jobs(0, 0, False):
                tier.submit_store(job)
            tier.drain_jobs()
            t1 = time.perf_counter()
            assert all(res.success for res in tier.get_finished_jobs()), name
            chunks[n:] = 0
            t2 = time.perf_counter()
            for job in jobs(10_000, n, True):
                tier.submit_load(job)
            tier.drain_jobs()
            t3 = time.perf_counter()
            assert all(res.success for res in tier.get_finished_jobs()), name
            assert torch.equal(chunks[n:], chunks[:n]), f"{name} loaded other bytes"
            tier.shutdown()
            if r:
                store_runs[name].append(t1 - t0)
                load_runs[name].append(t3 - t2)
            if r == repeat:
                restart[name] = _vllm_restart(cfg, path_key, where, view, keys)
    return _figures(store_runs, load_runs, n * CHUNK_BYTES, restart, "vllm_fs", "ratios_vs_fs")


def _vllm_restart(cfg: dict[str, Any], path_key: str, where: Path, view: memoryview,
                  keys: list[Any]) -> dict[str, Any]:
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    t0 = time.perf_counter()
    tier = _vllm_tier({**cfg, path_key: str(where)}, view)
    opened = time.perf_counter() - t0
    ctx = ReqContext(req_id="restart")
    found = 0
    deadline = time.monotonic() + 30
    pending = list(keys)
    while pending and time.monotonic() < deadline:  # the fs tier answers lookups asynchronously
        still = []
        for k in pending:
            res = tier.lookup(k, ctx)
            if res is LookupResult.HIT:
                found += 1
            elif res is LookupResult.RETRY:
                still.append(k)
        pending = still
        if pending:
            tier.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
            time.sleep(0.005)
    tier.shutdown()
    return {"pages": len(keys), "found": found, "reopen_s": round(opened, 4)}


# -- SGLang ----------------------------------------------------------------------------


class _HostPool:
    """Page-first MHA host pool, answering as SGLang's does (K span, V span per page)."""

    def __init__(self, pages: int) -> None:
        self.page_size, self.layout, self.dtype = SG_PAGE, "page_first", torch.float16
        self.size = pages * SG_PAGE
        self.kv_buffer = torch.zeros(2, self.size, SG_LAYERS, SG_HEADS, SG_DIM, dtype=self.dtype)
        self.token_bytes = SG_LAYERS * SG_HEADS * SG_DIM * 2

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        idx = indices.tolist()
        base, v = self.kv_buffer.data_ptr(), self.size * self.token_bytes
        ptrs: list[int] = []
        for i in range(0, len(idx), SG_PAGE):
            ptrs += [base + idx[i] * self.token_bytes, base + idx[i] * self.token_bytes + v]
        return ptrs, [SG_PAGE * self.token_bytes] * len(ptrs)

    def flat_page(self, page: int) -> torch.Tensor:  # what get_data_page(flat=True) returns
        return self.kv_buffer[:, page * SG_PAGE : (page + 1) * SG_PAGE].flatten()

    def set_flat_page(self, page: int, flat: torch.Tensor) -> None:
        span = self.kv_buffer[:, page * SG_PAGE : (page + 1) * SG_PAGE]
        span.copy_(flat.view(span.shape))


def _sglang_config(extra: dict[str, Any]) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench/model", extra_config=extra,
    )


def bench_sglang(root: Path, n: int, repeat: int) -> dict[str, Any]:
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from radixcache.integrations.sglang import RadixcacheHiCacheStorage

    pool = _HostPool(2 * n)
    src = pool.kv_buffer[:, : n * SG_PAGE]
    src.copy_(torch.randn(src.shape).to(torch.float16))
    batch = 128

    def ours(where: Path, durability: str) -> Any:
        store = RadixcacheHiCacheStorage(_sglang_config(
            {"path": str(where), "kv_dtype": "float16", "durability": durability,
             "capacity_bytes": 4 * n * CHUNK_BYTES}), {})
        store.register_mem_pool_host(pool)
        return store

    def file(where: Path) -> Any:
        return HiCacheFile(_sglang_config({"file_storage_path": str(where)}))

    def tokens(first_page: int, count: int) -> torch.Tensor:
        return torch.arange(first_page * SG_PAGE, (first_page + count) * SG_PAGE)

    def v1_set(store: Any, keys: list[str]) -> None:
        for b in range(0, n, batch):
            assert all(store.batch_set_v1(keys[b : b + batch], tokens(b, len(keys[b : b + batch]))))

    def v1_get(store: Any, keys: list[str]) -> None:
        for b in range(0, n, batch):
            assert all(store.batch_get_v1(keys[b : b + batch], tokens(n + b, len(keys[b : b + batch]))))

    def file_set(store: Any, keys: list[str]) -> None:
        for b in range(0, n, batch):
            assert store.batch_set(keys[b : b + batch], [pool.flat_page(i).clone() for i in range(b, min(n, b + batch))])

    def file_get(store: Any, keys: list[str]) -> None:
        dummy = torch.empty(2 * SG_PAGE * SG_LAYERS * SG_HEADS * SG_DIM, dtype=torch.float16)
        for i, key in enumerate(keys):
            got = store.get(key, dummy)
            assert got is not None
            pool.set_flat_page(n + i, got)

    backends: dict[str, tuple[Callable[[Path], Any], Callable[..., None], Callable[..., None]]] = {
        "radixcache_fast": (lambda w: ours(w, "fast"), v1_set, v1_get),
        "radixcache_safe": (lambda w: ours(w, "safe"), v1_set, v1_get),
        "sglang_file": (file, file_set, file_get),
    }
    store_runs: dict[str, list[float]] = {b: [] for b in backends}
    load_runs: dict[str, list[float]] = {b: [] for b in backends}
    restart: dict[str, Any] = {}
    for r in range(repeat + 1):
        for name, (open_, put, get) in backends.items():
            where = root / f"sglang-{name}-{r}"
            keys = [f"{r:08x}{i:056x}" for i in range(n)]
            store = open_(where)
            t0 = time.perf_counter()
            put(store, keys)
            t1 = time.perf_counter()
            pool.kv_buffer[:, n * SG_PAGE :] = 0
            t2 = time.perf_counter()
            get(store, keys)
            t3 = time.perf_counter()
            assert torch.equal(pool.kv_buffer[:, n * SG_PAGE :], src), f"{name} loaded other bytes"
            if hasattr(store, "close"):
                store.close()
            if r:
                store_runs[name].append(t1 - t0)
                load_runs[name].append(t3 - t2)
            if r == repeat:
                t4 = time.perf_counter()
                again = open_(where)
                opened = time.perf_counter() - t4
                found = sum(again.batch_exists(keys[b : b + batch]) for b in range(0, n, batch))
                if hasattr(again, "close"):
                    again.close()
                restart[name] = {"pages": n, "found": found, "reopen_s": round(opened, 4)}
    return _figures(store_runs, load_runs, n * CHUNK_BYTES, restart, "sglang_file", "ratios_vs_file")


def run(total_mib: int, repeat: int, parent: str | None, job_chunks: int = 16) -> dict[str, Any]:
    n = max(1, (total_mib << 20) // CHUNK_BYTES)
    root = Path(tempfile.mkdtemp(prefix="radixcache-bench-engines-", dir=parent))
    try:
        out: dict[str, Any] = {
            "benchmark": "engines",
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "note": "shared machine: absolute rates drift; compare ratios"},
            "page_bytes": CHUNK_BYTES, "pages": n, "repeat": repeat,
        }
        out["vllm"] = bench_vllm(root, n, repeat, job_chunks)
        out["sglang"] = bench_sglang(root, n, repeat)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixcache.cli.bench.engines")
    parser.add_argument("--total-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    parser.add_argument("--quick", action="store_true", help="8 MiB, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.total_mib, args.repeat = 8, 1
    if args.total_mib <= 0 or args.repeat <= 0:
        parser.error("--total-mib and --repeat must be positive")
    print(json.dumps(run(args.total_mib, args.repeat, args.dir), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

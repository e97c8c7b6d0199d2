"""Storage-tier benchmark: LMDB page writes and reads against plain files.

Every figure is measured in the same run, on the same bytes, in one temporary
directory on the same disk, so the ratios hold even where absolute rates
drift from run to run::

    seq_fsync       one file: write() every page in order, one fsync at the end
    file_per_page   one file per page: open, write, fsync, close;
                    read: open, readinto the host page
    lmdb            LmdbStorage.put of --request-pages pages per request, all
                    queued at once ("safe": a synced commit per write batch);
                    LmdbStorage.get of the same requests into host pages, with
                    the records in the OS page cache (checksums verified)

Targets (docs: "Figures that count as fast"): LMDB writes >= 50% of the
fsync'd sequential write rate; reads of cached pages >= 2 GB/s into host pages.

    python -m radixcache.bench.storage [--total-mib 256] [--specs small,realistic]
"""

from __future__ import annotations

import argparse
import hashlib
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
import numpy.typing as npt
import torch

from offload.lmdb_storage import LmdbStorage, StorageConfig
from offload.storage import ModelFingerprint
from transfer.host import HostKVBuffer
from transfer.layout import KVSpec

SPECS = {
    # 4 layers x 8 KV heads x 128 dims x fp16 x 16 tokens: 256 KiB pages
    "small": KVSpec(num_layers=4, num_kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16),
    # 32 layers x 8 KV heads x 128 dims x fp16 x 16 tokens (a Llama-3-8B page): 2 MiB
    "realistic": KVSpec(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16),
}
WRITE_TARGET = 0.5  # LMDB write rate / fsync'd sequential write rate
READ_TARGET_GBPS = 2.0  # LMDB reads of cached pages into host pages


def _median_seconds(run: Callable[[], None], repeat: int, setup: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rate(nbytes: int, pages: int, seconds: float) -> dict[str, float]:
    return {"gb_per_s": round(nbytes / seconds / 1e9, 3), "pages_per_s": round(pages / seconds, 1),
            "seconds": round(seconds, 4)}


def _fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _bench_spec(name: str, spec: KVSpec, root: Path, total: int, request: int, repeat: int) -> dict[str, Any]:
    n = max(request, total // spec.page_bytes // request * request)
    nbytes = n * spec.page_bytes
    src = HostKVBuffer(spec, n)
    raw = src.as_bytes()
    raw[:] = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8).reshape(raw.shape)
    dst = HostKVBuffer(spec, n)
    out = dst.as_bytes()

    # (a) one fsync'd sequential file
    seq_dir = root / f"{name}-seq"
    def seq_write() -> None:
        with open(seq_dir / "pages.bin", "wb", buffering=0) as f:
            for i in range(n):
                f.write(raw[i].data)
            os.fsync(f.fileno())
    seq_w = _median_seconds(seq_write, repeat, lambda: _fresh(seq_dir))

    # (b) one file per page
    fpp_dir = root / f"{name}-files"
    def fpp_write() -> None:
        for i in range(n):
            fd = os.open(fpp_dir / f"{i}.page", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, raw[i].data)
                os.fsync(fd)
            finally:
                os.close(fd)
    def fpp_read() -> None:
        for i in range(n):
            with open(fpp_dir / f"{i}.page", "rb", buffering=0) as f:
                f.readinto(out[i].data)
    fpp_w = _median_seconds(fpp_write, repeat, lambda: _fresh(fpp_dir))
    fpp_read()  # warm the page cache
    fpp_r = _median_seconds(fpp_read, repeat)
    assert np.array_equal(out, raw), "file-per-page read back wrong bytes"

    # (c) LMDB
    keys = [hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest() for i in range(n)]
    tokens = np.arange(n * spec.page_size, dtype=np.int32).reshape(n, spec.page_size)
    pages = np.arange(n, dtype=np.int32)
    fingerprint = ModelFingerprint("bench", spec.describe(), 0)
    lmdb_dir = root / f"{name}-lmdb"
    results: dict[str, Any] = {}
    for durability in ("safe", "fast"):
        state: dict[str, LmdbStorage] = {}

        def open_store() -> None:
            if "store" in state:
                state["store"].close()
            _fresh(lmdb_dir)
            config = StorageConfig(path=lmdb_dir, capacity_bytes=2 * nbytes + (64 << 20), durability=durability)
            state["store"] = LmdbStorage(config, spec, fingerprint)

        def lmdb_write() -> None:
            store = state["store"]
            tickets = [store.put(keys[j : j + request], tokens[j : j + request], src, pages[j : j + request], b"")
                       for j in range(0, n, request)]
            for t in tickets:
                t.wait()
                assert t.result() == request, t.error

        def lmdb_read() -> None:
            store = state["store"]
            tickets = [store.get(keys[j : j + request], tokens[j : j + request], dst, pages[j : j + request])
                       for j in range(0, n, request)]
            for t in tickets:
                t.wait()
                assert t.result() == request, t.error

        write_s = _median_seconds(lmdb_write, repeat, open_store)
        out[:] = 0
        lmdb_read()  # warm the page cache
        assert np.array_equal(out, raw), "LMDB read back wrong bytes"
        read_s = _median_seconds(lmdb_read, repeat)
        stats = state["store"].stats()
        state["store"].close()
        results[durability] = {"write": _rate(nbytes, n, write_s), "read": _rate(nbytes, n, read_s),
                               "write_txns_last_run": stats.write_txns}

    seq = _rate(nbytes, n, seq_w)
    fpp = {"write": _rate(nbytes, n, fpp_w), "read": _rate(nbytes, n, fpp_r)}
    safe = results["safe"]
    write_ratio = safe["write"]["gb_per_s"] / seq["gb_per_s"]
    return {
        "page_bytes": spec.page_bytes,
        "spec": spec.describe(),
        "pages": n,
        "bytes": nbytes,
        "request_pages": request,
        "seq_fsync_write": seq,
        "file_per_page": fpp,
        "lmdb_safe": safe,
        "lmdb_fast": results["fast"],
        "ratios": {
            "lmdb_write_vs_seq_fsync": round(write_ratio, 3),
            "lmdb_fast_write_vs_seq_fsync": round(results["fast"]["write"]["gb_per_s"] / seq["gb_per_s"], 3),
            "lmdb_write_vs_file_per_page": round(safe["write"]["gb_per_s"] / fpp["write"]["gb_per_s"], 3),
            "lmdb_read_vs_file_per_page": round(safe["read"]["gb_per_s"] / fpp["read"]["gb_per_s"], 3),
        },
        "meets_targets": {
            "write_ge_50pct_of_seq_fsync": write_ratio >= WRITE_TARGET,
            "cached_read_ge_2_gb_per_s": safe["read"]["gb_per_s"] >= READ_TARGET_GBPS,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--total-mib", type=int, default=256, help="bytes of pages per measurement")
    parser.add_argument("--request-pages", type=int, default=16, help="pages per put/get request")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median reported)")
    parser.add_argument("--specs", default="small,realistic", help=f"comma-separated, of {sorted(SPECS)}")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory (default: system temp)")
    args = parser.parse_args(argv)
    names = [s for s in args.specs.split(",") if s]
    unknown = [s for s in names if s not in SPECS]
    if unknown or not names:
        parser.error(f"unknown spec(s) {unknown}; choose from {sorted(SPECS)}")
    if args.total_mib <= 0 or args.request_pages <= 0 or args.repeat <= 0:
        parser.error("--total-mib, --request-pages and --repeat must be positive")

    report: dict[str, Any] = {
        "benchmark": "storage",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "targets": {"lmdb_write_vs_seq_fsync": WRITE_TARGET, "lmdb_cached_read_gb_per_s": READ_TARGET_GBPS},
        "specs": {},
    }
    with tempfile.TemporaryDirectory(prefix="radixcache-bench-", dir=args.dir) as tmp:
        for name in names:
            report["specs"][name] = _bench_spec(
                name, SPECS[name], Path(tmp), args.total_mib << 20, args.request_pages, args.repeat
            )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Copy-engine benchmark: page copies against a plain copy of the same bytes.

Prints one JSON object. On the CPU it times the CPU copy engine (submit, then
wait on the ticket) gathering scattered device pages into a run of host pages
(as a fresh host allocation hands them out), scattering them back into other
scattered device pages, and the worst case where both sides are scattered;
each against a single contiguous ``copy_`` of a same-size tensor, measured
interleaved in the same run, and reports the ratios (target: >= 0.5). With
CUDA it also times the CUDA engine's device-to-host and host-to-device copies
against plain pinned copies of the same bytes (target: >= 0.8).

    radixcache bench copy [--quick] [--pages 64] [--repeat 7] ...
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Run as a script, this file's folder comes first on sys.path, where this
    # file would shadow the standard library's ``copy``: put the repo root there.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from radixcache.cli.bench import run_note, with_note
from radixcache.cli.options import non_negative_int, positive_int, power_of_two
from radixcache.cli.parser import CliParser
from radixcache.transfer.allocator import PageAllocator
from radixcache.transfer.engine import CopyEngine, CpuCopyEngine
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer, KVSpec

CPU_TARGET = 0.5
CUDA_TARGET = 0.8


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = CliParser(prog="radixcache bench copy", description=__doc__)
    p.add_argument("--layers", type=positive_int, default=32, help="model layers")
    p.add_argument("--kv-heads", type=positive_int, default=8, help="KV heads per layer")
    p.add_argument("--head-dim", type=positive_int, default=128, help="head dimension")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="KV dtype")
    p.add_argument("--page-size", type=power_of_two, default=16, help="tokens per page")
    p.add_argument("--pages", type=positive_int, default=64, help="pages per copy")
    p.add_argument("--device-pages", type=non_negative_int, default=0,
                   help="device pool (0: 3x --pages)")
    p.add_argument("--host-pages", type=non_negative_int, default=0,
                   help="host pool (0: 2x --pages)")
    p.add_argument("--repeat", type=positive_int, default=7, help="timed runs per figure")
    p.add_argument("--seed", type=int, default=0, help="seed of the page choice")
    p.add_argument("--no-cuda", action="store_true", help="skip the CUDA part even with a GPU")
    p.add_argument("--quick", action="store_true", help="8 pages, 3 repeats: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.pages, args.repeat = 8, 3
    args.device_pages = args.device_pages or 3 * args.pages
    args.host_pages = args.host_pages or 2 * args.pages
    if args.pages > min(args.device_pages, args.host_pages):
        p.error(f"--pages must be in [1, {min(args.device_pages, args.host_pages)}] "
                f"(the smaller pool), got {args.pages}")
    return args


def _seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _interleaved(cases: dict[str, Callable[[], None]], repeat: int) -> dict[str, float]:
    """Median seconds per case; cases alternate so drift hits all of them alike."""
    for fn in cases.values():  # warm-up: page faults, thread pools, allocator
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            times[name].append(_seconds(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def _copy(
    engine: CopyEngine, direction: str, src: np.ndarray, dst: np.ndarray
) -> Callable[[], None]:
    submit = engine.device_to_host if direction == "d2h" else engine.host_to_device

    def run() -> None:
        ticket = submit(src, dst)
        ticket.wait()
        if ticket.error is not None:
            raise ticket.error

    return run


def _report(
    seconds: dict[str, float], nbytes: int, baseline: str, target: float
) -> dict[str, object]:
    gbps = {name: nbytes / s / 1e9 for name, s in seconds.items()}
    out: dict[str, object] = {f"{name}_gbps": float(f"{v:.3g}") for name, v in gbps.items()}
    ratios = {name: gbps[name] / gbps[baseline] for name in gbps if name != baseline}
    out.update({f"{name}_ratio": round(r, 3) for name, r in ratios.items()})
    out["target_ratio"] = target
    out["meets_target"] = all(r >= target for name, r in ratios.items() if "worst" not in name)
    return out


def _bench_cpu(
    spec: KVSpec, args: argparse.Namespace, rng: np.random.Generator
) -> dict[str, object]:
    n = args.pages
    dev = DeviceKVBuffer(spec, args.device_pages)
    host = HostKVBuffer(spec, args.host_pages)
    dev.k.uniform_()
    dev.v.uniform_()
    host_run = PageAllocator(args.host_pages, "host").allocate(n)  # what a save writes into
    assert host_run is not None
    scattered_dev = rng.choice(args.device_pages, n, replace=False).astype(np.int32)
    other_dev = rng.choice(args.device_pages, n, replace=False).astype(np.int32)
    scattered_host = rng.choice(args.host_pages, n, replace=False).astype(np.int32)
    nbytes = n * spec.page_bytes
    src = torch.empty(nbytes // spec.itemsize, dtype=spec.dtype).uniform_()
    dst = torch.empty_like(src)

    def memcpy() -> None:
        dst.copy_(src)

    engine = CpuCopyEngine(dev, host)
    try:
        seconds = _interleaved(
            {
                "memcpy": memcpy,
                "device_to_host": _copy(engine, "d2h", scattered_dev, host_run),
                "host_to_device": _copy(engine, "h2d", host_run, other_dev),
                "worst_device_to_host": _copy(engine, "d2h", scattered_dev, scattered_host),
                "worst_host_to_device": _copy(engine, "h2d", scattered_host, other_dev),
            },
            args.repeat,
        )
        first = int(host_run[0])  # the last copy wrote host pages scattered_host from scattered_dev
        engine.device_to_host(scattered_dev[:1], np.array([first], np.int32)).wait()
        assert torch.equal(host.data[first, 0], dev.k[:, int(scattered_dev[0])]), "copy is wrong"
    finally:
        engine.close()
    return _report(seconds, nbytes, "memcpy", CPU_TARGET)


def _bench_cuda(
    spec: KVSpec, args: argparse.Namespace, rng: np.random.Generator
) -> dict[str, object]:
    from radixcache.transfer.cuda_engine import CudaCopyEngine
    from radixcache.transfer.pinned import allocate_pinned

    n = args.pages
    dev = DeviceKVBuffer(spec, args.device_pages, "cuda")
    host = HostKVBuffer(spec, args.host_pages, pin=True)
    dev.k.normal_()
    dev.v.normal_()
    host_run = np.arange(n, dtype=np.int32)
    scattered_dev = rng.choice(args.device_pages, n, replace=False).astype(np.int32)
    other_dev = rng.choice(args.device_pages, n, replace=False).astype(np.int32)
    nbytes = n * spec.page_bytes
    plain_dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    plain_host = allocate_pinned(nbytes).tensor

    def plain(dst: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()

        return run

    engine = CudaCopyEngine(dev, host)
    try:
        seconds = _interleaved(
            {
                "plain_d2h": plain(plain_host, plain_dev),
                "plain_h2d": plain(plain_dev, plain_host),
                "device_to_host": _copy(engine, "d2h", scattered_dev, host_run),
                "host_to_device": _copy(engine, "h2d", host_run, other_dev),
            },
            args.repeat,
        )
    finally:
        engine.close()
    gbps = {name: nbytes / s / 1e9 for name, s in seconds.items()}
    d2h, h2d = (
        gbps["device_to_host"] / gbps["plain_d2h"],
        gbps["host_to_device"] / gbps["plain_h2d"],
    )
    out: dict[str, object] = {f"{name}_gbps": float(f"{v:.3g}") for name, v in gbps.items()}
    out.update(
        device_to_host_ratio=round(d2h, 3),
        host_to_device_ratio=round(h2d, 3),
        target_ratio=CUDA_TARGET,
        meets_target=d2h >= CUDA_TARGET and h2d >= CUDA_TARGET,
        device=torch.cuda.get_device_name(),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    note = run_note(args.quick)  # before the run adds its own load
    spec = KVSpec(
        num_layers=args.layers,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        dtype=getattr(torch, args.dtype),
        page_size=args.page_size,
    )
    rng = np.random.default_rng(args.seed)
    result: dict[str, object] = {
        "benchmark": "copy",
        "spec": spec.describe(),
        "page_bytes": spec.page_bytes,
        "pages_per_copy": args.pages,
        "bytes_per_copy": args.pages * spec.page_bytes,
        "repeat": args.repeat,
        "torch_threads": torch.get_num_threads(),
        "cpu": _bench_cpu(spec, args, rng),
        "cuda": None,
    }
    if torch.cuda.is_available() and not args.no_cuda:
        result["cuda"] = _bench_cuda(spec, args, rng)
    print(json.dumps(with_note(result, note)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

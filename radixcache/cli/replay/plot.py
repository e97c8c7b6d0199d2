"""The ``radixcache replay`` command's front end: the text report, the
progress bar, JSON output, capacity sweeps and their CSV, JSON and PNG
(``radixcache.cli.replay.run`` does the replaying, ``capacity`` says what a
sweep's figures mean in GB and in what context, ``figure`` draws the PNG).

A sweep replays the same trace once per capacity of one tier (the others
fixed, or the host pool scaled with the device pool by ``--host-ratio``)::

    --sweep 1024,2048,4096            device pages
    --sweep host=0,4096,16384         host pages (device fixed)
    --sweep storage=0,65536           storage pages (device and host fixed)

matplotlib is imported only to draw the PNG (``pip install 'radixcache[plot]'``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from radixcache.cli.parser import UsageError, describe
from radixcache.cli.quota_option import describe_quotas
from radixcache.cli.hicache_options import GB
from radixcache.cli.replay.capacity import Planning, Sweep, ceiling
from radixcache.cli.replay.presets import DEFAULT_MODEL, MODEL_PRESETS
from radixcache.cli.replay.figure import plot_sweep, require_matplotlib
from radixcache.cli.replay.run import ReplayConfig, ReplayResult, replay
from radixcache.cli.replay.trace import TraceRequest, load_trace
from radixcache.offload import StorageOpenError

TIERS = ("device", "host", "storage")


# ---------------------------------------------------------------------- text
@contextmanager
def progress_bar(total: int, label: str, quiet: bool) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr while the block runs, as a callback taking
    the number of requests done; None with ``quiet`` or when stderr is not a
    terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TaskProgressColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)


def format_report(trace: str, result: ReplayResult) -> str:
    """The human summary of one replay."""
    c, f = result.config, result.figures
    tiers = f"host {c.host_pages or '-'}, storage {c.storage_pages or '-'}"
    if c.host_pages:
        tiers += f" ({c.write_policy})"
    pct = f.ratio
    lines = [
        (f"replay of {trace}: {f.requests} requests counted ({f.warmup_requests} warmup, "
         f"{f.rejected_requests} rejected)"),
        (f"  pages of {c.page_size} tokens: device {c.num_device_pages}, {tiers}; "
         f"eviction {c.eviction_policy}; " + ("with decode" if c.decode else "prefill only")
         + (f"; quotas {describe_quotas(c.quotas)}" if c.quotas is not None else "")),
        f"  prompt tokens   {f.prompt_tokens:>12,}",
        (f"  hit tokens      {f.hit_tokens:>12,}  {pct(f.hit_tokens):6.2%}  (device "
         f"{pct(f.hit_device_tokens):.2%}, host {pct(f.hit_host_tokens):.2%}, storage "
         f"{pct(f.hit_storage_tokens):.2%})"),
        (f"  prefill saved   {f.saved_tokens:>12,}  {pct(f.saved_tokens):6.2%}  (computed "
         f"{f.prompt_tokens - f.saved_tokens:,})"),
        (f"  evicted         device {f.device_evicted_pages:,} pages, host "
         f"{f.host_evicted_pages:,}, storage {f.storage_evicted_pages:,}"),
        f"  wall time       {result.wall_s:.1f} s",
    ]
    return "\n".join(lines)


def write_json(path: str, payload: object) -> None:
    """Write ``payload`` as indented JSON to ``path`` ('-': stdout)."""
    text = json.dumps(payload, indent=2)
    if path == "-":
        print(text)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


# ---------------------------------------------------------------------- sweeps
def parse_sweep(text: str) -> Sweep:
    """``[TIER=]N,N,...`` (TIER defaults to device); ValueError if malformed."""
    tier, sep, rest = text.partition("=")
    tier, rest = (tier.strip(), rest) if sep else ("device", text)
    if tier not in TIERS:
        raise ValueError(f"--sweep: tier must be one of {', '.join(TIERS)}, got {tier!r}")
    try:
        values = tuple(int(v) for v in rest.split(","))
    except ValueError:
        raise ValueError(
            f"--sweep: capacities must be ints separated by commas, got {rest!r}"
        ) from None
    lowest = 1 if tier == "device" else 0
    if min(values) < lowest or len(set(values)) != len(values):
        raise ValueError(
            f"--sweep: {tier} capacities must be distinct ints >= {lowest}, got {rest!r}"
        )
    return Sweep(tier, values)


def sweep_configs(base: ReplayConfig, sweep: Sweep, host_ratio: float | None) -> list[ReplayConfig]:
    """One config per point (validated now, before any replay runs)."""
    if host_ratio is not None and sweep.tier != "device":
        raise ValueError("--host-ratio scales the host pool in a device sweep only")
    out = []
    for v in sweep.values:
        if sweep.tier == "device":
            host = base.host_pages if host_ratio is None else max(1, int(host_ratio * v))
            out.append(replace(base, device_pages=v, host_pages=host))
        elif sweep.tier == "host":
            out.append(replace(base, host_pages=v))
        else:
            out.append(replace(base, storage_pages=v))
    return out


def _row(result: ReplayResult, plan: Planning) -> dict[str, object]:
    c = result.config
    ps = c.page_size
    row: dict[str, object] = {
        "device_pages": c.num_device_pages, "device_gb": round(plan.gb(c.num_device_pages, ps), 3),
        "host_pages": c.host_pages, "host_gb": round(plan.gb(c.host_pages, ps), 3),
        "storage_pages": c.storage_pages, "storage_gb": round(plan.gb(c.storage_pages, ps), 3),
        "page_size": ps, "kv_bytes_per_token": plan.kv_bytes_per_token, "model": plan.model,
        "write_policy": c.write_policy if c.host_pages else "", "warmup_fraction": c.warmup,
        "trace_requests": plan.trace_requests, "replayed_requests": plan.replayed_requests,
        "ceiling_hit_ratio": round(plan.ceiling, 6),
    }
    row.update(result.figures.to_dict())
    row["wall_s"] = round(result.wall_s, 3)
    return row


def format_table(results: Sequence[ReplayResult], sweep: Sweep, plan: Planning) -> str:
    """The sweep's context, then a Markdown table with one row per point."""
    context = plan.context(results[0].config if results else ReplayConfig(), results)
    head = (f"| {sweep.tier} capacity (pages) | {sweep.tier} capacity (GB) | hit ratio | device "
            "| host | storage | prefill saved | device evictions | rejected | wall s |")
    lines = [*context, "", head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for value, r in zip(sweep.values, results):
        f = r.figures
        lines.append(
            f"| {value:,} | {plan.gb(value, r.config.page_size):,.1f} "
            f"| {f.ratio(f.hit_tokens):.1%} "
            f"| {f.ratio(f.hit_device_tokens):.1%} | {f.ratio(f.hit_host_tokens):.1%} "
            f"| {f.ratio(f.hit_storage_tokens):.1%} | {f.ratio(f.saved_tokens):.1%} "
            f"| {f.device_evicted_pages:,} | {f.rejected_requests:,} | {r.wall_s:.1f} |"
        )
    return "\n".join(lines)


def write_sweep(
    results: Sequence[ReplayResult], sweep: Sweep, prefix: str, plan: Planning,
    plot: bool = True,
) -> list[str]:
    """Write PREFIX.csv, PREFIX.json and (with ``plot``) PREFIX.png; returns the paths."""
    rows = [_row(r, plan) for r in results]
    paths = [f"{prefix}.csv", f"{prefix}.json"]
    with open(paths[0], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_json(paths[1], {
        "trace": plan.trace,
        "trace_requests": plan.trace_requests,
        "replayed_requests": plan.replayed_requests,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "model": plan.model,
        "ceiling_hit_ratio": plan.ceiling,
        "context": plan.context(results[0].config, results),
        "sweep": {"tier": sweep.tier, "values": list(sweep.values)},
        "points": [r.to_dict() for r in results],
    })
    if plot:
        paths.append(f"{prefix}.png")
        plot_sweep(results, sweep, paths[2], plan)
    return paths


# ---------------------------------------------------------------------- command
def _host_pages(args: argparse.Namespace, device_pages: int) -> int:
    if args.host_ratio is not None:
        return max(1, int(args.host_ratio * device_pages))
    if args.host_gb is not None:  # HiCache's --hicache-size, in pages of the modelled KV
        return max(1, int(args.host_gb * GB) // (kv_bytes_per_token(args) * args.page_size))
    return int(args.host_pages)


def kv_bytes_per_token(args: argparse.Namespace) -> int:
    """--kv-bytes-per-token, else the --model preset's (default: Llama-3-8B)."""
    if args.kv_bytes_per_token is not None:
        return int(args.kv_bytes_per_token)
    return MODEL_PRESETS[args.model or DEFAULT_MODEL]


def _model_label(args: argparse.Namespace) -> str:
    if args.kv_bytes_per_token is not None:
        return "--kv-bytes-per-token" if args.model is None else f"--kv-bytes-per-token, not {args.model}"
    return f"{args.model or DEFAULT_MODEL}, fp16"


def _config(args: argparse.Namespace) -> ReplayConfig:
    device = args.device_pages
    dev = ReplayConfig(page_size=args.page_size, device_pages=device).num_device_pages
    return ReplayConfig(
        page_size=args.page_size, device_pages=device, host_pages=_host_pages(args, dev),
        storage_pages=args.storage_pages, storage_path=args.storage_path,
        write_policy=args.write_policy, write_threshold=args.write_threshold,
        prefetch_policy=args.prefetch_policy, eviction_policy=args.eviction_policy,
        block_size=args.block_size, warmup=args.warmup, decode=args.decode, quotas=args.quotas,
    )


def _replay(requests: Sequence[TraceRequest], config: ReplayConfig, label: str,
            quiet: bool) -> ReplayResult:
    """One replay; UsageError if its storage folder cannot be used."""
    with progress_bar(len(requests), label, quiet) as progress:
        try:
            return replay(requests, config, progress)
        except StorageOpenError as err:  # unwritable, read-only or held by another process
            raise UsageError(describe(err)) from None


@contextmanager
def _writing(path: str) -> Iterator[None]:
    """An output that cannot be written is the user's mistake: UsageError."""
    try:
        yield
    except BrokenPipeError:  # stdout's reader left: not a mistake
        raise
    except OSError as err:
        raise UsageError(f"cannot write {path!r}: {err.strerror or err}") from None


def run_command(args: argparse.Namespace) -> int:
    """``radixcache replay``: 0 on success; UsageError for bad input or options."""
    try:
        if args.sweep is not None and (args.json is not None or args.storage_path is not None):
            raise ValueError("--json and --storage-path are for single runs; a sweep "
                             "writes --out PREFIX.{csv,json,png} and uses fresh stores")
        base = _config(args)
        sweep = parse_sweep(args.sweep) if args.sweep is not None else None
        points = sweep_configs(base, sweep, args.host_ratio) if sweep else []
        if sweep and not args.no_plot:
            require_matplotlib()
        whole = load_trace(args.trace, args.block_size)
        requests = whole[: args.limit] if args.limit is not None else whole
    except (ValueError, OSError, ImportError) as err:
        raise UsageError(describe(err)) from None
    if sweep is None:
        result = _replay(requests, base, "replay", args.quiet)
        to_stdout = args.json == "-"  # then stdout is JSON only
        print(format_report(args.trace, result), file=sys.stderr if to_stdout else sys.stdout)
        if args.json is not None:
            with _writing(args.json):
                write_json(args.json, {"trace": args.trace, **result.to_dict()})
        return 0
    results = []
    for i, config in enumerate(points):
        label = f"{sweep.tier}={sweep.values[i]} [{i + 1}/{len(points)}]"
        results.append(_replay(requests, config, label, args.quiet))
    plan = Planning(trace=args.trace, trace_requests=len(whole), replayed_requests=len(requests),
                    kv_bytes_per_token=kv_bytes_per_token(args), model=_model_label(args),
                    ceiling=ceiling(requests, base))
    print(format_table(results, sweep, plan))
    with _writing(args.out):
        written = write_sweep(results, sweep, args.out, plan, plot=not args.no_plot)
    print("wrote " + ", ".join(written))
    return 0

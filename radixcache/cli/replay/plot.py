"""The ``radixcache replay`` command's front end: the text report, the
progress bar, JSON output, capacity sweeps and their CSV, JSON and PNG
(``radixcache.cli.replay.run`` does the replaying).

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
from dataclasses import dataclass, replace

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
from radixcache.cli.hicache_options import GB
from radixcache.cli.replay.run import ReplayConfig, ReplayResult, replay
from radixcache.cli.replay.trace import TraceRequest, load_trace
from radixcache.offload import StorageOpenError

TIERS = ("device", "host", "storage")
PLOT_HINT = "the sweep plot needs matplotlib: pip install 'radixcache[plot]' (or pass --no-plot)"


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
         f"eviction {c.eviction_policy}; " + ("with decode" if c.decode else "prefill only")),
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
@dataclass(frozen=True, slots=True)
class Sweep:
    tier: str  # whose capacity varies: device, host or storage
    values: tuple[int, ...]  # its capacities in pages, in the order given


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


def _row(result: ReplayResult) -> dict[str, object]:
    c = result.config
    row: dict[str, object] = {"device_pages": c.num_device_pages, "host_pages": c.host_pages,
                              "storage_pages": c.storage_pages, "page_size": c.page_size}
    row.update(result.figures.to_dict())
    row["wall_s"] = round(result.wall_s, 3)
    return row


def format_table(results: Sequence[ReplayResult], sweep: Sweep) -> str:
    """A Markdown table of the sweep, one row per point."""
    head = (f"| {sweep.tier} pages | tokens | hit ratio | device | host | storage "
            "| prefill saved | device evictions | wall s |")
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for value, r in zip(sweep.values, results):
        f = r.figures
        lines.append(
            f"| {value:,} | {value * r.config.page_size:,} | {f.ratio(f.hit_tokens):.1%} "
            f"| {f.ratio(f.hit_device_tokens):.1%} | {f.ratio(f.hit_host_tokens):.1%} "
            f"| {f.ratio(f.hit_storage_tokens):.1%} | {f.ratio(f.saved_tokens):.1%} "
            f"| {f.device_evicted_pages:,} | {r.wall_s:.1f} |"
        )
    return "\n".join(lines)


def write_sweep(
    results: Sequence[ReplayResult], sweep: Sweep, prefix: str, trace: str, plot: bool = True
) -> list[str]:
    """Write PREFIX.csv, PREFIX.json and (with ``plot``) PREFIX.png; returns the paths."""
    rows = [_row(r) for r in results]
    paths = [f"{prefix}.csv", f"{prefix}.json"]
    with open(paths[0], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_json(paths[1], {
        "trace": trace,
        "sweep": {"tier": sweep.tier, "values": list(sweep.values)},
        "points": [r.to_dict() for r in results],
    })
    if plot:
        paths.append(f"{prefix}.png")
        plot_sweep(results, sweep, paths[2], trace)
    return paths


# ---------------------------------------------------------------------- plot
def require_matplotlib() -> None:
    """ImportError with the install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(PLOT_HINT) from None


def plot_sweep(results: Sequence[ReplayResult], sweep: Sweep, path: str, trace: str) -> None:
    """Hit ratio against capacity: one band per tier, the total on top."""
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    pairs = sorted(zip(sweep.values, results), key=lambda p: p[0])
    x = [v for v, _ in pairs]
    figs = [r.figures for _, r in pairs]
    bands = [("device", [f.ratio(f.hit_device_tokens) for f in figs]),
             ("host", [f.ratio(f.hit_host_tokens) for f in figs]),
             ("storage", [f.ratio(f.hit_storage_tokens) for f in figs])]
    bands = [b for b in bands if any(b[1])] or bands[:1]
    total = [sum(vals) for vals in zip(*(b[1] for b in bands))]
    fig = Figure(figsize=(7.5, 4.5), dpi=120)
    ax = fig.add_subplot()
    log = x[0] > 0 and len(x) > 1 and x[-1] / x[0] >= 8
    if len(bands) > 1:
        ax.stackplot(x, *(b[1] for b in bands), labels=[f"{b[0]} hits" for b in bands], alpha=0.45)
    label = "all tiers" if len(bands) > 1 else "hit ratio"
    ax.plot(x, total, marker="o", color="black", label=label)
    for xi, yi in zip(x, total):
        ax.annotate(f"{yi:.1%}", (xi, yi), textcoords="offset points", xytext=(0, 7),
                    ha="center", fontsize=8)
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:,}" for v in x], rotation=30, fontsize=8)
    ax.minorticks_off()
    ax.set_ylim(0, max(1.0, max(total) * 1.08))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    page = pairs[0][1].config.page_size
    ax.set_xlabel(f"{sweep.tier} capacity (pages of {page} tokens)")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_title(f"prefix-cache hit ratio: {trace.rsplit('/', 1)[-1]}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


# ---------------------------------------------------------------------- command
def _host_pages(args: argparse.Namespace, device_pages: int) -> int:
    if args.host_ratio is not None:
        return max(1, int(args.host_ratio * device_pages))
    if args.host_gb is not None:  # HiCache's --hicache-size, in pages of the modelled KV
        return max(1, int(args.host_gb * GB) // (args.kv_bytes_per_token * args.page_size))
    return int(args.host_pages)


def _config(args: argparse.Namespace) -> ReplayConfig:
    device = args.device_pages
    dev = ReplayConfig(page_size=args.page_size, device_pages=device).num_device_pages
    return ReplayConfig(
        page_size=args.page_size, device_pages=device, host_pages=_host_pages(args, dev),
        storage_pages=args.storage_pages, storage_path=args.storage_path,
        write_policy=args.write_policy, write_threshold=args.write_threshold,
        prefetch_policy=args.prefetch_policy, eviction_policy=args.eviction_policy,
        block_size=args.block_size, warmup=args.warmup, decode=args.decode,
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
        requests = load_trace(args.trace, args.block_size, args.limit)
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
    print(format_table(results, sweep))
    with _writing(args.out):
        written = write_sweep(results, sweep, args.out, args.trace, plot=not args.no_plot)
    print("wrote " + ", ".join(written))
    return 0

"""The PNG of a capacity sweep: hit ratio against capacity, in GB and pages.

What the picture states, so that it sizes hardware on its own: capacity in GB
of KV (bottom axis, at the modelled KV bytes per token) and in pages (top
axis), both with their scale named; one band per tier and the total; the
trace's ceiling (a cache that never evicts) as a dashed line; and, under the
title, the part of the trace replayed, the warm-up, the host tier's size and
write policy, and the requests rejected.

matplotlib is imported only here, to draw (``pip install 'radixcache[plot]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixcache.cli.replay.capacity import Planning, Sweep
from radixcache.cli.replay.run import ReplayResult

PLOT_HINT = "the sweep plot needs matplotlib: pip install 'radixcache[plot]' (or pass --no-plot)"


def require_matplotlib() -> None:
    """ImportError with the install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(PLOT_HINT) from None


def plot_sweep(results: Sequence[ReplayResult], sweep: Sweep, path: str, plan: Planning) -> None:
    """Write the sweep's PNG to ``path``."""
    draw_sweep(results, sweep, plan).savefig(path)


def draw_sweep(results: Sequence[ReplayResult], sweep: Sweep, plan: Planning) -> Any:
    """Hit ratio against capacity: one band per tier, the total, the ceiling
    (a matplotlib ``Figure``)."""
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    pairs = sorted(zip(sweep.values, results), key=lambda p: p[0])
    page = pairs[0][1].config.page_size
    x = [plan.gb(v, page) for v, _ in pairs]
    figs = [r.figures for _, r in pairs]
    bands = [("device", [f.ratio(f.hit_device_tokens) for f in figs]),
             ("host", [f.ratio(f.hit_host_tokens) for f in figs]),
             ("storage", [f.ratio(f.hit_storage_tokens) for f in figs])]
    bands = [b for b in bands if any(b[1])] or bands[:1]
    total = [sum(vals) for vals in zip(*(b[1] for b in bands))]
    fig = Figure(figsize=(8.5, 5.6), dpi=120)
    ax = fig.add_subplot()
    log = x[0] > 0 and len(x) > 1 and x[-1] / x[0] >= 8
    if len(bands) > 1:
        ax.stackplot(x, *(b[1] for b in bands), labels=[f"{b[0]} hits" for b in bands], alpha=0.45)
    ax.plot(x, total, marker="o", color="black",
            label="hit ratio, all tiers" if len(bands) > 1 else "hit ratio")
    for (value, r), xi, yi in zip(pairs, x, total):
        rejected = r.figures.rejected_requests
        text = f"{yi:.1%}" + (f"\n{rejected:,} rejected" if rejected else "")
        ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=8)
    ax.axhline(plan.ceiling, color="tab:red", linestyle="--", linewidth=1.2,
               label=f"trace ceiling (a cache that never evicts): {plan.ceiling:.1%}")
    scale = "log scale, base 2" if log else "linear scale"
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:,.1f}" for v in x], rotation=30, fontsize=8)
    ax.minorticks_off()
    ax.set_ylim(0, max(1.0, max(total) * 1.08))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(f"{sweep.tier} capacity, GB of KV at {plan.kv_label()} ({scale})", fontsize=9)
    ax.set_ylabel("prompt tokens served from cache (linear scale)", fontsize=9)
    per_gb = 1e9 / (page * plan.kv_bytes_per_token)  # pages per GB

    def to_pages(gb: Any) -> Any:
        return gb * per_gb

    def to_gb(pages: Any) -> Any:
        return pages / per_gb

    top = ax.secondary_xaxis("top", functions=(to_pages, to_gb))
    top.set_xticks([v for v, _ in pairs], [f"{v:,}" for v, _ in pairs], fontsize=7)
    top.set_xlabel(f"{sweep.tier} capacity, pages of {page} tokens (same {scale})", fontsize=9)
    context = plan.context(pairs[0][1].config, [r for _, r in pairs])
    name = plan.trace.rsplit("/", 1)[-1]
    ax.set_title(f"prefix-cache hit ratio: {name}, {plan.trace_part()}\n"
                 + "\n".join(context[1:3] + context[4:]), fontsize=8, loc="left")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig

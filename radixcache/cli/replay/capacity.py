"""What a capacity sweep tells a planner who buys memory, not pages.

A sweep point's capacity in pages becomes bytes of KV through the KV size of
one token (``--kv-bytes-per-token``, or ``--model`` for a preset)::

    GB = pages * page_size (tokens) * KV bytes per token / 1e9

and every table, CSV row and plot of a sweep carries the context its figures
depend on: the part of the trace replayed (``--limit``), the warm-up (requests
that fill the cache but are not counted), the host tier's size and write
policy, the requests rejected (a prompt larger than the device pool), and the
trace's ceiling: the hit ratio of a cache that never evicts (the same
requests, counted the same way, through a device pool that holds them all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from radixcache.cli.quota_option import describe_quotas
from radixcache.cli.replay.run import ReplayConfig, ReplayResult, replay
from radixcache.cli.replay.trace import TraceRequest

GB = 10**9  # planners' gigabytes (as HiCache's --hicache-size)


@dataclass(frozen=True, slots=True)
class Sweep:
    """A sweep: the tier whose capacity varies, and its capacities."""

    tier: str  # whose capacity varies: device, host or storage
    values: tuple[int, ...]  # its capacities in pages, in the order given


@dataclass(frozen=True, slots=True)
class Planning:
    """The context of a sweep's figures (module docstring)."""

    trace: str  # the trace's path as given
    trace_requests: int  # requests in the whole trace
    replayed_requests: int  # of those, the first ones replayed (--limit)
    kv_bytes_per_token: int  # modelled KV size of one token
    model: str  # what it models: a preset name, or "custom"
    ceiling: float  # hit ratio of a cache that never evicts (counted requests)

    def gb(self, pages: int, page_size: int) -> float:
        """GB of KV that ``pages`` pages of ``page_size`` tokens hold."""
        return pages * page_size * self.kv_bytes_per_token / GB

    def trace_part(self) -> str:
        if self.replayed_requests == self.trace_requests:
            return f"all {self.trace_requests:,} requests"
        return f"first {self.replayed_requests:,} of {self.trace_requests:,} requests (--limit)"

    def kv_label(self) -> str:
        return f"{self.kv_bytes_per_token:,} B of KV per token ({self.model})"

    def context(self, base: ReplayConfig, results: Sequence[ReplayResult]) -> list[str]:
        """The lines every sweep output states before its figures."""
        warm = results[0].figures.warmup_requests if results else 0
        rejected = [r.figures.rejected_requests for r in results]
        c = base
        host = "no host tier"
        if c.host_pages:
            host = (f"host tier {c.host_pages:,} pages ({self.gb(c.host_pages, c.page_size):.1f} GB)"
                    f", write policy {c.write_policy}")
        quotas = [] if c.quotas is None else [f"quotas: {describe_quotas(c.quotas)}"]
        return [
            *quotas,
            f"trace: {self.trace}, {self.trace_part()}",
            f"warm-up: first {warm:,} requests ({c.warmup:.0%}) fill the cache and are not counted",
            f"pages of {c.page_size} tokens; {self.kv_label()}; {host}; eviction {c.eviction_policy}",
            f"trace ceiling (a cache that never evicts): {self.ceiling:.1%} hit ratio",
            ("rejected requests (prompt larger than the device pool): "
             + (", ".join(f"{n:,}" for n in rejected) if any(rejected) else "none")),
        ]


def ceiling(requests: Sequence[TraceRequest], base: ReplayConfig) -> float:
    """The trace's hit ratio through a device pool that holds every prompt
    and output at once (nothing is ever evicted), counted as ``base`` counts
    (same warm-up, page size, decode)."""
    pages = sum(-(-(r.input_length + (r.output_length if base.decode else 0)) // base.page_size)
                for r in requests)
    unbounded = replace(base, device_pages=pages + 1, host_pages=0, storage_pages=0,
                        storage_path=None, quotas=None)
    figures = replay(requests, unbounded).figures
    return figures.ratio(figures.hit_tokens)

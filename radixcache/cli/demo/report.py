"""What ``radixcache demo`` prints: a line per turn, the summary tables (rich),
and the size of the store it leaves on disk."""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass, fields

from rich.console import Console
from rich.table import Table

from radixcache.cache import RadixCache
from radixcache.events.publisher import EventPublisher
from radixcache.tenants import TenantQuota


@dataclass(slots=True)
class Totals:
    """What the demo counted, in tokens, over the requests it served."""

    requests: int = 0
    prompt_tokens: int = 0  # tokens of all prompts
    computed_tokens: int = 0  # prefill tokens actually computed
    device_hits: int = 0  # prompt tokens served from each tier
    host_hits: int = 0
    storage_hits: int = 0
    checked_tokens: int = 0  # cached tokens whose KV was verified
    wrong_tokens: int = 0  # of those, tokens whose KV was not what was computed for them
    seconds: float = 0.0


def _console() -> Console:
    """stdout, plain text when it is not a terminal (logs, pipes, tests)."""
    return Console(highlight=False, soft_wrap=True)


def report_turn(turn: int, turns: int, t: Totals, cache: RadixCache, elapsed: float,
                storage: str = "LMDB") -> None:
    """One line: requests so far, hit ratio per tier, free pages."""
    s = cache.stats()
    ts = cache.tier_stats()
    assert ts is not None
    n = max(t.prompt_tokens, 1)
    hit = (t.device_hits + t.host_hits + t.storage_hits) / n
    print(f"  turn {turn}/{turns}  {t.requests:5d} requests  {elapsed:6.1f} s  "
          f"hit {hit:6.1%} (device {t.device_hits / n:5.1%}, host {t.host_hits / n:5.1%}, "
          f"{storage} {t.storage_hits / n:5.1%})  device free {s.free_pages}/{s.pool_pages}  "
          f"host free {ts.host_free_pages}/{ts.host_pages}", flush=True)


def summary(cache: RadixCache, t: Totals, publisher: EventPublisher, elapsed: float,
            storage: str = "LMDB") -> None:
    """Hits and evictions per tier, pages moved per direction, the totals."""
    s = cache.stats()
    ts = cache.tier_stats()
    assert ts is not None and ts.storage is not None
    st = ts.storage
    pct = 100 / max(t.prompt_tokens, 1)
    out = _console()
    print(f"\nsummary ({t.requests} requests in {elapsed:.1f} s)")
    tiers = Table("tier", "hit tokens", "share", "evicted pages")
    for name, hits, evicted in (("device", t.device_hits, s.evicted_pages),
                                ("host", t.host_hits, ts.host_evicted_pages),
                                (storage, t.storage_hits, st.evicted)):
        tiers.add_row(name, f"{hits}", f"{hits * pct:.1f}%", f"{evicted}")
    for col in tiers.columns[1:]:
        col.justify = "right"
    out.print(tiers)
    moved = Table("moved", "pages", "MiB", "MB/s*")
    for direction, pages in ts.pages_moved.items():
        mb = ts.bytes_moved[direction] / 2**20
        rate = ts.bytes_per_second[direction] / 1e6
        moved.add_row(direction, f"{pages}", f"{mb:.1f}", f"{rate:.1f}")
    for col in moved.columns[1:]:
        col.justify = "right"
    out.print(moved)
    print("  * bytes over the summed submit-to-harvest time of the jobs (queueing included)")
    saved = t.prompt_tokens - t.computed_tokens
    print(f"  prefill avoided: {saved} of {t.prompt_tokens} prompt tokens ({saved * pct:.1f}%); "
          f"{t.checked_tokens} cached tokens verified bit-exact, none wrong")
    print(f"  {stored_pages(cache, storage)}; {st.corrupt} corrupt, {st.decrypt_failures} "
          f"unreadable, {st.failed_ops} failed ops; "
          f"abandoned loads {ts.abandoned_tokens} tokens, failed jobs {ts.failed_jobs}")
    p = publisher.stats()
    print(f"  events: {p.published} batches published, {p.dropped} dropped")


def tenant_lines(cache: RadixCache) -> list[str]:
    """With quotas on (``--quotas``): a line per tenant, its hit ratio, the
    device pages it holds, the pages its limit made it evict, and its quota;
    none without."""
    if not cache.tenants.quotas_on:
        return []
    lines = ["  tenants (with quotas):"]
    for name, t in sorted(cache.tenants.stats().items()):
        c = t.counters
        lines.append(f"    {name}: hit {t.hit_ratio:.1%} of {c.prompt_tokens} prompt tokens; "
                     f"{t.device_pages} device pages, {c.own_evicted_pages} evicted for its "
                     f"limit; quota {quota_text(t.quota)}")
    return lines


def quota_text(quota: TenantQuota) -> str:
    """``device_pages=64, device_floor=0, ...``: the fields that bound anything, or ``none``."""
    set_ = [f"{f.name}={getattr(quota, f.name)}" for f in fields(quota)
            if getattr(quota, f.name) not in (None, 0)]
    return ", ".join(set_) or "none"


def stored_pages(cache: RadixCache, storage: str) -> str:
    """The one count of stored pages: pages this run's store jobs committed,
    jobs still in flight named as such; for LMDB also the pages the store
    holds (earlier runs' included). A pool's key count is not a page count
    (it holds other engines' pages and namespace sets), so it is not shown."""
    ts = cache.tier_stats()
    assert ts is not None and ts.storage is not None
    written = ts.pages_moved.get("host_to_storage", 0)
    line = f"{storage}: {written} pages stored by this run"
    if storage == "LMDB":
        line += f" ({ts.storage.records} pages in the store)"
    pending = ts.in_flight
    return line + (f", {pending} tier jobs still in flight (writes not yet counted)"
                   if pending else ", no writes in flight")


def store_size(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks: LMDB's
    data file is sparse, its apparent size is the map size)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total

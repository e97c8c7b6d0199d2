"""The figures behind the metrics: one ``Sample`` per series, collected from
a cache (and its publisher) on the owner thread; ``snapshot()`` flattens them."""


from __future__ import annotations

from dataclasses import dataclass

from radixcache.cache import RadixCache
from radixcache.events.publisher import EventPublisher
from radixcache.metrics.tenant_series import TenantSeries
from radixcache.offload import LATENCY_BOUNDS_S, LatencyHistogram


@dataclass(frozen=True, slots=True)
class Histogram:
    """A histogram sample: cumulative counts per upper bound, and the sum."""

    buckets: tuple[tuple[float, int], ...]  # (upper bound in seconds, jobs <= it); +inf last
    total: float  # summed seconds

    @property
    def count(self) -> int:
        return self.buckets[-1][1]

    @staticmethod
    def of(h: LatencyHistogram) -> Histogram:
        running, out = 0, []
        for bound, n in zip((*LATENCY_BOUNDS_S, float("inf")), h.counts):
            running += n
            out.append((bound, running))
        return Histogram(tuple(out), h.total_s)


Sample = tuple[str, str, str, dict[str, str], float | Histogram]  # name, kind, help, labels, value

# vLLM's kv_offload series per direction: (bytes name, seconds name, labels, help).
KV_OFFLOAD = {
    "device_to_host": ("kv_offload_store_bytes", "kv_offload_store_time", {},
                       "stored from the device to host memory (vLLM: GPU to CPU)"),
    "host_to_device": ("kv_offload_load_bytes", "kv_offload_load_time", {},
                       "loaded from host memory to the device (vLLM: CPU to GPU)"),
    "host_to_storage": ("kv_offload_tiering_write_bytes", "kv_offload_tiering_write_time",
                        {"tier": "storage"}, "written from host memory to storage"),
    "storage_to_host": ("kv_offload_tiering_read_bytes", "kv_offload_tiering_read_time",
                        {"tier": "storage"}, "read from storage into host memory"),
}

# Histogram series per tier-job direction (TierStats.job_latency keys).
JOB_SECONDS = {
    "host_to_device": ("load_back_seconds", "Seconds to load pages back from host to device"),
    "storage_to_host": ("storage_read_seconds", "Seconds to read pages from storage into host"),
    "host_to_storage": ("storage_write_seconds", "Seconds to write pages from host to storage"),
    "device_to_host": ("backup_seconds", "Seconds to copy pages from device to host"),
}


def collect(
    cache: RadixCache,
    publisher: EventPublisher | None = None,
    tenants: TenantSeries | None = None,
) -> list[Sample]:
    """Every metric's current value. Owner thread only. ``tenants`` keeps the
    per-tenant series' label set and ``other`` sums from call to call (an
    exporter passes its own); None: a fresh one (the busiest tenants by
    prompt tokens, ``other`` their totals)."""
    s = cache.stats()
    out: list[Sample] = [
        ("requests", "counter", "Requests admitted", {}, s.requests),
        ("live_requests", "gauge", "Requests admitted and not released", {}, s.live_requests),
        ("prompt_tokens", "counter", "Prompt tokens of admitted requests", {}, s.prompt_tokens),
        ("hit_tokens", "counter", "Prompt tokens found cached, per tier", {"tier": "device"},
         s.hit_tokens),
        ("evicted_pages", "counter", "Pages evicted, per tier", {"tier": "device"},
         s.evicted_pages),
        ("pool_pages", "gauge", "Pool capacity in pages, per tier", {"tier": "device"},
         s.pool_pages),
        ("free_pages", "gauge", "Free pages, per tier", {"tier": "device"}, s.free_pages),
        ("cached_pages", "gauge", "Pages held by the tree, per tier", {"tier": "device"},
         s.cached_pages),
        ("evictable_pages", "gauge", "Cached device pages no request locks", {},
         s.evictable_pages),
        ("protected_pages", "gauge", "Cached device pages locked by requests", {},
         s.protected_pages),
        ("out_of_pages", "counter", "Allocations that failed after eviction", {},
         s.out_of_pages),
    ]
    t = cache.tier_stats()
    if t is not None:
        out += [
            ("hit_tokens", "counter", "", {"tier": "host"}, t.host_hit_tokens),
            ("hit_tokens", "counter", "", {"tier": "storage"}, t.storage_hit_tokens),
            ("loaded_tokens", "counter", "Host/storage hits loaded in time", {}, t.loaded_tokens),
            ("abandoned_tokens", "counter", "Host/storage hits given up and recomputed", {},
             t.abandoned_tokens),
            ("evicted_pages", "counter", "", {"tier": "host"}, t.host_evicted_pages),
            ("pool_pages", "gauge", "", {"tier": "host"}, t.host_pages),
            ("free_pages", "gauge", "", {"tier": "host"}, t.host_free_pages),
            ("cached_pages", "gauge", "", {"tier": "host"}, t.host_cached_pages),
            ("inflight_copies", "gauge", "Tier jobs in flight", {}, t.in_flight),
            ("failed_jobs", "counter", "Copies or storage operations that failed", {},
             t.failed_jobs),
            ("storage_state", "gauge",
             "Storage tier at start: 0 opened, 1 recovered (damaged store moved aside), "
             "2 disabled", {}, ("opened", "recovered", "disabled").index(t.storage_state)),
        ]
        for direction, pages in t.pages_moved.items():
            out.append(("moved_pages", "counter", "Pages moved, per direction",
                        {"direction": direction}, pages))
            out.append(("moved_bytes", "counter", "Bytes moved, per direction",
                        {"direction": direction}, t.bytes_moved[direction]))
        if t.storage is not None:
            st = t.storage
            out += [
                ("evicted_pages", "counter", "", {"tier": "storage"}, st.evicted),
                ("storage_records", "gauge", "Records in storage", {}, st.records),
                ("storage_bytes", "gauge", "Bytes of stored records", {}, st.stored_bytes),
                ("storage_disk_bytes", "gauge",
                 "Bytes a local store's files take on disk (LMDB: map, lock and slot files; "
                 "0 for a shared pool)", {}, st.disk_bytes),
                ("storage_free_disk_bytes", "gauge",
                 "Of storage_disk_bytes, bytes no record holds that the store reuses before "
                 "its files grow (the slot file's idle slots)", {}, st.free_disk_bytes),
                ("storage_corrupt", "counter", "Records that failed verification (deleted)", {},
                 st.corrupt),
                ("storage_expired", "counter",
                 "Records removed past their retention deadline", {}, st.expired),
                ("storage_decrypt_failures", "counter",
                 "Records read that could not be authenticated (wrong key, tampered, another "
                 "tenant's): misses", {}, st.decrypt_failures),
                ("storage_failed_ops", "counter", "Storage operations that failed", {},
                 st.failed_ops),
                ("storage_unknown_removals", "counter",
                 "Storage removals not announced: pages this engine never announced stored",
                 {}, cache.tree.recorder.unknown_removals),
            ]
    out += token_series(cache)
    series = tenants if tenants is not None else TenantSeries()
    out += series.samples(cache.tenants.stats(), cache.spec.page_bytes)
    if publisher is not None:
        p = publisher.stats()
        out += [
            ("events_published", "counter", "Event batches published", {}, p.published),
            ("events_dropped", "counter", "Event batches dropped by a full queue", {}, p.dropped),
        ]
    return out


def token_series(cache: RadixCache) -> list[Sample]:
    """The series vLLM and SGLang dashboards use, in tokens, and job-latency
    histograms. Owner thread only."""
    s = cache.stats()
    t = cache.tier_stats()
    page = cache.spec.page_size
    host_hits = t.host_hit_tokens if t is not None else 0
    storage_hits = t.storage_hit_tokens if t is not None else 0
    cached = "Prompt tokens found cached at admission, per source"
    evicted = "Tokens evicted, per tier (pages x page size)"
    out: list[Sample] = [
        ("prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache", {},
         s.prompt_tokens),
        ("prefix_cache_hits", "counter", "Prompt tokens found in any tier of the prefix cache",
         {}, s.hit_tokens + host_hits + storage_hits),
        ("cached_tokens", "counter", cached, {"cache_source": "device"}, s.hit_tokens),
        ("cached_tokens", "counter", cached, {"cache_source": "host"}, host_hits),
        ("cached_tokens", "counter", cached, {"cache_source": "storage"}, storage_hits),
        ("evicted_tokens", "counter", evicted, {"tier": "device"}, s.evicted_pages * page),
    ]
    rate = "Prompt tokens found cached over prompt tokens looked up, per tier, since start"
    queried = max(s.prompt_tokens, 1)
    for tier, hits in (("device", s.hit_tokens), ("host", host_hits), ("storage", storage_hits),
                       ("all", s.hit_tokens + host_hits + storage_hits)):
        out.append(("cache_hit_rate", "gauge", rate, {"tier": tier}, hits / queried))
    if t is None:
        return out
    for direction, (bytes_name, time_name, labels, what) in KV_OFFLOAD.items():
        h = t.job_latency.get(direction)
        out.append((bytes_name, "counter", f"Bytes {what}", labels,
                    t.bytes_moved.get(direction, 0)))
        out.append((time_name, "counter", f"Seconds of the jobs that {what.split(' ', 1)[0]} "
                    "them, submission to applied", labels, h.total_s if h is not None else 0.0))
    out += [
        ("evicted_tokens", "counter", evicted, {"tier": "host"}, t.host_evicted_pages * page),
        ("loaded_back_tokens", "counter", "Host or storage hits loaded back onto the device "
         "in time for their request", {}, t.loaded_tokens),
    ]
    if t.storage is not None:
        out.append(("evicted_tokens", "counter", evicted, {"tier": "storage"},
                    t.storage.evicted * page))
    for direction, (name, text) in JOB_SECONDS.items():
        h = t.job_latency.get(direction)
        if h is not None:
            out.append((name, "histogram", text, {}, Histogram.of(h)))
    return out


def snapshot(cache: RadixCache, publisher: EventPublisher | None = None) -> dict[str, float]:
    """The metrics as a flat dict: ``name{label=value}`` -> value; a histogram
    as ``name_count`` and ``name_sum``."""
    flat: dict[str, float] = {}
    for name, _kind, _help, labels, value in collect(cache, publisher):
        tag = ",".join(f"{k}={v}" for k, v in labels.items())
        suffix = f"{{{tag}}}" if tag else ""
        if isinstance(value, Histogram):
            flat[f"{name}_count{suffix}"] = float(value.count)
            flat[f"{name}_sum{suffix}"] = value.total
        else:
            flat[f"{name}{suffix}"] = float(value)
    return flat

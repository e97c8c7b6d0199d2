"""Prometheus metrics for a cache (optional: ``pip install 'radixcache[metrics]'``).

The owner thread calls ``update()`` (e.g. once per engine step); it copies
``cache.stats()``, ``cache.tier_stats()`` and the publisher's stats into a
snapshot. A scrape (on the HTTP server's thread) only reads the latest
snapshot, so it never touches the cache, which belongs to the owner thread.

    exporter = MetricsExporter(cache, publisher, namespace="radixcache")
    exporter.serve(9400)            # http://127.0.0.1:9400/metrics
    ... every step: exporter.update()

Besides our page-level series, the names a vLLM or SGLang dashboard already
queries (in tokens): ``prefix_cache_queries`` / ``prefix_cache_hits``
(vLLM; our hits count every tier, the device alone is
``cached_tokens{cache_source="device"}``, which is what vLLM's count means),
``cached_tokens{cache_source=device|host|storage}`` (SGLang),
``evicted_tokens{tier}``, ``loaded_back_tokens``, and ``_seconds``
histograms of tier jobs: ``load_back_seconds`` (host to device),
``storage_read_seconds``, ``storage_write_seconds``, ``backup_seconds``
(device to host), each from a job's submission until the owner applied it.

A hit-rate gauge per tier, as SGLang's ``sglang:cache_hit_rate``:
``cache_hit_rate{tier=device|host|storage|all}``, prompt tokens found in the
tier over prompt tokens looked up, since the cache was built (a window's
rate is ``rate(cached_tokens)`` over ``rate(prefix_cache_queries)``). Bytes
and seconds moved per direction under vLLM's ``kv_offload`` names (counters,
seconds summed over the jobs from submission until applied):
``kv_offload_store_bytes`` / ``kv_offload_store_time`` (device to host, vLLM's
GPU -> CPU store), ``kv_offload_load_bytes`` / ``kv_offload_load_time`` (host
to device), and ``kv_offload_tiering_write_bytes`` / ``_write_time`` /
``_read_bytes`` / ``_read_time`` with ``tier="storage"`` (host to storage and
back, vLLM's primary-to-secondary tier names).

For those who do not run Prometheus, ``snapshot()`` returns the same figures
as a flat dict (a histogram as its ``_count`` and ``_sum``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from radixcache.cache import RadixCache
from radixcache.events.publisher import EventPublisher
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


def collect(cache: RadixCache, publisher: EventPublisher | None = None) -> list[Sample]:
    """Every metric's current value. Owner thread only."""
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
                ("storage_corrupt", "counter", "Records that failed verification (deleted)", {},
                 st.corrupt),
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


class MetricsExporter:
    """Serves the latest ``update()`` snapshot in the Prometheus text format."""

    def __init__(
        self,
        cache: RadixCache,
        publisher: EventPublisher | None = None,
        namespace: str = "radixcache",
    ) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError(
                "metrics need prometheus-client: pip install 'radixcache[metrics]'"
            ) from err
        self.cache = cache
        self.publisher = publisher
        self.namespace = namespace
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self.registry.register(self)
        self._server: Any = None
        self.update()

    def update(self) -> None:
        """Take a fresh snapshot. Owner thread only."""
        samples = collect(self.cache, self.publisher)
        with self._lock:
            self._samples = samples

    def collect(self) -> Iterator[Any]:
        """The prometheus-client collector hook (runs on the scraping thread)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        with self._lock:
            samples = list(self._samples)
        families: dict[str, Any] = {}
        helps = {name: text for name, _k, text, _l, _v in samples if text}
        for name, kind, _help, labels, value in samples:
            full = f"{self.namespace}_{name}"
            family = families.get(full)
            if family is None:
                label_names = sorted(labels)
                cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                       "histogram": HistogramMetricFamily}[kind]
                family = families[full] = cls(full, helps.get(name, name), labels=label_names)
            label_values = [labels[k] for k in sorted(labels)]
            if isinstance(value, Histogram):
                buckets = [("+Inf" if b == float("inf") else repr(b), float(n))
                           for b, n in value.buckets]
                family.add_metric(label_values, buckets, value.total)
            else:
                family.add_metric(label_values, float(value))
        yield from families.values()

    def render(self) -> bytes:
        """The text exposition of the latest snapshot."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint (loopback by default); returns the port."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


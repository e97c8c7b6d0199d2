"""Prometheus metrics for a cache (optional: ``pip install 'radixcache[metrics]'``).

The owner thread calls ``update()`` (e.g. once per engine step); it copies
``cache.stats()``, ``cache.tier_stats()`` and the publisher's stats into a
snapshot. A scrape (on the HTTP server's thread) only reads the latest
snapshot, so it never touches the cache, which belongs to the owner thread.

    exporter = MetricsExporter(cache, publisher, namespace="radixcache")
    exporter.serve(9400)            # http://127.0.0.1:9400/metrics
    ... every step: exporter.update()

For those who do not run Prometheus, ``snapshot()`` returns the same figures
as a flat dict.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from radixcache.events.publisher import EventPublisher
from radixcache.cache import RadixCache

Sample = tuple[str, str, str, dict[str, str], float]  # name, kind, help, labels, value


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
                ("storage_failed_ops", "counter", "Storage operations that failed", {},
                 st.failed_ops),
            ]
    if publisher is not None:
        p = publisher.stats()
        out += [
            ("events_published", "counter", "Event batches published", {}, p.published),
            ("events_dropped", "counter", "Event batches dropped by a full queue", {}, p.dropped),
        ]
    return out


def snapshot(cache: RadixCache, publisher: EventPublisher | None = None) -> dict[str, float]:
    """The metrics as a flat dict: ``name{label=value}`` -> value."""
    flat: dict[str, float] = {}
    for name, _kind, _help, labels, value in collect(cache, publisher):
        tag = ",".join(f"{k}={v}" for k, v in labels.items())
        flat[f"{name}{{{tag}}}" if tag else name] = float(value)
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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            samples = list(self._samples)
        families: dict[str, Any] = {}
        helps = {name: text for name, _k, text, _l, _v in samples if text}
        for name, kind, _help, labels, value in samples:
            full = f"{self.namespace}_{name}"
            family = families.get(full)
            if family is None:
                label_names = sorted(labels)
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = families[full] = cls(full, helps.get(name, name), labels=label_names)
            family.add_metric([labels[k] for k in sorted(labels)], float(value))
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


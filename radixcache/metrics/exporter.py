"""The Prometheus endpoint: serves the latest snapshot of ``collect()``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from radixcache.cache import RadixCache
from radixcache.events.publisher import EventPublisher
from radixcache.metrics.samples import Histogram, Sample, collect
from radixcache.metrics.tenant_series import DEFAULT_TENANT_LABELS, TenantSeries


class MetricsExporter:
    """Serves the latest ``update()`` snapshot in the Prometheus text format.

    ``tenant_labels``: how many tenants get a ``tenant`` label of their own
    on the per-tenant series (the busiest by cumulative prompt tokens; the
    rest are summed under ``tenant="other"``; see
    ``radixcache.metrics.tenant_series``)."""

    def __init__(
        self,
        cache: RadixCache,
        publisher: EventPublisher | None = None,
        namespace: str = "radixcache",
        tenant_labels: int = DEFAULT_TENANT_LABELS,
    ) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError(
                "metrics need prometheus-client: pip install 'radixcache[metrics]'"
            ) from err
        self.tenants = TenantSeries(tenant_labels)  # validates tenant_labels
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
        samples = collect(self.cache, self.publisher, self.tenants)
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


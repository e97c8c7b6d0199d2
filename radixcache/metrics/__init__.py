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

Per tenant (``cache.tenants.stats()``), series labelled ``tenant``:
``tenant_requests``, ``tenant_prompt_tokens``, ``tenant_prefix_cache_hits``,
``tenant_hit_tokens{tier=device|lower}``,
``tenant_evicted_pages{tier=device|host,cause=own_quota|pressure}``,
``tenant_dropped_pages{tier}`` (counters), ``tenant_cached_pages{tier}`` and
``tenant_cached_bytes{tier}`` (gauges). Only the busiest tenants (by
cumulative prompt tokens, ``MetricsExporter(tenant_labels=20)``) get a label
of their own; the rest are summed under ``tenant="other"`` in a way that
keeps every counter monotonic (``radixcache.metrics.tenant_series``).

For those who do not run Prometheus, ``snapshot()`` returns the same figures
as a flat dict (a histogram as its ``_count`` and ``_sum``).
"""

from radixcache.metrics.exporter import MetricsExporter
from radixcache.metrics.samples import (
    Histogram,
    Sample,
    collect,
    snapshot,
    token_series,
)
from radixcache.metrics.tenant_series import TenantSeries

__all__ = [
    "Histogram", "MetricsExporter", "Sample", "TenantSeries", "collect", "snapshot", "token_series",
]

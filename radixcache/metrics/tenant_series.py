"""Per-tenant series with a bounded ``tenant`` label.

``TenantSeries`` turns ``cache.tenants.stats()`` into samples labelled
``tenant`` (the salt as events carry it, ``(none)`` for no salt). One
exporter keeps one ``TenantSeries``: it remembers which tenants have a label
of their own and what the ``other`` series summed, so the label set stays
bounded and every counter stays monotonic from scrape to scrape.

Which tenants get a label (at most ``max_labels``, the rest are summed under
``tenant="other"``, which is always exported):

* Traffic is a tenant's **cumulative prompt tokens** since the cache started
  (then its requests, then its name, to break ties).
* While fewer than ``max_labels`` tenants have a label, the busiest of the
  others get one.
* A tenant with a label keeps it until an unlabelled tenant's traffic is
  more than ``SWAP_MARGIN`` times the traffic of the weakest labelled one;
  the two then swap. Cumulative totals move slowly and the margin means two
  tenants of similar traffic do not trade places every scrape.

How the counters stay monotonic when the set changes: each increment of a
tenant's counter (between two ``update()`` calls) is counted in exactly one
series, the one the tenant belongs to at the later call:

* a labelled tenant's series is its own total since the cache started (the
  value ``cache.tenants.stats()`` reports); when it loses its label its
  series is no longer exported (it goes stale, it never goes down), and if it
  wins a label back the series resumes from its total, which is higher;
* ``other`` is the running sum of the increments of the tenants that had no
  label when they made them. A tenant joining ``other`` adds only what it
  does from then on, and one leaving it takes nothing away, so ``other``
  never decreases (no false counter reset in Prometheus).

Compare per-tenant figures with ``rate()`` / ``increase()``: after a swap
the sum of the ``tenant`` series' raw values exceeds the cache's total (the
promoted tenant's earlier traffic is in ``other`` too), but the sum of their
rates matches. Gauges (pages and bytes held now) are plain: a labelled
tenant's own holding, and ``other`` the sum of everyone else's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Final

from radixcache.tenants.ledger import StorageShare, TenantCounters, TenantStats

OTHER: Final = "other"  # the tenant label of the sum of every tenant without one
DEFAULT_TENANT_LABELS: Final = 20  # tenants with a label of their own, by default
SWAP_MARGIN: Final = 1.25  # a challenger needs this many times the weakest one's traffic

Labels = dict[str, str]
Sample = tuple[str, str, str, Labels, float]  # the metrics' Sample, without histograms

_HITS = "Prompt tokens of the tenant found cached at admission, per tier (lower: host or storage)"
_EVICTED = ("Pages of the tenant removed, per tier and cause (own_quota: to keep it within "
            "its limit; pressure: to make room for any tenant's request; ttl: past its "
            "retention, device and host pages together; invalidation: invalidate(tag); "
            "forget: forget_namespace)")
_BYTES = ("Bytes the tenant's cached pages hold now, per tier (device, host: pages x page "
          "bytes; storage: its records' or values' bytes, as the store counts them)")
_DROPPED = "Pages of the tenant not cached because it was at its limit, per tier"

# (series, labels besides tenant, help, value of one tenant's counters), counters only.
COUNTERS: tuple[tuple[str, Labels, str, Callable[[TenantCounters], int]], ...] = (
    ("tenant_requests", {}, "Requests of the tenant admitted", lambda c: c.requests),
    ("tenant_prompt_tokens", {}, "Prompt tokens of the tenant's admitted requests (its "
     "prefix_cache_queries)", lambda c: c.prompt_tokens),
    ("tenant_prefix_cache_hits", {}, "Prompt tokens of the tenant found in any tier: tokens "
     "not recomputed", lambda c: c.device_hit_tokens + c.lower_hit_tokens),
    ("tenant_hit_tokens", {"tier": "device"}, _HITS, lambda c: c.device_hit_tokens),
    ("tenant_hit_tokens", {"tier": "lower"}, _HITS, lambda c: c.lower_hit_tokens),
    ("tenant_evicted_pages", {"tier": "device", "cause": "own_quota"}, _EVICTED,
     lambda c: c.own_evicted_pages),
    ("tenant_evicted_pages", {"tier": "device", "cause": "pressure"}, _EVICTED,
     lambda c: c.pressure_evicted_pages),
    ("tenant_evicted_pages", {"tier": "host", "cause": "own_quota"}, _EVICTED,
     lambda c: c.host_own_evicted_pages),
    ("tenant_evicted_pages", {"tier": "host", "cause": "pressure"}, _EVICTED,
     lambda c: c.host_pressure_evicted_pages),
    ("tenant_evicted_pages", {"tier": "device_host", "cause": "ttl"}, _EVICTED,
     lambda c: c.expired_pages),
    ("tenant_evicted_pages", {"tier": "device", "cause": "invalidation"}, _EVICTED,
     lambda c: c.invalidated_pages),
    ("tenant_evicted_pages", {"tier": "device", "cause": "forget"}, _EVICTED,
     lambda c: c.forgotten_pages),
    ("tenant_dropped_pages", {"tier": "device"}, _DROPPED, lambda c: c.dropped_pages),
    ("tenant_dropped_pages", {"tier": "host"}, _DROPPED, lambda c: c.host_dropped_pages),
)
# From the storage tier's own per-tenant figures (``TenantStats.storage``): counters
# since the store opened, under tier="storage".
STORAGE_COUNTERS: tuple[tuple[str, Labels, str, Callable[[StorageShare], int]], ...] = (
    ("tenant_evicted_pages", {"tier": "storage", "cause": "own_quota"}, _EVICTED,
     lambda s: s.quota_evicted),
    ("tenant_dropped_pages", {"tier": "storage"}, _DROPPED, lambda s: s.dropped_pages),
)


NO_SHARE: Final = StorageShare("", 0, 0, 0)


def _counts(t: TenantStats) -> tuple[int, ...]:
    share = t.storage or NO_SHARE
    return (*(value(t.counters) for _n, _l, _h, value in COUNTERS),
            *(value(share) for _n, _l, _h, value in STORAGE_COUNTERS))


class TenantSeries:
    """The per-tenant samples of one exporter, with at most ``max_labels``
    tenants labelled by name and the rest under ``other`` (see the module).
    Owner thread only, like ``collect()``."""

    def __init__(self, max_labels: int = DEFAULT_TENANT_LABELS) -> None:
        if type(max_labels) is not int or max_labels < 0:
            raise ValueError(f"tenant_labels must be a non-negative int (tenants with a label "
                             f"of their own; 0: all under {OTHER!r}), got {max_labels!r}")
        self.max_labels = max_labels
        self.labelled: set[str] = set()  # tenants with a label of their own now
        self._last: dict[str, tuple[int, ...]] = {}  # each tenant's counters at the last call
        self._other = [0] * (len(COUNTERS) + len(STORAGE_COUNTERS))  # ``other``'s running sums

    def choose(self, stats: Mapping[str, TenantStats]) -> set[str]:
        """Update and return the tenants with a label of their own (the
        module's rule). A tenant named ``other`` never gets one: its figures
        are in the ``other`` series, which it could not be told apart from."""
        traffic = {name: (s.counters.prompt_tokens, s.counters.requests)
                   for name, s in stats.items() if name != OTHER}
        keep = {name for name in self.labelled if name in traffic}
        rest = (name for name in traffic if name not in keep)
        best = heapq.nsmallest(self.max_labels, rest,
                               key=lambda n: (-traffic[n][0], -traffic[n][1], n))
        free = self.max_labels - len(keep)
        keep.update(best[:free])
        for challenger in best[free:]:  # busiest first
            weakest = min(keep, key=lambda n: (traffic[n][0], traffic[n][1], n))
            mine, theirs = traffic[challenger][0], traffic[weakest][0]
            if not mine > theirs * SWAP_MARGIN:
                break  # the next challengers are weaker, the weakest only got stronger
            keep.remove(weakest)
            keep.add(challenger)
        self.labelled = keep
        return keep

    def samples(self, stats: Mapping[str, TenantStats], page_bytes: int) -> list[Sample]:
        """The per-tenant samples now: counters, then pages and bytes held."""
        labelled = self.choose(stats)
        other = self._other
        counts = {name: _counts(s) for name, s in stats.items()}
        for name, now in counts.items():
            if name not in labelled:
                last = self._last.get(name)
                for i, n in enumerate(now):
                    other[i] += max(0, n - (last[i] if last is not None else 0))
            self._last[name] = now
        names = sorted(labelled)
        out: list[Sample] = []
        for i, (series, labels, text, _value) in enumerate((*COUNTERS, *STORAGE_COUNTERS)):
            for name in names:
                out.append((series, "counter", text, {"tenant": name, **labels},
                            float(counts[name][i])))
            out.append((series, "counter", text, {"tenant": OTHER, **labels}, float(other[i])))
        held = {"device": {n: s.device_pages for n, s in stats.items()},
                "host": {n: s.host_pages for n, s in stats.items()}}
        for tier, pages in held.items():
            rest = sum(p for n, p in pages.items() if n not in labelled)
            for name, held_now in [*((n, pages[n]) for n in names), (OTHER, rest)]:
                labels = {"tenant": name, "tier": tier}
                out.append(("tenant_cached_pages", "gauge",
                            "Pages the tenant's cached prefixes hold now, per tier", labels,
                            float(held_now)))
                out.append(("tenant_cached_bytes", "gauge", _BYTES, labels,
                            float(held_now * page_bytes)))
        stored = {n: (s.storage.stored_bytes if s.storage is not None else 0)
                  for n, s in stats.items()}
        if any(s.storage is not None for s in stats.values()):
            rest = sum(b for n, b in stored.items() if n not in labelled)
            for name, nbytes in [*((n, stored[n]) for n in names), (OTHER, rest)]:
                out.append(("tenant_cached_bytes", "gauge", _BYTES,
                            {"tenant": name, "tier": "storage"}, float(nbytes)))
        out.append(("tenants_in_other", "gauge", f"Tenants summed under tenant={OTHER!r}", {},
                    float(len(stats) - len(labelled))))
        return out

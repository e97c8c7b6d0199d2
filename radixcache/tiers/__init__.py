"""The tiers below the device, as the cache sees them: host copies and
storage, the jobs that move pages between them, and what the engine tells
routers about storage after a restart.

The cache calls its tiers through one contract (``Tiers``): ``NullTiers``
for a device-only cache, ``HostTiers`` with a host pool and optional
storage. Every page move is a job (``TierJob``) that owns its holds on nodes
and pages and lands in ``finish`` on the owner thread.

    contract.py     what the cache calls (``Tiers``) and the device-only ``NullTiers``
    config.py       ``TierConfig``, counters, the stats snapshot, opening storage
    host_tiers.py   ``HostTiers``: the write path, room on the host, ``poll``
    loads.py        load-back and the prefetch policy: pages on their way up
    jobs.py         the job contract (``TierJob``) and how jobs share pages out
    write_jobs.py   jobs that move pages down: backup (device -> host), store
    load_jobs.py    jobs that bring pages up: load, private load, fetch
    host_index.py   host residency, stored pages and job holds, per node
    survivors.py    storage survivors announced at start; ids in stored records
"""

from __future__ import annotations

from radixcache.tiers.config import TierConfig, TierCounters, TierStats
from radixcache.tiers.contract import NullTiers, Tiers
from radixcache.tiers.host_tiers import HostTiers
from radixcache.tiers.jobs import TierJob

__all__ = ["HostTiers", "NullTiers", "TierConfig", "TierCounters", "TierJob", "TierStats", "Tiers"]

"""The Valkey backend: the storage tier as a pool on a Valkey server or cluster, shared by engines.

    config.py     ValkeyConfig: URL (one or several nodes), credentials, TLS,
                  timeouts, TTL, batches, pages per value, tenant quotas, clock
    storage.py    ValkeyStorage: the link, probe, reader, writer, observer and
                  the watcher of the servers' settings; the contract's calls
                  are the shared base's
    nodes.py      one node: its connections, its health; how pages are sent
    topology.py   which node serves each key: the slot map, learnt from any node
    link.py       commands routed to their nodes, one round trip a call; what
                  counts as "not now" (a node down, loading, moved) per node
    layout.py     where pages live: values of several pages, their keys and
                  cuts, the namespace index sets
    bulk.py       GET replies parsed off the socket into host pages
    lookup.py     the longest stored prefix in one round trip; PoolLookup for routers
    reader.py     the read transport: GETs into host pages, the next batch meanwhile
    writer.py     the write transport: encoder and sender threads, jobs in order
    sending.py    one chunk of a put: index, tags, SET NX PX (or the quota script)
    lifetime/     how long values live and what removes them: retention
                  deadlines, tags and invalidate_tag, per-tenant byte quotas,
                  deletes and forgets, which pages left (keyspace notifications)
    scratch.py    a scratch server or 3-node cluster for demos and benchmarks

The client library (redis-py, the ``valkey`` extra) is imported only by the
names that need it, when they are first used: ``ValkeyConfig`` and the URL
helpers come without it. It imports the shared base
(``radixcache.offload.storage``) and nothing of any other backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixcache.offload.lazy import LazyNames
from radixcache.offload.valkey.config import SCHEMES, ValkeyConfig, redact_url

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from radixcache.offload.valkey.lifetime.quotas import TenantPoolStats
    from radixcache.offload.valkey.link import PoolUnavailable
    from radixcache.offload.valkey.lookup import PoolLookup
    from radixcache.offload.valkey.scratch import ScratchCluster, scratch_cluster, scratch_server
    from radixcache.offload.valkey.storage import PoolStats, ValkeyStorage

_NAMES = LazyNames(
    __name__,
    {
        "PoolLookup": "radixcache.offload.valkey.lookup",
        "PoolStats": "radixcache.offload.valkey.storage",
        "PoolUnavailable": "radixcache.offload.valkey.link",
        "TenantPoolStats": "radixcache.offload.valkey.lifetime.quotas",
        "ValkeyStorage": "radixcache.offload.valkey.storage",
        "ScratchCluster": "radixcache.offload.valkey.scratch",
        "scratch_cluster": "radixcache.offload.valkey.scratch",
        "scratch_server": "radixcache.offload.valkey.scratch",
    },
    eager=("SCHEMES", "ValkeyConfig", "redact_url"),
)
__all__ = _NAMES.all


def __getattr__(name: str) -> Any:
    return _NAMES.resolve(name)


def __dir__() -> list[str]:
    return _NAMES.dir()

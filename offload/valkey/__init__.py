"""The Valkey backend: the storage tier as a pool on a Valkey server or cluster, shared by engines.

    config.py     ValkeyConfig: URL, credentials, TLS, timeouts, TTL, batches
    storage.py    ValkeyStorage: the link, probe, reader, writer, observer;
                  the contract's calls are the shared base's
    link.py       the connection: one client, its health, one round trip a call
    bulk.py       pipelined GETs received straight into host pages
    lookup.py     the longest stored prefix in one round trip; PoolLookup for routers
    reader.py     the read transport: chunked GETs, the next fetched meanwhile
    writer.py     the write transport: encoder and sender, SET NX EX pipelines
    removals.py   keyspace notifications of removals
    scratch.py    a scratch server for demos and benchmarks

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
    from radixcache.offload.valkey.link import PoolUnavailable
    from radixcache.offload.valkey.lookup import PoolLookup
    from radixcache.offload.valkey.scratch import scratch_server
    from radixcache.offload.valkey.storage import PoolStats, ValkeyStorage

_NAMES = LazyNames(
    __name__,
    {
        "PoolLookup": "radixcache.offload.valkey.lookup",
        "PoolStats": "radixcache.offload.valkey.storage",
        "PoolUnavailable": "radixcache.offload.valkey.link",
        "ValkeyStorage": "radixcache.offload.valkey.storage",
        "scratch_server": "radixcache.offload.valkey.scratch",
    },
    eager=("SCHEMES", "ValkeyConfig", "redact_url"),
)
__all__ = _NAMES.all


def __getattr__(name: str) -> Any:
    return _NAMES.resolve(name)


def __dir__() -> list[str]:
    return _NAMES.dir()

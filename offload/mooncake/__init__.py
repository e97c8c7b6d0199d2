"""The Mooncake backend: the storage tier as a pool on Mooncake Store, shared by engines.

    config.py     MooncakeConfig: URL, master, metadata server, transport, memory
    storage.py    MooncakeStorage: the link, reader and writer; the contract's
                  calls are the shared base's
    link.py       the connection: one Mooncake client, its health, the crash guard
    keys.py       object names: records, namespace markers, forget patterns
    reader.py     the read transport: zero-copy batch gets, marker checks
    writer.py     the write transport: exist-checked zero-copy batch puts, removals
    processes.py  a master and holder processes (tests, demos, benchmarks)
    holder.py     the pool holder: ``python -m radixcache.offload.mooncake.holder``

The client library (the ``mooncake`` extra: ``mooncake-transfer-engine-non-cuda``,
which needs Debian's ``libibverbs1``) is imported only by the names that need
it, when they are first used: ``MooncakeConfig`` comes without it. It imports
the shared base (``radixcache.offload.storage``) and nothing of any other backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixcache.offload.lazy import LazyNames
from radixcache.offload.mooncake.config import SCHEME, MooncakeConfig

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from radixcache.offload.mooncake.link import PoolUnavailable
    from radixcache.offload.mooncake.processes import HolderProcess, MasterProcess, scratch_pool
    from radixcache.offload.mooncake.storage import MooncakePoolStats, MooncakeStorage

_NAMES = LazyNames(
    __name__,
    {
        "HolderProcess": "radixcache.offload.mooncake.processes",
        "MasterProcess": "radixcache.offload.mooncake.processes",
        "MooncakePoolStats": "radixcache.offload.mooncake.storage",
        "MooncakeStorage": "radixcache.offload.mooncake.storage",
        "PoolUnavailable": "radixcache.offload.mooncake.link",
        "scratch_pool": "radixcache.offload.mooncake.processes",
    },
    eager=("SCHEME", "MooncakeConfig"),
)
__all__ = _NAMES.all


def __getattr__(name: str) -> Any:
    return _NAMES.resolve(name)


def __dir__() -> list[str]:
    return _NAMES.dir()

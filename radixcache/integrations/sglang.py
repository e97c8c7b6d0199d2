"""radixcache storage as an SGLang HiCache storage backend (``dynamic``, interface v1).

Switched on with (see the README)::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "radixcache",
        "module_path": "radixcache.integrations.sglang",
        "class_name": "RadixcacheHiCacheStorage", "interface_v1": 1,
        "path": "/var/cache/radixcache-sglang", "kv_dtype": "bfloat16",
        "capacity_bytes": 107374182400}'

SGLang builds the backend as ``cls(storage_config, kwargs)`` and hands it the
host KV pool later (``register_mem_pool_host``); only then is the page size
known, so the store opens there. SGLang then calls, from its own prefetch and
backup threads, 128 pages at a time and blocking:

* ``batch_exists(keys) -> int``: leading keys stored (in-memory index, no I/O);
* ``batch_set_v1`` / ``batch_get_v1(keys, host_indices) -> list[bool]``: the
  pages of ``keys`` out of / into the host pool at ``host_indices`` (token
  indices, ``page_size`` per key).

A host page is not one span of memory: ``get_page_buffer_meta`` gives its
pieces (K and V of an MHA page, one span for MLA). Pages are gathered into a
per-thread staging buffer of whole pages, stored and read as one record each,
and a read page is scattered back only once it is verified::

    host pool pieces --gather--> staging[i] --put--> record(key i)
    record(key i) --get, verify--> staging[i] --scatter--> host pool pieces

Keys are SGLang's strings (a SHA-256 chain, the same on every tensor-parallel
rank). Every record key is bound to a fingerprint of the model, the KV dtype
(from the extra config: SGLang's storage config has none), the page format and
the tensor-parallel rank, so ranks never read each other's heads and pages of
another dtype are never hits. With LMDB each rank opens its own directory
under ``path`` (``tp{rank}``), as one store belongs to one process.

Tenants: a call's tenant is ``extra_info.extra_info["cache_salt"]``
(``radixcache.integrations.tenants``); its pages are stored, found and read
under that tenant's namespace only. SGLang 0.5.23 folds a request's salt into
its page hashes but hands backends no salt (its controller passes only
``prefix_keys``), so pages it writes by itself land in the default namespace.
The extra config's ``quotas`` (tenant -> ``ttl_s``, ``storage_bytes``,
``storage_floor``; ``radixcache.integrations.quotas``) bound what each tenant
keeps in the store and for how long.

This module imports SGLang; ``import radixcache`` never imports it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from radixcache.integrations.pagestore import (
    PageStore,
    PageStoreConfig,
    RawPages,
    describe_path,
    is_pool_url,
)
from radixcache.config import ConfigError, decode
from radixcache.integrations.config_files import store_options
from radixcache.integrations.quotas import config_quotas
from radixcache.integrations.tenants import salt_of, tenant_namespace
from radixcache.namespace import Namespace

log = logging.getLogger(__name__)

# Keys of the extra config that SGLang's ``dynamic`` factory reads itself.
SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """This backend's keys of ``--hicache-storage-backend-extra-config``,
    decoded by type (``radixcache.config``: strict, unknown keys are
    errors that name the key)."""

    path: str  # an LMDB directory (a tp<rank> folder per rank under it) or a pool URL
    kv_dtype: str  # the model's KV dtype: SGLang's storage config carries none
    capacity_bytes: int = 64 << 30  # bound on stored bytes (least recently used evicted)
    durability: str = "safe"  # "safe" or "fast" (see PageStoreConfig)
    rank_subdir: bool = True  # LMDB: one folder per tensor-parallel rank
    quotas: dict[str, Any] | None = None  # tenant -> TenantQuota fields (integrations/quotas.py)

    def __post_init__(self) -> None:
        for name in ("path", "kv_dtype"):
            if not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if self.capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {self.capacity_bytes}")


class _Staging(threading.local):
    """One staging buffer of whole pages per calling thread."""

    pages: RawPages | None = None


class RadixcacheHiCacheStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` (interface v1) on a radixcache ``PageStore``.

    Thread-safe: SGLang calls it from several threads at once; each call
    stages its pages in its own thread's buffer and the store serializes
    submissions. Every call blocks until its pages are stored or read.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None):
        extra = {k: v for k, v in (storage_config.extra_config or {}).items()
                 if k not in SGLANG_KEYS}
        config_file = extra.pop("config_file", None)
        if config_file is not None:  # the store from a radixcache config file; extra keys win
            if not isinstance(config_file, str):
                raise ConfigError("--hicache-storage-backend-extra-config: Expected `str`, got "
                                  f"`{type(config_file).__name__}` - at `$.config_file`")
            keys = frozenset(f.name for f in dataclasses.fields(BackendOptions))
            extra = {**store_options(config_file, keys), **extra}
        source = "--hicache-storage-backend-extra-config"
        options = decode(BackendOptions, extra, source)
        # checked here, at startup; the store opens later (register_mem_pool_host)
        self.quotas = config_quotas(options.quotas,
                                    "valkey" if is_pool_url(options.path) else "lmdb", source)
        self.config = storage_config
        self.options = options
        self.kv_dtype = options.kv_dtype
        self.capacity_bytes = options.capacity_bytes
        self.durability = options.durability
        base = options.path
        if options.rank_subdir and not is_pool_url(base):  # a pool keeps ranks apart by fingerprint
            base = os.path.join(base, f"tp{storage_config.tp_rank}")
        self.path = base
        self.store: PageStore | None = None  # opened by register_mem_pool_host
        self._staging = _Staging()
        self._open_lock = threading.Lock()

    # -- the host pool --------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        page_size = int(getattr(mem_pool_host, "page_size", 1) or 1)
        _ptrs, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(page_size))
        self.page_size = page_size
        self.pieces = len(sizes)  # memory spans per page
        self.piece_bytes = [int(s) for s in sizes]
        page_bytes = sum(self.piece_bytes)
        cfg = self.config
        layout = ";".join(
            [
                f"kv_dtype={self.kv_dtype}",
                f"host_dtype={str(getattr(mem_pool_host, 'dtype', 'unknown')).removeprefix('torch.')}",
                f"page_size={page_size}",
                f"layout={getattr(mem_pool_host, 'layout', 'unknown')}",
                f"pieces={'+'.join(map(str, self.piece_bytes))}",
                f"mla={cfg.is_mla_model}",
                f"tp_size={cfg.tp_size}",
                f"pp={cfg.pp_rank}/{cfg.pp_size}",
                f"cp={cfg.attn_cp_rank}/{cfg.attn_cp_size}",
                f"dp_rank={cfg.dp_rank}",
            ]
        )
        with self._open_lock:
            if self.store is not None:
                self.store.close()
            self.store = PageStore(
                PageStoreConfig(
                    path=self.path,
                    page_bytes=page_bytes,
                    engine="sglang",
                    model=cfg.model_name or "unknown-model",
                    layout=layout,
                    tp_rank=cfg.tp_rank,
                    capacity_bytes=self.capacity_bytes,
                    durability=self.durability,
                ),
                quotas=self.quotas,
            )
        log.info(
            "radixcache HiCache storage at %s: pages of %d B", describe_path(self.path), page_bytes
        )

    # -- interface v1 -----------------------------------------------------------------
    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        return self._open().leading(_encode(keys), _tenant(extra_info))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        store = self._open()
        if not keys:
            return []
        namespace = _tenant(extra_info)
        pieces = self._pieces(keys, host_indices)
        staging = self._stage(len(keys), store.page_bytes)
        rows = staging.as_bytes()
        for i, page in enumerate(pieces):
            _gather(page, rows[i])
        ticket = store.put(_encode(keys), staging, range(len(keys)), namespace)
        ticket.wait()
        return ticket.results()

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        store = self._open()
        if not keys:
            return []
        namespace = _tenant(extra_info)
        pieces = self._pieces(keys, host_indices)
        staging = self._stage(len(keys), store.page_bytes)
        ticket = store.get(_encode(keys), staging, range(len(keys)), namespace)
        ticket.wait()
        results = ticket.results()
        rows = staging.as_bytes()
        for i, ok in enumerate(results):
            if ok:  # only verified pages reach the host pool
                _scatter(rows[i], pieces[i])
        return results

    # -- the older single-page calls (flat page tensors) ---------------------------------
    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        if not isinstance(target_location, torch.Tensor):
            raise TypeError("get() needs target_location: a host tensor of one page")
        store = self._open()
        staging = self._stage(1, store.page_bytes)
        ticket = store.get(_encode([key]), staging, [0])
        ticket.wait()
        if not ticket.results()[0]:
            return None
        flat = target_location.view(-1).view(torch.uint8)
        if flat.numel() != store.page_bytes:
            raise ValueError(f"target holds {flat.numel()} B; pages are {store.page_bytes} B")
        flat.numpy()[:] = staging.as_bytes()[0]
        return target_location

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        return [self.get(k, t) for k, t in zip(keys, target_locations or [None] * len(keys))]

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        if not isinstance(value, torch.Tensor):
            raise TypeError("set() needs value: a host tensor of one page")
        store = self._open()
        flat = value.contiguous().view(-1).view(torch.uint8)
        if flat.numel() != store.page_bytes:
            raise ValueError(f"value holds {flat.numel()} B; pages are {store.page_bytes} B")
        staging = self._stage(1, store.page_bytes)
        staging.as_bytes()[0] = flat.numpy()
        ticket = store.put(_encode([key]), staging, [0])
        ticket.wait()
        return ticket.results()[0]

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        return all(self.set(k, v) for k, v in zip(keys, values or []))

    # -- housekeeping -------------------------------------------------------------------
    def clear(self) -> None:
        self._open().clear().wait()

    def close(self) -> None:
        with self._open_lock:
            if self.store is not None:
                self.store.close()

    # -- helpers --------------------------------------------------------------------------
    def _open(self) -> PageStore:
        store = self.store
        if store is None:
            raise RuntimeError("register_mem_pool_host() has not been called yet")
        return store

    def _stage(self, n: int, page_bytes: int) -> RawPages:
        pages = self._staging.pages
        if pages is None or pages.num_pages < n or pages.page_bytes != page_bytes:
            pages = RawPages(np.zeros((max(n, 128), page_bytes), dtype=np.uint8), page_bytes)
            self._staging.pages = pages
        return pages

    def _pieces(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[list[tuple[int, int]]]:
        """(address, bytes) of every piece of every key's host page."""
        n, p = len(keys), self.page_size
        if host_indices.numel() != n * p:
            raise ValueError(
                f"{host_indices.numel()} host indices for {n} keys of {p} tokens each"
            )
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        k = self.pieces
        if len(ptrs) != n * k or [int(s) for s in sizes[:k]] != self.piece_bytes:
            raise ValueError(
                f"the host pool gave {len(ptrs)} pieces for {n} pages; expected {k} per page "
                f"of {self.piece_bytes} B"
            )
        return [
            [(int(ptrs[i * k + j]), self.piece_bytes[j]) for j in range(k)] for i in range(n)
        ]


def _tenant(extra_info: HiCacheStorageExtraInfo | None) -> Namespace:
    """The namespace of a call's tenant: ``extra_info.extra_info["cache_salt"]``."""
    params = extra_info.extra_info if extra_info is not None else None
    return tenant_namespace(salt_of(params))


def _encode(keys: Sequence[str]) -> list[bytes]:
    for i, key in enumerate(keys):
        if not isinstance(key, str):
            raise TypeError(f"key {i} must be a str (SGLang's page hash), got {type(key).__name__}")
    return [k.encode() for k in keys]


def _gather(pieces: list[tuple[int, int]], row: npt.NDArray[np.uint8]) -> None:
    at = row.ctypes.data
    for address, size in pieces:
        ctypes.memmove(at, address, size)
        at += size


def _scatter(row: npt.NDArray[np.uint8], pieces: list[tuple[int, int]]) -> None:
    at = row.ctypes.data
    for address, size in pieces:
        ctypes.memmove(address, at, size)
        at += size

"""A raw page store for serving engines: the engine's own key -> one page of bytes.

vLLM and SGLang key their KV pages themselves (a 36-byte block hash, a 64-hex
SHA-256 chain) and hand over page bytes, never token ids. ``PageStore`` puts
those pages into radixcache storage as raw records (``radixcache.offload.storage.record``,
flag ``raw``): every record carries the full key it was written under and a
checksum of its bytes (record v3, see the README), and its key is bound to a
``ModelFingerprint`` built from the engine, the model and the page format,
so a read that returns True returned exactly the bytes written under that key
for that model, and nothing else (a copied, truncated or flipped record is a miss and is deleted).

Pages move between the store and a caller-owned buffer of fixed-size chunks
(``RawPages``: a memoryview, array or tensor, or a raw pointer and size)::

    engine buffer  [chunk 0][chunk 1][chunk 2] ...      one chunk = page_bytes
         put(keys, pages, slots):  chunk slots[i] -> record of keys[i]
         get(keys, pages, slots):  record of keys[i] -> chunk slots[i]

Both return a ``PageTicket`` at once; the bytes move on the backend's threads.
The caller must leave the named chunks alone until the ticket is done.

Tenants: every call takes the ``Namespace`` of the tenant whose pages it
moves (``radixcache.integrations.tenants``; the default namespace when left
out). A key is stored bound to its tenant, so a lookup or a read under
another tenant never finds it, and records carry the tenant's namespace tag
(``forget`` removes one tenant's pages). Every put and get names the
tenant (``Namespace.tenant``) to the store: an LMDB store counts its bytes
against the tenant's byte quota, and a store that encrypts at rest seals the
pages with the tenant's key.

Quotas (``radixcache.integrations.quotas``): a ``QuotaBook`` given at open
sets the tenants' LMDB byte quotas (limit and floor) and their retention:
each put of a tenant whose quota has a ``ttl_s`` records its pages with the
deadline ``clock() + ttl_s`` (``PutMeta.expires_at``); ``set_quota`` changes
them at run time.

Threads: every method may be called from any thread. Submissions to the
backend are serialized by one lock (the backend's contract is one caller at a
time); waiting on a ticket happens outside it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from radixcache.integrations.quotas import ByteQuotaStore, StoreQuotas, pool_byte_limits
from radixcache.integrations.raw_pages import PageTicket, RawPages, Slots
from radixcache.integrations.tenants import (
    TENANT_KEY_OVERHEAD,
    engine_key,
    stored_key,
    tenant_namespace,
)
from radixcache.namespace import DEFAULT_NAMESPACE, Namespace, check_tag
from radixcache.native import hand_to_storage
from radixcache.offload import (
    MAX_KEY_BYTES,
    LmdbStorage,
    ModelFingerprint,
    Storage,
    StorageConfig,
    StorageStats,
    open_backend,
    storage_config,
)
from radixcache.offload.storage.contract import Clock
from radixcache.offload.valkey import SCHEMES as POOL_SCHEMES
from radixcache.offload.valkey import redact_url
from radixcache.offload.valkey.config import ValkeyConfig
from radixcache.tenants.quota import QuotaBook, TenantQuota
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.ticket import Ticket

__all__ = ["PageStore", "PageStoreConfig", "PageTicket", "RawPages", "Slots", "describe_path",
           "is_pool_url", "raw_spec"]
log = logging.getLogger(__name__)
hand_to_storage()  # the stores this module opens copy and sum records in one pass (compiled core)

BACKENDS = ("lmdb", "valkey")  # storage backends a PageStore can open
MAX_ENGINE_KEY_BYTES = MAX_KEY_BYTES - TENANT_KEY_OVERHEAD  # longest engine key a store takes
# Version of the stored-key format (tenants.py), bound into the fingerprint:
# records written before keys carried their tenant are never read as hits.
# 2: puts name their tenant (quotas, the tenant's key at rest), so a record
# of a tenant written by format 1 (under no tenant) is never counted or read.
KEY_FORMAT = "tenant-keys-2"


@dataclass(frozen=True, slots=True)
class PageStoreConfig:
    """Where and for whom a ``PageStore`` keeps pages. Validated on construction.

    ``engine``, ``model`` and ``layout`` (the engine's own description of its
    page format: KV dtype, tokens per page, layout, parallelism) and
    ``tp_rank`` make up the fingerprint every key is bound to: change any of
    them and earlier pages are never hits.
    """

    # an LMDB store directory (created if missing), or a shared pool's URL
    # (``valkey://HOST:PORT/DB[?cluster=true]``, ``valkeys://`` for TLS)
    path: str | os.PathLike[str]
    page_bytes: int  # bytes of one page (one engine chunk)
    engine: str  # "vllm", "sglang", ...
    model: str  # model name or path
    layout: str  # page format, e.g. "kv_dtype=bfloat16;page_size=64;layout=page_first"
    tp_rank: int = 0  # tensor-parallel rank whose pages these are
    capacity_bytes: int = 64 << 30  # limit on stored bytes (least recently used evicted)
    durability: str = "safe"  # "safe" or "fast" (see offload/lmdb/storage.py)
    num_readers: int = 2  # reader threads
    backend: str | None = None  # one of BACKENDS; None: "valkey" for a pool URL, else "lmdb"
    # Encryption at rest (README: "Encryption at rest"): a file of master keys,
    # or the name of an environment variable holding them; a pool URL may
    # also carry ?key_file= / ?key_env=
    key_file: str | None = None
    key_env: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.page_bytes, int) or self.page_bytes <= 0 or self.page_bytes % 2:
            raise ValueError(f"page_bytes must be a positive even int, got {self.page_bytes!r}")
        for name in ("engine", "model", "layout"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
        inferred = "valkey" if is_pool_url(self.path) else "lmdb"
        if self.backend is None:
            object.__setattr__(self, "backend", inferred)
        elif self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        elif self.backend != inferred:
            raise ValueError(
                f"backend {self.backend!r} does not match the path, which names a "
                f"{inferred} store"
            )

    def fingerprint(self) -> ModelFingerprint:
        spec = raw_spec(self.page_bytes)
        model_id = f"{self.engine}:{self.model}:{self.layout};{KEY_FORMAT}"
        return ModelFingerprint(model_id=model_id, spec=spec.describe(), tp_rank=self.tp_rank)


def raw_spec(page_bytes: int) -> KVSpec:
    """The storage geometry of opaque pages of ``page_bytes`` bytes (one byte
    per element; the real format is in the fingerprint's model id)."""
    return KVSpec(num_layers=1, num_kv_heads=1, head_dim=page_bytes // 2, dtype=torch.uint8,
                  page_size=1)


class PageStore:
    """Raw pages under engine keys, in one storage backend (see the module docstring)."""

    def __init__(
        self, config: PageStoreConfig, namespace: bytes = b"", storage: Storage | None = None,
        quotas: QuotaBook | None = None, clock: Clock = time.time,
    ) -> None:
        """Opens the LMDB store ``config`` names, or takes over ``storage``: a
        backend already opened with ``raw_spec(config.page_bytes)`` and
        ``config.fingerprint()`` (e.g. a shared pool), which ``close`` closes.

        ``quotas``: the tenants' quotas (copied; ValueError for a field this
        backend does not enforce, see integrations/quotas.py); their byte
        quotas go to an LMDB store at open, or to a ``storage`` given that
        takes them (``ByteQuotaStore``; another refuses them: ValueError).
        ``clock``: wall-clock seconds (``time.time``) for retention deadlines.
        """
        self.config = config
        self.page_bytes = config.page_bytes
        self._namespace = b"raw:" + config.engine.encode() + b":" + namespace
        self._lock = threading.Lock()  # one submitter at a time (the backend's contract)
        assert config.backend is not None  # set by PageStoreConfig
        self._quotas = StoreQuotas(quotas, config.backend, clock)
        byte_quotas, byte_default = self._quotas.byte_quotas()
        if storage is not None:
            if byte_quotas or byte_default is not None:  # LMDB's (ENFORCED refuses others)
                if not isinstance(storage, ByteQuotaStore):
                    raise ValueError(f"the store given ({type(storage).__name__}) takes no "
                                     f"per-tenant byte quotas; the quotas set storage_bytes or "
                                     f"storage_floor")
                storage.set_tenant_quotas(byte_quotas, byte_default)
            self._storage: Storage = storage
            return
        if config.backend == "valkey":
            pool = storage_config(config.path)
            if pool is not None and (config.key_file is not None or config.key_env is not None):
                pool = dataclasses.replace(pool, key_file=config.key_file, key_env=config.key_env)
            limits, limit_default = pool_byte_limits(self._quotas.book)
            if isinstance(pool, ValkeyConfig):  # the pool's clock and tenants' limits: ours
                pool = dataclasses.replace(pool, clock=clock, tenant_quotas=limits,
                                           tenant_quota_default=limit_default)
            self._storage = open_backend(pool, raw_spec(config.page_bytes), config.fingerprint()).storage
            return
        self._storage = LmdbStorage(
            StorageConfig(
                path=config.path,
                capacity_bytes=config.capacity_bytes,
                durability=config.durability,
                num_readers=config.num_readers,
                key_file=config.key_file,
                key_env=config.key_env,
                tenant_quotas=byte_quotas,
                tenant_quota_default=(None, 0) if byte_default is None else byte_default,
                clock=clock,
            ),
            raw_spec(config.page_bytes),
            config.fingerprint(),
        )

    # -- lookups (synchronous, from the in-memory index) ------------------------
    def leading(self, keys: Sequence[bytes], namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """How many leading ``keys`` of ``namespace`` are stored (no bytes read
        or verified)."""
        checked = _keys(keys, namespace)
        with self._lock:
            return self._storage.longest_prefix(checked)

    def contains(self, key: bytes, namespace: Namespace = DEFAULT_NAMESPACE) -> bool:
        return self.leading([key], namespace) == 1

    # -- page traffic (non-blocking) ---------------------------------------------
    def put(
        self, keys: Sequence[bytes], pages: RawPages, slots: Slots,
        namespace: Namespace = DEFAULT_NAMESPACE,
    ) -> PageTicket:
        """Store chunk ``slots[i]`` of ``pages`` as the page of ``keys[i]`` of
        the tenant ``namespace``.

        A key already stored is kept (not rewritten) and counts as stored.
        The chunks are read later on the backend's writer thread.
        """
        checked, ids = _keys(keys, namespace), self._slots(slots, len(keys), pages)
        with self._lock:
            meta = self._quotas.put_meta(checked, namespace)
            ticket = self._storage.put(checked, None, pages, ids, self._tag(namespace), meta,
                                       namespace.tenant)
        return PageTicket(ticket, len(checked))

    def get(
        self, keys: Sequence[bytes], pages: RawPages, slots: Slots,
        namespace: Namespace = DEFAULT_NAMESPACE,
    ) -> PageTicket:
        """Read the page of ``keys[i]`` of the tenant ``namespace`` into chunk
        ``slots[i]`` of ``pages``.

        Reading stops at the first key that is missing or fails verification
        (that record is deleted; its key shows up in ``take_removed``). Chunks
        of keys that did not succeed are unspecified afterwards.
        """
        if not pages.as_bytes().flags.writeable:
            raise ValueError("get() needs a writable page buffer; this one is read-only")
        checked, ids = _keys(keys, namespace), self._slots(slots, len(keys), pages)
        with self._lock:
            ticket = self._storage.get(checked, None, pages, ids, self._tag(namespace),
                                       namespace.tenant)
        return PageTicket(ticket, len(checked))

    def delete(self, keys: Sequence[bytes], namespace: Namespace = DEFAULT_NAMESPACE) -> Ticket:
        """Remove the pages of ``keys`` of ``namespace``; the ticket's result: how many existed."""
        checked = _keys(keys, namespace)
        with self._lock:
            return self._storage.delete(checked)

    def forget(self, namespace: Namespace) -> Ticket:
        """Remove every page of the tenant ``namespace``; result: how many."""
        with self._lock:
            return self._storage.forget_namespace(self._tag(namespace))

    def invalidate_tag(self, tag: str) -> Ticket:
        """Remove every page put under a namespace tagged ``tag``
        (``Namespace.tags``, recorded with each put); result: how many."""
        check_tag(tag)
        with self._lock:
            return self._storage.invalidate_tag(tag)

    def clear(self) -> Ticket:
        """Remove every page this store's engine holds, of every tenant."""
        with self._lock:
            return self._storage.delete([meta.key for meta in self._storage.scan() if meta.raw])

    # -- quotas ---------------------------------------------------------------------
    def set_quota(self, salt: str | None, quota: TenantQuota | None) -> None:
        """Change the quota of the tenant named by ``salt`` (a ``cache_salt``;
        None or "": no salt) at run time; None: back to the default.

        A new ``ttl_s`` holds for later puts (pages stored before keep their
        deadline). New byte quotas reach a store that takes them at run time
        (``ByteQuotaStore``); others keep those they opened with (logged).
        ValueError / TypeError for a quota this backend does not enforce.
        """
        namespace = tenant_namespace(salt)
        with self._lock:
            if not self._quotas.set(namespace.salt, quota):
                return
            # LMDB takes (limit, floor) per tenant, a pool limits alone
            if self.config.backend == "lmdb" and isinstance(self._storage, ByteQuotaStore):
                self._storage.set_tenant_quotas(*self._quotas.byte_quotas())
            elif self.config.backend == "valkey" and hasattr(self._storage, "set_tenant_quotas"):
                self._storage.set_tenant_quotas(*pool_byte_limits(self._quotas.book))
            else:
                log.warning("the %s store keeps the byte quotas it opened with; the new "
                            "storage_bytes / storage_floor of tenant %r hold from its next open",
                            self.config.backend, salt)

    # -- what changed, what is there ----------------------------------------------
    def take_removed(self) -> list[bytes]:
        """Engine keys removed (evicted, corrupt, deleted) since the last call,
        in order, of every tenant.

        A key appears only after the put that stored it finished: a caller that
        takes removals first and then harvests its finished puts sees every
        key's store before its removal.
        """
        with self._lock:
            return _engine_keys(self._storage.take_removed())

    def stored_keys(self) -> list[bytes]:
        """Every engine key stored for this fingerprint, of every tenant (a
        snapshot of record headers)."""
        with self._lock:
            return _engine_keys([meta.key for meta in self._storage.scan() if meta.raw])

    def stats(self) -> StorageStats:
        return self._storage.stats()

    def close(self) -> None:
        """Finish every queued write and ticket, then release the store. Idempotent."""
        with self._lock:
            self._storage.close()

    def _tag(self, namespace: Namespace) -> bytes:
        """The namespace tag of a tenant's records (the default one's is the
        engine's tag, as before tenants)."""
        if namespace == DEFAULT_NAMESPACE:
            return self._namespace
        return self._namespace + b"tenant:" + namespace.digest()

    def _slots(self, slots: Slots, n: int, pages: RawPages) -> npt.NDArray[np.int32]:
        if not isinstance(pages, RawPages):
            raise TypeError(f"pages must be RawPages, got {type(pages).__name__}")
        if pages.page_bytes != self.page_bytes:
            raise ValueError(
                f"the buffer's chunks are {pages.page_bytes} B; this store's pages are "
                f"{self.page_bytes} B"
            )
        ids = np.asarray(slots, dtype=np.int64).reshape(-1)
        if ids.size != n:
            raise ValueError(f"{ids.size} slots for {n} keys")
        if n and (int(ids.min()) < 0 or int(ids.max()) >= pages.num_pages):
            raise ValueError(
                f"slots must lie in [0, {pages.num_pages}): min {ids.min()}, max {ids.max()}"
            )
        return ids.astype(np.int32)


def describe_path(path: str | os.PathLike[str]) -> str:
    """``path`` for logs and messages: a pool URL with its password hidden."""
    return redact_url(os.fspath(path)) if is_pool_url(path) else os.fspath(path)


def is_pool_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a shared pool (a Valkey URL) rather than a directory."""
    scheme, sep, _rest = os.fspath(path).partition("://")
    return bool(sep) and scheme in POOL_SCHEMES


def _engine_keys(stored: Sequence[bytes]) -> list[bytes]:
    """The engine keys of stored keys; a key without a tenant form byte (not
    written by a PageStore of this format) names no engine key and is left out."""
    out = []
    for key in stored:
        try:
            out.append(engine_key(key))
        except ValueError:
            continue
    return out


def _keys(keys: Sequence[bytes], namespace: Namespace) -> list[bytes]:
    """The stored keys of engine ``keys`` of the tenant ``namespace``."""
    if not isinstance(namespace, Namespace):
        raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
    out = []
    for i, key in enumerate(keys):
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise TypeError(f"key {i} must be bytes, got {type(key).__name__}")
        key = bytes(key)
        if not 0 < len(key) <= MAX_ENGINE_KEY_BYTES:
            raise ValueError(
                f"key {i} has {len(key)} bytes; keys are 1 to {MAX_ENGINE_KEY_BYTES} bytes"
            )
        out.append(stored_key(namespace, key))
    return out

"""The factories the offload tests share: a tiny KV spec, keys, pages, stores.

``StoreKit`` (LMDB stores) and ``PoolKit`` (Valkey pools) are here, not in a
conftest, so that helper modules can build on them; the conftest re-exports
them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from radixcache.offload import LmdbStorage, ModelFingerprint, StorageConfig, ValkeyConfig, ValkeyStorage
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec
from radixcache.transfer.ticket import Ticket

# 2 layers x 2 heads x 16 dims x fp16 x 4 tokens: 1 KiB pages, 1088 B records.
SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float16, page_size=4)
RECORD_BYTES = 72 + 24 + 4 * SPEC.page_size + SPEC.page_bytes  # header, full key, tokens, KV


class StoreKit:
    """Opens stores under one temporary directory and closes them at teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec = SPEC
        self.fingerprint = ModelFingerprint("tiny-model", SPEC.describe(), 0)
        self.record_bytes = RECORD_BYTES
        self._opened: list[LmdbStorage] = []

    def open(
        self, name: str = "store", fingerprint: ModelFingerprint | None = None, **config: Any
    ) -> LmdbStorage:
        config.setdefault("capacity_bytes", 64 << 20)
        store = LmdbStorage(
            StorageConfig(path=self.root / name, **config),
            self.spec,
            fingerprint or self.fingerprint,
        )
        self._opened.append(store)
        return store

    def host(self, num_pages: int = 16, seed: int = 0) -> HostKVBuffer:
        """A host buffer filled with random bytes."""
        host = HostKVBuffer(self.spec, num_pages)
        raw = host.as_bytes()
        raw[:] = np.random.default_rng(seed).integers(0, 256, raw.shape, dtype=np.uint8)
        return host

    @staticmethod
    def keys(n: int, salt: bytes = b"") -> list[bytes]:
        """``n`` distinct 16-byte page keys."""
        return [
            hashlib.blake2b(salt + i.to_bytes(4, "little"), digest_size=16).digest()
            for i in range(n)
        ]

    @staticmethod
    def tokens(n: int, start: int = 0) -> npt.NDArray[np.int32]:
        """Token ids for ``n`` pages: [n, P], distinct per page."""
        p = SPEC.page_size
        return np.arange(start * p, (start + n) * p, dtype=np.int32).reshape(n, p)

    @staticmethod
    def ids(*values: int) -> npt.NDArray[np.int32]:
        return np.array(values, dtype=np.int32)

    @staticmethod
    def done(ticket: Ticket, timeout: float = 10.0) -> Any:
        """Wait for a ticket (failing the test if it hangs) and return its result."""
        assert ticket.wait(timeout), "ticket did not finish"
        return ticket.result()

    def barrier(self, store: LmdbStorage) -> None:
        """Wait until every write queued so far (e.g. a corrupt-record delete) committed."""
        self.done(store.delete([]))

    def close_all(self) -> None:
        for store in self._opened:
            store.close()


class PoolKit(StoreKit):
    """Opens ``ValkeyStorage`` on one pool (emptied first) and closes them at teardown."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root)
        self.url = url
        self._pools: list[ValkeyStorage] = []

    def config(self, **overrides: Any) -> ValkeyConfig:
        overrides.setdefault("socket_timeout_s", 0.5)
        overrides.setdefault("retry_after_s", 0.2)
        return ValkeyConfig.from_url(self.url, **overrides)

    def pool(
        self, fingerprint: ModelFingerprint | None = None, url: str | None = None, **overrides: Any
    ) -> ValkeyStorage:
        config = ValkeyConfig.from_url(url, **overrides) if url else self.config(**overrides)
        store = ValkeyStorage(config, self.spec, fingerprint or self.fingerprint)
        self._pools.append(store)
        return store

    def close_all(self) -> None:
        for store in self._pools:
            store.close()
        super().close_all()

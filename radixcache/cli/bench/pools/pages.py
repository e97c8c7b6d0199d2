"""What every pool figure shares: the pages moved, the clock, the rate."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from radixcache.offload import ModelFingerprint
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec


class Pages:
    """One figure's pages: source and destination host buffers, keys, tokens."""

    def __init__(self, spec: KVSpec, total_mib: int, request_pages: int) -> None:
        n = max(request_pages, (total_mib << 20) // spec.page_bytes // request_pages * request_pages)
        self.spec, self.n = spec, n
        self.host = HostKVBuffer(spec, n)
        self.src = self.host.as_bytes()
        self.src[:] = np.random.default_rng(0).integers(0, 256, self.src.shape, dtype=np.uint8)
        self.dst = HostKVBuffer(spec, n)
        self.tokens = np.arange(n * spec.page_size, dtype=np.int32).reshape(n, spec.page_size)
        self.keys = [hashlib.blake2b(i.to_bytes(4, "little"), digest_size=16).digest() for i in range(n)]
        self.requests = [(s, min(s + request_pages, n)) for s in range(0, n, request_pages)]
        self.fingerprint = ModelFingerprint("bench-model", spec.describe(), 0)

    def put(self, store: Any) -> None:
        tickets = [
            store.put(self.keys[a:b], self.tokens[a:b], self.host, np.arange(a, b, dtype=np.int32), b"bench")
            for a, b in self.requests
        ]  # fmt: skip
        assert sum(t.result() for t in tickets if t.wait(600)) == self.n, "put came up short"

    def get(self, store: Any) -> None:
        tickets = [
            store.get(self.keys[a:b], self.tokens[a:b], self.dst, np.arange(a, b, dtype=np.int32))
            for a, b in self.requests
        ]  # fmt: skip
        assert sum(t.result() for t in tickets if t.wait(600)) == self.n, "get came up short"

    def exact(self) -> bool:
        return bool(np.array_equal(self.dst.as_bytes(), self.src))

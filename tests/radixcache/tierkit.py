"""Helpers for tier tests: a tiny tiered cache and a runner that writes
prefix-derived KV so a page served for the wrong prefix is detectable."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch

from radixcache.offload.host import HostPoolConfig
from radixcache.offload.lmdb_storage import StorageConfig
from radixcache import CacheConfig, KVSpec, Namespace, RadixCache, Request
from radixcache.tiers import TierConfig

P = 4
SPEC = KVSpec(num_layers=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)


def make_tiered(
    device_pages: int = 8,
    host_pages: int = 16,
    write_policy: str = "write_through",
    prefetch: str = "wait_complete",
    storage: Path | None = None,
    threshold: int = 2,
) -> RadixCache:
    tiers = TierConfig(
        host=HostPoolConfig(pages=host_pages),
        write_policy=write_policy,
        write_threshold=threshold,
        prefetch_policy=prefetch,
        storage=None if storage is None else StorageConfig(path=storage, capacity_bytes=1 << 20),
        model_id="test-model",
    )
    return RadixCache(CacheConfig(spec=SPEC, device_pages=device_pages, tiers=tiers))


def kv_value(prefix: np.ndarray) -> float:
    return float(zlib.crc32(prefix.astype("<i4").tobytes()) % 100_003)


def compute(cache: RadixCache, req: Request, n: int) -> None:
    """Reserve, write K (and V = -K) for the next n positions, commit."""
    cache.reserve(req, n)
    kv = cache.kv
    assert kv is not None
    start = req.num_computed
    slots = kv.slots(req.page_table, start, n)
    toks = req.tokens
    vals = torch.tensor([kv_value(toks[: pos + 1]) for pos in range(start, start + n)])
    for layer in range(cache.spec.num_layers):
        k, v = kv.layer_slots(layer)
        k[slots] = (vals + layer).view(-1, 1, 1)
        v[slots] = (-vals - layer).view(-1, 1, 1)
    cache.commit(req, n)


def prefill(cache: RadixCache, tokens: np.ndarray, ns: Namespace = Namespace()) -> Request:
    req = cache.admit(tokens, ns)
    compute(cache, req, tokens.size - req.num_computed)
    return req


def assert_kv_correct(cache: RadixCache, req: Request) -> None:
    """Every computed position of ``req`` holds the KV of its own prefix."""
    kv = cache.kv
    assert kv is not None
    n = req.num_computed
    if n == 0:
        return
    slots = kv.slots(req.page_table, 0, n)
    toks = req.tokens
    want = torch.tensor([kv_value(toks[: pos + 1]) for pos in range(n)])
    for layer in range(cache.spec.num_layers):
        k, v = kv.layer_slots(layer)
        got_k, got_v = k[slots].reshape(n, -1), v[slots].reshape(n, -1)
        assert torch.equal(got_k, (want + layer)[:, None].expand_as(got_k)), f"layer {layer}: wrong K"
        assert torch.equal(got_v, (-want - layer)[:, None].expand_as(got_v)), f"layer {layer}: wrong V"


def residency(cache: RadixCache) -> list[tuple[int, bool, bool, bool]]:
    """(tokens, on device, on host, stored) per node, parents first, sorted."""
    return sorted(
        (int(n.key.size), n.device is not None, n.host is not None, n.stored)
        for n in cache.tree.nodes()
    )

"""A random workload through the public API, written out as JSON: what the
compiled core and the pure-Python modules must agree on, value for value.

Run as ``python -m tests.radixcache.native.native_workload SEEDS STEPS``
(once with ``RADIXCACHE_PURE=1``, once without): it prints one JSON list,
per seed every result the cache returned (hits, page tables, evictions,
errors), every event it recorded, and its stats at the end.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import numpy as np
import torch

from radixcache import CacheConfig, KVSpec, Namespace, OutOfPagesError, RadixCache
from radixcache.offload import HostPoolConfig
from radixcache.tenants import QuotaBook, TenantQuota
from radixcache.tiers.config import TierConfig
from radixcache.events import AllBlocksCleared, BlockRemoved, BlockStored
from radixcache.native import COMPILED

P = 4
NAMESPACES = (Namespace(), Namespace(salt="t1", lora_id=3))


def _event(e: object) -> list[Any]:
    if isinstance(e, BlockStored):
        return ["S", e.block_hashes, e.parent_block_hash, np.asarray(e.token_ids).tolist(), e.medium,
                e.cache_salt, e.lora_id]
    if isinstance(e, BlockRemoved):
        return ["R", e.block_hashes, e.medium]
    assert isinstance(e, AllBlocksCleared)
    return ["C"]


def _tier_counts(cache: RadixCache) -> dict[str, Any] | None:
    """The host tier's counts (not its timings, which differ run to run)."""
    t = cache.tier_stats()
    if t is None:
        return None
    names = ("host_free_pages", "host_cached_pages", "host_hit_tokens", "loaded_tokens",
             "abandoned_tokens", "backups_skipped", "host_evicted_pages", "failed_jobs", "pages_moved")
    return {name: getattr(t, name) for name in names}


def run(seed: int, steps: int) -> dict[str, Any]:
    rng = random.Random(seed)
    policy = rng.choice(["lru", "lfu", "fifo", "priority"])
    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
    # device only; a host tier under write-back (victims backed up before
    # they go, host copies load back); per-tenant device limits and floors
    setup = ("device", "host", "quotas")[seed % 3]
    extra: dict[str, Any] = {"allocate_kv": False}
    if setup == "host":
        extra = {"tiers": TierConfig(host=HostPoolConfig(pages=rng.choice([16, 32])),
                                     write_policy="write_back")}
    elif setup == "quotas":
        extra["quotas"] = QuotaBook({"t1": TenantQuota(device_pages=20, device_floor=4)},
                                    TenantQuota(device_floor=6))
    cache = RadixCache(CacheConfig(spec=spec, device_pages=rng.choice([24, 48, 96]), eviction_policy=policy,
                                   record_events=True, **extra))
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 24))] for _ in range(4)]
    live: list[Any] = []
    out: list[Any] = []
    for _ in range(steps):
        op = rng.random()
        if op < 0.45 or not live:
            prompt = rng.choice(prefixes)[: rng.randrange(0, 24)] + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
            ns = rng.choice(NAMESPACES)
            req = cache.admit(np.asarray(prompt, dtype=np.int32), ns, rng.randrange(3))
            live.append(req)
            out.append(["admit", req.cached_len, req.page_table.tolist()])
        elif op < 0.75:
            req = rng.choice(live)
            n = rng.randrange(0, req.num_tokens - req.num_computed + 1)
            try:
                cache.reserve(req, n)
                cache.commit(req, n)
                out.append(["commit", n, req.page_table.tolist(), req.shared_pages])
            except OutOfPagesError as e:
                out.append(["oop", e.requested, e.free, e.evictable])
            if req.num_computed == req.num_tokens and rng.random() < 0.5:
                cache.extend(req, [rng.randrange(50)])
        elif op < 0.93:
            req = live.pop(rng.randrange(len(live)))
            cache.release(req)
            out.append(["release", req.rid])
        elif op < 0.98:
            out.append(["evict", cache.evict(rng.randrange(1, 12))])
        else:
            out.append(["forget", cache.forget_namespace(rng.choice(NAMESPACES))])
        out.append(["drain", cache.drain()])  # (every job applied: the log does not depend on timing)
        out.append([_event(e) for e in cache.take_events()])
        cache.check_integrity()
    for req in live:
        cache.release(req)
    out.append([_event(e) for e in cache.take_events()])
    out.append(["stats", repr(cache.stats()), _tier_counts(cache)])
    return {"seed": seed, "policy": policy, "setup": setup, "log": out}


def main(argv: list[str]) -> None:
    seeds, steps = int(argv[0]), int(argv[1])
    json.dump({"compiled": COMPILED, "runs": [run(s, steps) for s in range(seeds)]}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])

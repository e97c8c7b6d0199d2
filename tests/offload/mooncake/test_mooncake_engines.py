"""Two engine processes share one Mooncake pool: a prompt prefilled on A is served on B.

Each engine is its own process with its own device and host pools, built
through the public ``RadixCache`` API, contributing no memory to the pool
(the default); the only thing they share is the pool, whose memory a holder
process keeps. A prefills prompts under two tenants (salted namespaces) and
writes them through host to the pool, then exits; B, started after A exited,
admits them: each tenant's pages come from the pool (storage hits), are
loaded into B's device pages and hold exactly the KV A computed, and no
tenant is ever served another's pages.

Run as a script, this file is one engine (``a`` or ``b``) on the pool URL
given; the test starts both. Each engine names the pool the way a user does:
``TierConfig(storage="mooncake://...")``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[3]

if TYPE_CHECKING:
    from radixcache import RadixCache
    from radixcache.offload.mooncake import MasterProcess
    from tests.offload.mooncake.mooncake_pools import MooncakeKit


def make_engine(url: str) -> RadixCache:
    """A small tiered engine whose storage tier is the pool at ``url``."""
    from radixcache import CacheConfig, RadixCache
    from radixcache.offload import HostPoolConfig
    from radixcache.tiers.config import TierConfig
    from tests.radixcache.tiers.tierkit import SPEC

    tiers = TierConfig(
        storage=url, host=HostPoolConfig(pages=16), write_policy="write_through",
        prefetch_policy="wait_complete", model_id="shared-model",
    )  # fmt: skip
    return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers))


def run_engine(role: str, url: str) -> dict[str, Any]:
    """Engine ``a`` prefills and stores under two tenants; engine ``b`` is served from the pool."""
    import numpy as np

    from radixcache import Namespace
    from tests.radixcache.tiers.tierkit import P, assert_kv_correct, prefill

    prompt = np.arange(1000, 1000 + 4 * P + 1, dtype=np.int32)
    cache = make_engine(url)
    try:
        if role == "a":
            for salt in ("tenant-1", "tenant-2"):
                cache.release(prefill(cache, prompt, Namespace(salt=salt)))
            cache.drain()
            tiers = cache.tier_stats()
            assert tiers is not None and tiers.storage is not None
            return {"puts": tiers.storage.puts}
        cached: dict[str, int] = {}
        for salt in ("tenant-1", "tenant-3", None):  # A's tenant, a tenant A never served, no salt
            ns = Namespace() if salt is None else Namespace(salt=salt)
            req = cache.admit(prompt, ns)
            cached[str(salt)] = req.cached_len
            cache.reserve(req, 1)
            assert req.ready
            assert_kv_correct(cache, req)  # bit-exact: every position holds its prefix's KV
            cache.release(req)
            cache.evict(8)  # the next tenant finds nothing on the device
        cache.check_integrity()
        tiers = cache.tier_stats()
        assert tiers is not None and tiers.storage is not None
        return {"cached": cached, "hits": tiers.storage.hits, "corrupt": tiers.storage.corrupt}
    finally:
        cache.close()


def _spawn(role: str, url: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, __file__, role, url], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_prompt_prefilled_on_engine_a_is_served_on_engine_b(
    mooncake_master: MasterProcess, mooncake_kit: MooncakeKit
) -> None:
    """The pool is emptied by ``mooncake_kit``; A's pages outlive A (a holder keeps them)."""
    assert _spawn("a", mooncake_master.url) == {"puts": 8}
    got = _spawn("b", mooncake_master.url)
    assert got == {"cached": {"tenant-1": 16, "tenant-3": 0, "None": 0}, "hits": 4, "corrupt": 0}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps(run_engine(sys.argv[1], sys.argv[2])))

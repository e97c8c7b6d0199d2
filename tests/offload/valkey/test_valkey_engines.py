"""Two engine processes share one Valkey pool: a prompt prefilled on A is served on B.

Each engine is its own process with its own device and host pools, built
through the public ``RadixCache`` API; the only thing they share is the pool.
A prefills a prompt and writes it through host to the pool; B, started after
A exited, admits the same prompt: the pages come from the pool (a storage
hit), are loaded into B's device pages and hold exactly the KV A computed.

Run as a script, this file is one engine (``a`` or ``b``) per pool URL given;
the test starts both. Each engine names the pool the way a user does:
``TierConfig(storage="valkey://...")``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[3]

import pytest

if TYPE_CHECKING:
    from radixcache import RadixCache
    from tests.offload.valkey.valkey_servers import ValkeyCluster, ValkeyServer


def make_engine(url: str, monkeypatch: pytest.MonkeyPatch | None = None) -> RadixCache:
    """A small tiered engine whose storage tier is the pool at ``url``
    (``TierConfig(storage=url)``, as a user configures it)."""
    from radixcache import CacheConfig, RadixCache
    from radixcache.offload import HostPoolConfig
    from radixcache.tiers.config import TierConfig
    from tests.radixcache.tiers.tierkit import SPEC

    fields: dict[str, Any] = {
        "host": HostPoolConfig(pages=16),
        "write_policy": "write_through",
        "prefetch_policy": "wait_complete",
        "model_id": "shared-model",
    }
    tiers = TierConfig(storage=url, **fields)
    return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers))


def run_engine(role: str, url: str) -> dict[str, Any]:
    """Engine ``a`` prefills and stores; engine ``b`` is served from the pool."""
    import numpy as np

    from tests.radixcache.tiers.tierkit import P, assert_kv_correct, prefill

    prompt = np.arange(1000, 1000 + 4 * P + 1, dtype=np.int32)
    cache = make_engine(url)
    try:
        if role == "a":
            cache.release(prefill(cache, prompt))
            cache.drain()
            tiers = cache.tier_stats()
            assert tiers is not None and tiers.storage is not None
            return {"puts": tiers.storage.puts, "hit_tokens": tiers.storage_hit_tokens}
        req = cache.admit(prompt)
        cached = req.cached_len
        cache.reserve(req, 1)
        assert req.ready
        assert_kv_correct(cache, req)  # bit-exact: every position holds its prefix's KV
        cache.check_integrity()
        tiers = cache.tier_stats()
        assert tiers is not None and tiers.storage is not None
        return {
            "cached": cached,
            "hit_tokens": tiers.storage_hit_tokens,
            "hits": tiers.storage.hits,
            "puts": tiers.storage.puts,
        }
    finally:
        cache.close()


def _spawn(role: str, urls: list[str]) -> list[dict[str, Any]]:
    """Run engine ``role`` once per pool URL, in one process (one torch import)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, __file__, role, *urls],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_prompt_prefilled_on_engine_a_is_served_on_engine_b(
    valkey_server: ValkeyServer, valkey_cluster: ValkeyCluster
) -> None:
    """On one server, then on a 3-node cluster (the prompt's pages spread over the nodes)."""
    valkey_server.flush()
    valkey_cluster.flush()
    urls = [valkey_server.url, valkey_cluster.url]
    assert _spawn("a", urls) == [{"puts": 4, "hit_tokens": 0}] * 2
    assert sum(node.client().dbsize() > 0 for node in valkey_cluster.nodes) >= 2
    assert _spawn("b", urls) == [{"cached": 16, "hit_tokens": 16, "hits": 4, "puts": 0}] * 2


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps([run_engine(sys.argv[1], url) for url in sys.argv[2:]]))


def test_an_engine_whose_pool_is_down_recomputes_and_never_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine itself (in this process) on a pool that is not there: every
    request is computed, KV is right, the failures are counted, nothing raises."""
    import numpy as np
    from tests.offload.valkey.valkey_servers import free_port

    from tests.radixcache.tiers.tierkit import P, assert_kv_correct, prefill

    cache = make_engine(f"valkey://127.0.0.1:{free_port()}/0", monkeypatch)
    try:
        prompt = np.arange(7, 7 + 2 * P + 1, dtype=np.int32)
        cache.release(prefill(cache, prompt))
        cache.drain()
        cache.evict(8)  # the whole device pool: only host copies are left
        again = prefill(cache, np.concatenate([prompt, prompt]))
        assert_kv_correct(cache, again)
        cache.release(again)
        cache.drain()
        cache.check_integrity()
        tiers = cache.tier_stats()
        assert tiers is not None and tiers.storage is not None
        assert tiers.storage.failed_ops >= 1 and tiers.storage.hits == 0
    finally:
        cache.close()

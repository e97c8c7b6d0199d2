"""The README's vLLM and SGLang switches build our tier and backend through the
engines' own factories, and the engine benchmark runs end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def readme_json(flag: str) -> dict[str, Any]:
    match = re.search(re.escape(flag) + r" '(\{.*?\})'", README)
    assert match is not None, f"no {flag} JSON in the README"
    value: dict[str, Any] = json.loads(match.group(1))
    return value


def test_readme_kv_transfer_config_builds_the_tier(tmp_path: Path) -> None:
    """The README's --kv-transfer-config, through vLLM's spec factory and manager."""
    pytest.importorskip("vllm")
    from tests.radixcache.integrations.vllm_kit import offloading_config, stack
    from vllm.v1.kv_offload.base import Locality
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = readme_json("--kv-transfer-config")
    assert config["kv_connector"] == "OffloadingConnector"
    extra = config["kv_connector_extra_config"]
    assert OffloadingSpecFactory.get_spec_cls(extra).__name__ == extra["spec_name"]
    (entry,) = extra["secondary_tiers"]
    entry = {**entry, "path": str(tmp_path / "vllm"), "capacity_bytes": 1 << 22}
    with stack(offloading_config([entry])) as s:
        assert s.tier.tier_type == "RadixcacheTier"
        assert s.tier.locality is Locality(entry["locality"])


def test_readme_hicache_extra_config_builds_the_backend(tmp_path: Path) -> None:
    """The README's extra config, through SGLang's backend factory, on SGLang's host pool."""
    pytest.importorskip("sglang")
    from tests.radixcache.integrations.sglang_kit import mha_pools, storage_config
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from radixcache.integrations.sglang import RadixcacheHiCacheStorage

    extra = readme_json("--hicache-storage-backend-extra-config")
    assert extra["interface_v1"] == 1
    host = mha_pools("page_first")[1]
    cfg = storage_config(tmp_path, host)
    cfg.extra_config = {**extra, "path": str(tmp_path / "sglang"), "capacity_bytes": 1 << 22}
    store = StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert isinstance(store, RadixcacheHiCacheStorage)
    store.register_mem_pool_host(host)
    assert store.path == str(tmp_path / "sglang" / "tp0")
    store.close()


def test_readme_quota_examples_build_both_adapters(tmp_path: Path) -> None:
    """The README's vLLM tier entry and SGLang extra config with ``quotas``,
    through each engine's own factory: every tenant's quota as written."""
    pytest.importorskip("vllm")
    pytest.importorskip("sglang")
    from tests.radixcache.integrations.sglang_kit import mha_pools, storage_config
    from tests.radixcache.integrations.vllm_kit import offloading_config, stack
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from radixcache.integrations.tenants import tenant_namespace

    line = re.search(r'^    (\{"type": "RadixcacheTier".*"quotas".*\})$', README, re.MULTILINE)
    assert line is not None, "no vLLM tier entry with quotas in the README"
    entry = {**json.loads(line.group(1)), "path": str(tmp_path / "vllm"), "capacity_bytes": 1 << 22}
    with stack(offloading_config([entry])) as s:
        book = s.tier.store._quotas.book
        noisy = book.get(tenant_namespace("noisy").tenant)
        assert (noisy.storage_bytes, noisy.ttl_s, book.default.ttl_s) == (10 << 30, 3600, 86400)
        assert book.get(tenant_namespace("quiet").tenant).storage_floor == 20 << 30
    flag = "--hicache-storage-backend-extra-config"
    configs = [json.loads(m) for m in re.findall(re.escape(flag) + r" '(\{.*?\})'", README)]
    (extra,) = [c for c in configs if "quotas" in c]
    host = mha_pools("page_first")[1]
    cfg = storage_config(tmp_path, host)
    cfg.extra_config = {**extra, "path": str(tmp_path / "sglang"), "capacity_bytes": 1 << 22}
    store = StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert store.quotas.get(None).ttl_s == 86400
    assert store.quotas.get(tenant_namespace("noisy").tenant).storage_bytes == 10 << 30


def test_engine_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("sglang")
    from radixcache.cli.bench.engines import run

    out = run(total_mib=2, repeat=1, parent=str(tmp_path))
    assert out["pages"] == 1
    assert set(out["vllm"]["ratios_vs_fs"]) == {
        f"{kind}_radixcache_{d}" for kind in ("store", "load") for d in ("fast", "safe")
    }
    assert all(r["found"] == 1 for r in out["vllm"]["restart"].values())
    assert all(r["found"] == 1 for r in out["sglang"]["restart"].values())
    assert out["sglang"]["load"]["radixcache_safe"]["gb_per_s"] > 0

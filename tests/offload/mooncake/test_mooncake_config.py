"""The Mooncake pool's configuration: URLs, defaults, clear refusals, and opening by URL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from radixcache.offload import MooncakeConfig, open_backend, storage_config

if TYPE_CHECKING:
    from tests.offload.mooncake.mooncake_pools import MooncakeKit


def test_urls_name_the_master_and_its_servers() -> None:
    plain = storage_config("mooncake://10.0.0.5")
    assert isinstance(plain, MooncakeConfig)
    assert (plain.master_address, plain.resolved_metadata_url) == ("10.0.0.5:50051", "http://10.0.0.5:8080/metadata")
    assert (plain.protocol, plain.segment_mib, plain.replicas, plain.tenant) == ("tcp", 0, 1, "default")
    assert plain.metrics_url is None
    full = MooncakeConfig.from_url(
        "mooncake://127.0.0.1:7000?metadata=http://127.0.0.1:7001/metadata&metrics=http://127.0.0.1:7002"
        "&protocol=rdma&device=mlx5_0&local_host=10.1.1.1&segment_mib=512&replicas=2&tenant=alpha",
        batch_pages=16,
    )
    assert full.master_address == "127.0.0.1:7000"
    assert full.resolved_metadata_url == "http://127.0.0.1:7001/metadata"
    assert (full.metrics_url, full.protocol, full.device) == ("http://127.0.0.1:7002", "rdma", "mlx5_0")
    assert (full.resolved_local_host, full.segment_mib, full.replicas, full.tenant) == ("10.1.1.1", 512, 2, "alpha")
    assert full.batch_pages == 16
    assert full.client_settings()["global_segment_size"] == 512 << 20
    assert storage_config(full) is full
    assert MooncakeConfig.from_url("mooncake://localhost:1").resolved_local_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mooncake://host?size=3", "unknown option 'size'"),
        ("mooncake://host:99999", "port"),
        ("mooncake://user:pw@host", "no credentials"),
        ("mooncake://host/db", "no path"),
        ("mooncake://host?protocol=udp", "protocol must be one of"),
        ("mooncake://host?segment_mib=-1", "whole number"),
        ("mooncake://host?replicas=0", "replicas"),
        ("mooncake://host?metadata=ftp://x", "metadata_url"),
        ("mooncake://host?tenant=", "tenant"),
    ],
)
def test_bad_urls_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage_config(url)


def test_bad_config_values_are_refused() -> None:
    with pytest.raises(ValueError, match="key_prefix"):
        MooncakeConfig(key_prefix="a b")
    with pytest.raises(ValueError, match="retry_after_s"):
        MooncakeConfig(retry_after_s=0)
    with pytest.raises(ValueError, match="log_level"):
        MooncakeConfig(log_level="DEBUG")
    with pytest.raises(TypeError, match="device"):
        MooncakeConfig(device=None)  # type: ignore[arg-type]


def test_open_backend_and_tier_config_take_a_mooncake_url(mooncake_kit: MooncakeKit, tmp_path: Path) -> None:
    from radixcache.offload import MooncakeStorage
    from radixcache.tiers.config import TierConfig

    opening = open_backend(mooncake_kit.url, mooncake_kit.spec, mooncake_kit.fingerprint)
    try:
        assert opening.state == "opened" and isinstance(opening.storage, MooncakeStorage)
        assert opening.storage.medium == "EXTERNAL"
        assert opening.storage.pool_stats().connected
        mooncake_kit.done(opening.storage.delete([]))  # a job: the pool's figures are read after it
        assert opening.storage.stats().capacity_bytes == 256 << 20  # the session's holder
    finally:
        opening.storage.close()
    tiers = TierConfig(storage=mooncake_kit.url)
    assert isinstance(tiers.storage, MooncakeConfig)

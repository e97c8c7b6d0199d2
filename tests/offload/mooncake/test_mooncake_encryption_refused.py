"""Encryption at rest is refused on a Mooncake pool, clearly and at open:
``key_file`` / ``key_env`` in a config, a URL, ``open_backend`` and
``TierConfig`` raise ValueError naming both settings, so an engine asked to
encrypt never writes the pool in the clear (README: "Shared pool on Mooncake
Store"). The open through a real master checks that nothing reached it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from radixcache.offload import MooncakeConfig, open_backend, storage_config

if TYPE_CHECKING:
    from tests.offload.mooncake.mooncake_pools import MooncakeKit

REFUSED = r"key_file / key_env \(encryption at rest\) are not supported on a Mooncake pool"


def _key_file(tmp: Path) -> str:
    path = tmp / "rx.key"
    path.write_text(bytes(range(32)).hex() + "\n")
    path.chmod(0o600)
    return str(path)


def test_a_config_or_url_with_keys_is_refused_by_name(tmp_path: Path) -> None:
    kf = _key_file(tmp_path)
    with pytest.raises(ValueError, match=REFUSED):
        MooncakeConfig(key_file=kf)
    with pytest.raises(ValueError, match=REFUSED):
        MooncakeConfig(key_env="RX_POOL_KEYS")
    with pytest.raises(ValueError, match=REFUSED):
        storage_config(f"mooncake://127.0.0.1:1?key_file={kf}")
    with pytest.raises(ValueError, match=REFUSED):
        MooncakeConfig.from_url("mooncake://127.0.0.1:1?key_env=RX_POOL_KEYS")
    with pytest.raises(ValueError, match=REFUSED):  # as the demo and PageStore add keys
        dataclasses.replace(MooncakeConfig(), key_file=kf)
    clear = MooncakeConfig()
    assert (clear.key_file, clear.key_env, clear.keys.enabled) == (None, None, False)


def test_opening_a_real_pool_with_keys_is_refused_and_writes_nothing(
    mooncake_kit: MooncakeKit, tmp_path: Path
) -> None:
    from radixcache.tiers.config import TierConfig

    url = f"{mooncake_kit.url}{'&' if '?' in mooncake_kit.url else '?'}key_file={_key_file(tmp_path)}"
    with pytest.raises(ValueError, match=REFUSED):
        open_backend(url, mooncake_kit.spec, mooncake_kit.fingerprint)
    with pytest.raises(ValueError, match=REFUSED):
        TierConfig(storage=url)
    # the same pool in the clear opens, and holds nothing of the refused opens
    store = mooncake_kit.pool()
    keys = mooncake_kit.keys(2)
    assert store.longest_prefix(keys) == 0
    assert store.codec.describe() == "records in the clear"

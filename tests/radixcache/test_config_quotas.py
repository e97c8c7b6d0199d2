"""``[quotas]`` in the config file: per-tenant quotas decoded by type into
``CacheConfig.quotas``, the environment laid over a tenant's keys, every
mistake a ConfigError naming the file, the tenant and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from radixcache import ConfigError, Namespace, RadixCache, load_config
from radixcache.tenants import TenantQuota, tenant_key

SPEC = '[spec]\nnum_layers = 1\nnum_kv_heads = 1\nhead_dim = 2\npage_size = 4\n' \
       '[cache]\ndevice_pages = 32\nallocate_kv = false\n'
QUOTAS = """
[quotas."*"]
device_pages = 8

[quotas.quiet]
device_floor = 4
host_pages = 16

[quotas."(none)"]
"""
DOCUMENT: dict[str, Any] = {
    "spec": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "page_size": 4},
    "cache": {"device_pages": 32, "allocate_kv": False},
    "quotas": {"*": {"device_pages": 8}, "quiet": {"device_floor": 4, "host_pages": 16},
               "(none)": {}},
}


def write(tmp_path: Path, text: str, name: str = "rx.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("suffix", [".toml", ".json", ".yaml"])
def test_quotas_decode_into_the_cache_config(tmp_path: Path, suffix: str) -> None:
    text = {".toml": SPEC + QUOTAS, ".json": json.dumps(DOCUMENT),
            ".yaml": yaml.safe_dump(DOCUMENT)}[suffix]
    book = load_config(write(tmp_path, text, f"rx{suffix}"), environ={}).cache.quotas
    assert book is not None and not isinstance(book, dict)
    assert book.default == TenantQuota(device_pages=8)  # "*": every tenant not listed
    assert book.get(tenant_key("quiet")) == TenantQuota(device_floor=4, host_pages=16)
    assert book.get(tenant_key(None)) == TenantQuota()  # "(none)": no salt, its own (none)
    assert book.get(tenant_key("other")) == TenantQuota(device_pages=8)


def test_the_loaded_quotas_are_enforced(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, SPEC + QUOTAS), environ={})
    cache = RadixCache(loaded.cache)
    try:
        assert cache.tenants.quotas_on and cache.tenants.quota("other").device_pages == 8
        for i in range(4):  # 4 prompts of 4 full pages for a tenant limited to 8 pages
            req = cache.admit(list(range(i * 100, i * 100 + 17)), Namespace("other"))
            cache.reserve(req, 17 - req.num_computed)
            cache.commit(req, 17 - req.num_computed)
            cache.release(req)
        assert cache.tenants.stats()["other"].device_pages == 8
    finally:
        cache.close()


def test_no_table_leaves_quotas_off_and_an_empty_one_turns_them_on(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, SPEC), environ={}).cache.quotas is None
    book = load_config(write(tmp_path, SPEC + "[quotas]\n"), environ={}).cache.quotas
    assert book is not None and not isinstance(book, dict)
    assert book.items() == [] and book.default == TenantQuota()
    cache = RadixCache(load_config(write(tmp_path, SPEC + "[quotas]\n"), environ={}).cache)
    try:
        assert cache.tenants.quotas_on  # set_quota works at run time
    finally:
        cache.close()


def test_the_environment_sets_one_key_of_a_tenant(tmp_path: Path) -> None:
    path = write(tmp_path, SPEC + QUOTAS)
    env = {"RADIXCACHE__QUOTAS__QUIET__DEVICE_PAGES": "12",
           "RADIXCACHE__QUOTAS__BATCH__HOST_FLOOR": "3"}
    loaded = load_config(path, environ=env)
    assert loaded.sections["quotas"]["quiet"] == {"device_floor": 4, "host_pages": 16,
                                                  "device_pages": 12}  # the file's keys stay
    book = loaded.cache.quotas
    assert book is not None and not isinstance(book, dict)
    assert book.get(tenant_key("batch")) == TenantQuota(host_floor=3)
    with pytest.raises(ConfigError, match=r"^environment \(RADIXCACHE__QUOTAS__QUIET__DEVICE_"
                                          r"PAGES\): Expected `int \| null`, got `str` - at "
                                          r"`\$\.quotas\.quiet\.device_pages`$"):
        load_config(path, environ={"RADIXCACHE__QUOTAS__QUIET__DEVICE_PAGES": "many"})


@pytest.mark.parametrize("table, message", [
    ("[quotas.quiet]\ndevice_page = 3\n",
     ": Object contains unknown field `device_page` - at `$.quotas.quiet`"),
    ('[quotas."tenant-a"]\ndevice_pages = "3"\n',
     ': Expected `int | null`, got `str` - at `$.quotas["tenant-a"].device_pages`'),
    ("[quotas.quiet]\ndevice_pages = true\n",
     ": Expected `int | null`, got `bool` - at `$.quotas.quiet.device_pages`"),
    ("[quotas]\nquiet = 3\n", ": Expected `object`, got `int` - at `$.quotas.quiet`"),
    ("[quotas.quiet]\ndevice_pages = 3\ndevice_floor = 4\n",
     " [quotas]['quiet']: TenantQuota: device_floor=4 is above device_pages=3"),
    ("[quotas.quiet]\nhost_floor = -1\n",
     " [quotas]['quiet']: TenantQuota.host_floor must be a non-negative int, got -1"),
    ('[quotas.""]\ndevice_pages = 1\n',
     " [quotas]: a tenant name must be a non-empty string, got ''"),
    ("[cache.quotas.quiet]\ndevice_pages = 1\n",
     ": Object contains unknown field `quotas` - at `$.cache`"),
])
def test_mistakes_name_the_file_the_tenant_and_the_key(tmp_path: Path, table: str,
                                                       message: str) -> None:
    text = SPEC + table if not table.startswith("[cache.") else SPEC.split("[cache]")[0] + table
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert str(err.value) == f"{path}{message}"

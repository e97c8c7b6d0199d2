"""One config file for the whole cache: every config decoded by type from
JSON, TOML and YAML, the environment laid over it, and every mistake a
ConfigError naming the file (or the variable) and the key."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings

import radixcache
from radixcache import CacheConfig, ConfigError, KVSpec, RadixCache, TierConfig, load_config
from radixcache.config import CacheFile, decode, decode_over, load
from radixcache.events import PublisherConfig
from radixcache.offload import HostPoolConfig, StorageConfig, ValkeyConfig
from radixcache.offload.mooncake import MooncakeConfig

DOC: dict[str, Any] = {
    "spec": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "dtype": "bfloat16",
             "page_size": 8},
    "cache": {"device_pages": 64, "eviction_policy": "lfu", "record_events": True},
    "host": {"pages": 96, "pin": False},
    "tiers": {"write_policy": "write_back", "prefetch_policy": "timeout",
              "prefetch_base_s": 0.01, "model_id": "m", "tp_rank": 1},
    "storage": {"path": "/tmp/rx-conf", "capacity_bytes": 1 << 30, "durability": "fast",
                "map_size_bytes": None, "disk_reserve_ratio": 0.02},
    "events": {"endpoint": "tcp://127.0.0.1:7001", "replay_endpoint": None, "topic": "kv",
               "queue_size": 8},
}
VALKEY = {"url": "valkeys://user@pool.internal:6380/2", "ttl_s": 60, "key_prefix": "t1:",
          "tls_ca_file": "/etc/ca.pem", "socket_timeout_s": 2.5, "observe_removals": False}
EXPECTED_SPEC = KVSpec(2, 2, 16, dtype=torch.bfloat16, page_size=8)


def write(tmp: Path, doc: dict[str, Any], suffix: str, name: str = "radixcache") -> Path:
    path = tmp / f"{name}{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(doc))
    elif suffix == ".yaml":
        path.write_text(yaml.safe_dump(doc))
    else:
        path.write_text(toml(doc))
    return path


def toml(doc: dict[str, Any]) -> str:
    """A TOML text of tables of scalars (what these tests write; null keys left out)."""
    lines = []
    for table, keys in doc.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items() if v is not None]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_every_config_of_the_cache_decodes_from_one_file(tmp_path: Path, suffix: str) -> None:
    loaded = load_config(write(tmp_path, DOC, suffix), environ={})
    replay = None if suffix != ".toml" else "tcp://127.0.0.1:5558"  # TOML has no null
    assert loaded.events == PublisherConfig(endpoint="tcp://127.0.0.1:7001", topic="kv",
                                            replay_endpoint=replay, queue_size=8)
    assert loaded.cache == CacheConfig(
        spec=EXPECTED_SPEC, device_pages=64, eviction_policy="lfu", record_events=True,
        tiers=TierConfig(host=HostPoolConfig(pages=96, pin=False), write_policy="write_back",
                         prefetch_policy="timeout", prefetch_base_s=0.01, model_id="m",
                         tp_rank=1,
                         storage=StorageConfig(path="/tmp/rx-conf", capacity_bytes=1 << 30,
                                               durability="fast", disk_reserve_ratio=0.02)))
    valkey = write(tmp_path, {**DOC, "storage": VALKEY}, suffix, "pool")
    pool = load_config(valkey, environ={"RADIXCACHE__STORAGE__PASSWORD": "0042"}).cache.tiers
    assert pool is not None and pool.storage == ValkeyConfig(
        host="pool.internal", port=6380, db=2, tls=True, username="user", password="0042",
        ttl_s=60, key_prefix=b"t1:", tls_ca_file="/etc/ca.pem", socket_timeout_s=2.5,
        observe_removals=False)  # a password of digits stays text


def test_the_loaded_config_opens_a_cache(tmp_path: Path) -> None:
    doc = {**DOC, "storage": {"path": str(tmp_path / "store"), "capacity_bytes": 1 << 24},
           "events": {}}
    loaded = load_config(write(tmp_path, doc, ".toml"), environ={})
    cache = RadixCache(loaded.cache)
    try:
        req = cache.admit(list(range(40)))
        assert cache.tier_stats() is not None and cache.spec.dtype == torch.bfloat16
        cache.release(req)
    finally:
        cache.close()
    assert radixcache.load_config is load_config and isinstance(loaded, CacheFile)
    only_spec = load_config(write(tmp_path, {"spec": DOC["spec"], "cache": {"device_pages": 4}},
                                  ".json"), environ={})
    assert only_spec.cache.tiers is None and only_spec.events is None  # no tier table: device only


@pytest.mark.parametrize("table", sorted(DOC))
def test_an_unknown_key_names_the_key_the_table_and_the_file(tmp_path: Path, table: str) -> None:
    doc = {**DOC, table: {**DOC[table], "endpont": 1}}
    path = write(tmp_path, doc, ".toml")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert str(err.value) == f"{path}: Object contains unknown field `endpont` - at `$.{table}`"
    with pytest.raises(ConfigError, match=f"{path}: Object contains unknown field `evnts`$"):
        load_config(write(tmp_path, {**DOC, "evnts": {}}, ".toml"), environ={})


WRONG_TYPES = {  # table -> (key, a value of the wrong type, the type expected)
    "spec": ("num_layers", "2", "int"), "cache": ("record_events", 1, "bool"),
    "host": ("pages", 9.5, "int | null"), "tiers": ("write_threshold", True, "int"),
    "storage": ("capacity_bytes", "1GB", "int"), "events": ("queue_size", "8", "int"),
}


@pytest.mark.parametrize("table", sorted(WRONG_TYPES))
def test_types_are_strict_in_every_table(tmp_path: Path, table: str) -> None:
    key, value, expected = WRONG_TYPES[table]
    path = write(tmp_path, {**DOC, table: {**DOC[table], key: value}}, ".json")
    with pytest.raises(ConfigError, match=rf"{path}: Expected `{expected}`, got `\w+` - at "
                                          rf"`\$.{table}.{key}`"):
        load_config(path, environ={})


def test_a_dtype_is_decoded_from_its_name(tmp_path: Path) -> None:
    for name, dtype in [("float16", torch.float16), ("float32", torch.float32),
                        ("bfloat16", torch.bfloat16)]:
        assert decode(KVSpec, {**DOC["spec"], "dtype": name}).dtype == dtype
    with pytest.raises(ConfigError, match=r"f.toml: unknown dtype 'bfloat' \(e.g. 'bfloat16', "
                                          r"'float16', 'float32'\) - at `\$.dtype`"):
        decode(KVSpec, {**DOC["spec"], "dtype": "bfloat"}, "f.toml")
    with pytest.raises(ConfigError, match=r"unknown dtype 'Tensor'"):
        decode(KVSpec, {**DOC["spec"], "dtype": "Tensor"})  # a torch name that is no dtype
    path = write(tmp_path, {**DOC, "spec": {**DOC["spec"], "dtype": 16}}, ".yaml")
    with pytest.raises(ConfigError, match=r"Expected a dtype name \(`str`\), got `int` - at "
                                          r"`\$.spec.dtype`"):
        load_config(path, environ={})
    pool = decode_over(ValkeyConfig(port=7000), {"key_prefix": "p:", "ttl_s": None}, "f.json")
    assert (pool.port, pool.key_prefix, pool.ttl_s) == (7000, b"p:", None)
    with pytest.raises(ConfigError, match=r"f.json: Expected `int`, got `str` - at `\$.port`"):
        decode_over(pool, {"port": "1"}, "f.json")
    with pytest.raises(ConfigError, match=r"Expected `str` \(text, UTF-8 encoded\), got `int` "
                                          r"- at `\$.key_prefix`"):
        decode(ValkeyConfig, {"key_prefix": 5})


def test_values_the_configs_reject_name_the_file_and_table(tmp_path: Path) -> None:
    cases = {
        "spec": ({"page_size": 12}, "page_size must be a positive power of two, got 12"),
        "cache": ({"device_pages": 0}, "device_pages must be a positive int, got 0"),
        "host": ({"ratio": 2.0}, "HostPoolConfig needs exactly one of pages, nbytes, ratio"),
        "tiers": ({"write_policy": "sometimes"}, "sometimes"),
        "storage": ({"durability": "medium"}, "durability must be one of"),
        "events": ({"media": "dynamo"}, "media must be 'sglang' or 'vllm'"),
    }
    for table, (keys, message) in cases.items():
        path = write(tmp_path, {**DOC, table: {**DOC[table], **keys}}, ".toml")
        with pytest.raises(ConfigError, match=rf"^{path} \[{table}\]: .*{message}"):
            load_config(path, environ={})
    path = write(tmp_path, {"cache": {"device_pages": 4}}, ".toml")
    with pytest.raises(ConfigError, match=rf"{path}: Object missing required field `spec`"):
        load_config(path, environ={})
    path = write(tmp_path, {"spec": {"num_layers": 1}}, ".toml")
    with pytest.raises(ConfigError, match=rf"{path} \[spec\]: Object missing required field "
                                          r"`num_kv_heads`"):
        load_config(path, environ={})


def test_storage_is_chosen_by_url_and_takes_only_that_backends_keys(tmp_path: Path) -> None:
    path = write(tmp_path, {**DOC, "storage": {"url": "lmdb:///tmp/x?capacity_gib=2",
                                                "durability": "fast"}}, ".toml")
    tiers = load_config(path, environ={}).cache.tiers
    assert tiers is not None and tiers.storage == StorageConfig(
        path="/tmp/x", capacity_bytes=2 << 30, durability="fast")
    path = write(tmp_path, {**DOC, "storage": {"url": "valkey://h:1/0", "durability": "fast"}},
                 ".toml")
    with pytest.raises(ConfigError, match=rf"{path}: `durability` is not a setting of a Valkey "
                                          r"pool \(url = 'valkey://h:1/0'\) - at `\$.storage`"):
        load_config(path, environ={})
    path = write(tmp_path, {**DOC, "storage": {"ttl_s": 5}}, ".toml")
    with pytest.raises(ConfigError, match=r"`ttl_s` is not a setting of an LMDB store"):
        load_config(path, environ={})
    path = write(tmp_path, {**DOC, "storage": {"url": "ftp://u:secret@h/"}}, ".toml")
    with pytest.raises(ConfigError, match=r"ftp://u:\*\*\*@h/.* - at `\$.storage.url`") as err:
        load_config(path, environ={})
    assert "secret" not in str(err.value)


def test_a_mooncake_pool_takes_its_settings_from_its_url_alone(tmp_path: Path) -> None:
    path = write(tmp_path, {**DOC, "storage": {"url": "mooncake://10.0.0.7:50051?segment_mib=64"}},
                 ".toml")
    tiers = load_config(path, environ={}).cache.tiers
    assert tiers is not None and isinstance(tiers.storage, MooncakeConfig)
    assert (tiers.storage.host, tiers.storage.port, tiers.storage.segment_mib) == ("10.0.0.7", 50051, 64)
    path = write(tmp_path, {**DOC, "storage": {"url": "mooncake://10.0.0.7:50051", "ttl_s": 5}},
                 ".toml")
    with pytest.raises(ConfigError, match=r"`ttl_s` is not a setting of a Mooncake Store pool "
                                          r"\(its options go in the url\)"):
        load_config(path, environ={})


def test_the_environment_overrides_secrets_and_endpoints_by_type(tmp_path: Path) -> None:
    path = write(tmp_path, {**DOC, "storage": VALKEY}, ".toml")
    env = {"RADIXCACHE__STORAGE__URL": "valkey://10.0.0.5:7000?cluster=true",
           "RADIXCACHE__STORAGE__PASSWORD": "s3cret", "RADIXCACHE__STORAGE__TTL_S": "120",
           "RADIXCACHE__EVENTS__ENDPOINT": "tcp://*:5557",
           "RADIXCACHE__CACHE__RECORD_EVENTS": "false", "OTHER": "1"}
    loaded = load_config(path, environ=env)
    assert loaded.cache.tiers is not None and isinstance(loaded.cache.tiers.storage, ValkeyConfig)
    pool = loaded.cache.tiers.storage
    assert (pool.host, pool.port, pool.cluster, pool.password, pool.ttl_s, pool.key_prefix) == (
        "10.0.0.5", 7000, True, "s3cret", 120, b"t1:")
    assert loaded.events is not None and loaded.events.endpoint == "tcp://*:5557"
    assert loaded.cache.record_events is False
    with pytest.raises(ConfigError, match=r"environment \(RADIXCACHE__STORAGE__TTL_S\): Expected "
                                          r"`int \| null`, got `str` - at `\$.storage.ttl_s`"):
        load_config(path, environ={"RADIXCACHE__STORAGE__TTL_S": "a week"})
    with pytest.raises(ConfigError, match=r"environment \(RADIXCACHE__HOST__PAGS\): Object "
                                          r"contains unknown field `pags` - at `\$.host`"):
        load_config(path, environ={"RADIXCACHE__HOST__PAGS": "1"})
    only_spec = write(tmp_path, {"spec": DOC["spec"], "cache": {"device_pages": 4}}, ".json")
    tiers = load_config(only_spec, environ={"RADIXCACHE__STORAGE__URL": str(tmp_path)}).cache.tiers
    assert tiers is not None and tiers.storage == StorageConfig(path=str(tmp_path))
    events = load(PublisherConfig, path, "events", environ={"RADIXCACHE__EVENTS__TOPIC": "123"})
    assert events.topic == "123"  # digits for a str field stay text


# -- any document: a config, or one ConfigError ------------------------------------
KEYS = sorted({k for table in DOC.values() for k in table} | set(VALKEY)
              | {"url", "nbytes", "ratio", "device_bytes", "device", "dp_rank", "x"})
scalars = (st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.floats(allow_nan=True)
           | st.sampled_from(["bfloat16", "lru", "safe", "tcp://127.0.0.1:1", "valkey://h:1/0",
                              "lmdb:///tmp/q", "", "write_back", "timeout", "x"])
           | st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=2)
                      | st.dictionaries(st.sampled_from(KEYS), inner, max_size=2), max_leaves=4)


@st.composite
def table(draw: st.DrawFn, keys: dict[str, Any], every: bool = False) -> dict[str, Any]:
    """Some of ``keys`` (``every``: all) with their good values; now and then
    one of them, or a stray key, with any value."""
    some = st.fixed_dictionaries({}, optional={k: st.just(v) for k, v in keys.items()})
    out = dict(keys) if every else draw(some)
    mistake = draw(st.integers(0, 15))
    if mistake < 2:
        out[draw(st.sampled_from(KEYS if mistake == 0 else sorted(keys)))] = draw(values)
    return out


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A whole-cache document: mostly good tables, now and then a table that
    is any value, or a stray table."""
    doc = {"spec": draw(table(DOC["spec"], every=True)), "cache": draw(table(DOC["cache"], every=True))}
    for name in draw(st.lists(st.sampled_from(["host", "tiers", "events", "storage"]),
                              unique=True)):
        doc[name] = draw(table(VALKEY if name == "storage" and draw(st.booleans())
                               else DOC[name]))
    mistake = draw(st.integers(0, 9))
    if mistake < 2:
        doc[draw(st.sampled_from([*DOC, "other"])) if mistake == 0 else "other"] = draw(values)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents(), st.sampled_from([".json", ".yaml"]),
       st.dictionaries(st.sampled_from(["RADIXCACHE__STORAGE__URL", "RADIXCACHE__SPEC__DTYPE",
                                        "RADIXCACHE__CACHE__DEVICE_PAGES", "RADIXCACHE__X",
                                        "RADIXCACHE__HOST__RATIO"]),
                       st.text(max_size=6), max_size=2))
def test_any_document_decodes_or_raises_config_error(
        doc: dict[str, Any], suffix: str, env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = write(Path(tmp), doc, suffix)
        except (ValueError, OverflowError):
            return  # not expressible in this format (e.g. NaN in strict writers)
        try:
            loaded = load_config(path, environ=env)
        except ConfigError as err:
            assert str(err).startswith((os.fspath(path), "environment ("))
            return
        assert isinstance(loaded.cache, CacheConfig)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.sampled_from([".json", ".toml", ".yaml", ".ini"]))
def test_any_file_text_parses_or_raises_config_error(text: str, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"c{suffix}"
        path.write_text(text)
        try:
            load_config(path, environ={})
        except ConfigError as err:
            assert str(err).startswith(os.fspath(path))


def test_the_shipped_example_file_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "radixcache.toml"
    loaded = load_config(example, environ={})
    assert loaded.cache.spec == KVSpec(8, 4, 64, dtype=torch.float16, page_size=16)
    assert loaded.cache.tiers is not None and loaded.cache.tiers.host == HostPoolConfig(ratio=2.0)
    assert loaded.events is not None and loaded.events.endpoint == "tcp://127.0.0.1:*"

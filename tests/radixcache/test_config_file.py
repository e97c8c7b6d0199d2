"""Configs from files and the environment: typed, strict decoding (msgspec)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixcache.config import ConfigError, decode, load, schema, with_environment
from radixcache.events import PublisherConfig
from radixcache.integrations.pagestore import PageStoreConfig


def test_a_config_decodes_by_type_and_keeps_its_own_value_checks() -> None:
    config = decode(PublisherConfig, {"endpoint": "tcp://127.0.0.1:*", "queue_size": 8})
    assert config == PublisherConfig(endpoint="tcp://127.0.0.1:*", queue_size=8)
    with pytest.raises(ConfigError, match=r"f.toml: Expected `int`, got `str` - at `\$.queue_size`"):
        decode(PublisherConfig, {"queue_size": "8"}, "f.toml")  # strict: no "8" for 8
    with pytest.raises(ConfigError, match=r"Expected `int`, got `bool` - at `\$.queue_size`"):
        decode(PublisherConfig, {"queue_size": True})
    with pytest.raises(ConfigError, match="f.json: Object contains unknown field `endpont`"):
        decode(PublisherConfig, {"endpont": "tcp://x:1"}, "f.json")
    with pytest.raises(ConfigError, match="f.json: media must be 'sglang' or 'vllm'"):
        decode(PublisherConfig, {"media": "dynamo"}, "f.json")  # the dataclass's own check
    with pytest.raises(ConfigError, match=r"Object missing required field `page_bytes`"):
        decode(PageStoreConfig, {"path": "/x", "engine": "e", "model": "m", "layout": "l"})
    assert set(schema(PublisherConfig).__struct_fields__) == set(
        PublisherConfig.__dataclass_fields__)


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_one_file_format_in_json_toml_and_yaml(tmp_path: Path, suffix: str) -> None:
    text = {
        ".json": json.dumps({"events": {"endpoint": "tcp://127.0.0.1:7001", "topic": "kv"}}),
        ".toml": '[events]\nendpoint = "tcp://127.0.0.1:7001"\ntopic = "kv"\n',
        ".yaml": "events:\n  endpoint: tcp://127.0.0.1:7001\n  topic: kv\n",
    }[suffix]
    path = tmp_path / f"radixcache{suffix}"
    path.write_text(text)
    config = load(PublisherConfig, path, "events", environ={})
    assert (config.endpoint, config.topic) == ("tcp://127.0.0.1:7001", "kv")


def test_unknown_keys_name_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "radixcache.toml"
    path.write_text('[events]\nendpoint = "tcp://127.0.0.1:7001"\nhwm = 5\n')
    with pytest.raises(ConfigError) as err:
        load(PublisherConfig, path, "events", environ={})
    assert str(err.value) == f"{path} [events]: Object contains unknown field `hwm`"
    with pytest.raises(ConfigError, match=r"no \[cache\] table"):
        load(PublisherConfig, path, "cache", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[events\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load(PublisherConfig, bad, "events", environ={})


def test_the_environment_overrides_endpoints_and_secrets(tmp_path: Path) -> None:
    path = tmp_path / "radixcache.toml"
    path.write_text('[events]\nendpoint = "tcp://127.0.0.1:7001"\nqueue_size = 8\n')
    env = {"RADIXCACHE__EVENTS__ENDPOINT": "tcp://*:5557", "RADIXCACHE__EVENTS__QUEUE_SIZE": "64",
           "RADIXCACHE__OTHER__X": "1"}
    config = load(PublisherConfig, path, "events", environ=env)
    assert (config.endpoint, config.queue_size) == ("tcp://*:5557", 64)
    with pytest.raises(ConfigError, match="unknown field `hwm`"):
        load(PublisherConfig, path, "events", environ={"RADIXCACHE__EVENTS__HWM": "1"})
    assert with_environment({"a": {"b": 1}}, environ={"RADIXCACHE__A__C": "x"}) == {
        "a": {"b": 1, "c": "x"}}

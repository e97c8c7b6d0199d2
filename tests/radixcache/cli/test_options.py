"""Options: vLLM's KVEventsConfig keys map onto PublisherConfig; HiCache's
policy choices come from the registries; every option of every subcommand
has a help line that shows its default; ``radixcache -h`` lists exactly the
subcommands the README documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radixcache.cli import build_parser, main
from radixcache.cli.kv_events_config import KEYS, publisher_config
from radixcache.events import PublisherConfig
from radixcache.offload import policy, prefetch_policy_names, write_policy_names

ROOT = Path(__file__).resolve().parents[3]
BASE = PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")


# ---------------------------------------------------------------------- vLLM KVEventsConfig
def test_every_vllm_key_maps_onto_the_publisher_config() -> None:
    config = publisher_config({
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:6001",
        "replay_endpoint": "tcp://127.0.0.1:6002", "buffer_steps": 50, "hwm": 7,
        "max_queue_size": 9, "topic": "kv@engine-0",
    }, BASE)
    assert config == PublisherConfig(
        endpoint="tcp://127.0.0.1:6001", replay_endpoint="tcp://127.0.0.1:6002",
        replay_buffer_size=50, send_hwm=7, queue_size=9, topic="kv@engine-0",
    )
    assert set(KEYS) == {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint",
                         "buffer_steps", "hwm", "max_queue_size", "topic"}


def test_keys_left_out_keep_our_loopback_defaults() -> None:
    config = publisher_config({"enable_kv_cache_events": True}, BASE)
    assert config == BASE
    assert config is not None and config.endpoint.startswith("tcp://127.0.0.1:")
    no_replay = publisher_config({"enable_kv_cache_events": True, "replay_endpoint": None}, BASE)
    assert no_replay is not None and no_replay.replay_endpoint is None


@pytest.mark.parametrize("values", [
    {}, {"enable_kv_cache_events": False, "publisher": "zmq"},
    {"enable_kv_cache_events": True, "publisher": "null"},
])
def test_events_off_as_in_vllm(values: dict[str, object]) -> None:
    assert publisher_config(values, BASE) is None


@pytest.mark.parametrize(("values", "message"), [
    ({"enable_kv_cache_events": True, "endpont": "x"}, "unknown key(s) endpont"),
    ({"hwm": True}, "hwm must be an integer"),
    ({"topic": 3}, "topic must be a string"),
    ({"replay_endpoint": 5}, "replay_endpoint must be a string or null"),
    ({"publisher": "nats"}, "publisher must be one of zmq, null"),
    ({"max_queue_size": -1}, "queue_size must be positive"),
])
def test_bad_vllm_keys(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        publisher_config(values, BASE)


# ---------------------------------------------------------------------- HiCache names
def _option(command: str, flag: str):  # type: ignore[no-untyped-def]
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return next(a for a in sub._actions if flag in a.option_strings)


@pytest.mark.parametrize("command", ["demo", "replay"])
def test_hicache_flags_are_aliases_with_registry_choices(command: str) -> None:
    write = _option(command, "--hicache-write-policy")
    assert write.option_strings == ["--write-policy", "--hicache-write-policy"]
    assert list(write.choices) == write_policy_names()
    prefetch = _option(command, "--hicache-storage-prefetch-policy")
    assert "--prefetch-policy" in prefetch.option_strings
    assert list(prefetch.choices) == prefetch_policy_names()
    assert _option(command, "--hicache-ratio").dest == "host_ratio"
    assert _option(command, "--hicache-size").dest == "host_gb"


def test_a_registered_policy_is_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(policy._WRITE, "write_around", policy.WriteBack)
    assert "write_around" in _option("demo", "--hicache-write-policy").choices


def test_replay_hicache_names_give_the_same_figures(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(ROOT / "examples" / "data" / "mooncake_synthetic_trace.jsonl")
    base = ["replay", trace, "--limit", "120", "--device-pages", "200", "--quiet", "--json", "-"]
    outs = []
    for argv in (["--host-ratio", "2", "--write-policy", "write_back"],
                 ["--hicache-ratio", "2", "--hicache-write-policy", "write_back"],
                 # 400 pages of 512 tokens of 1 KiB per token
                 ["--hicache-size", f"{400 * 512 * 1024 / 1e9}", "--kv-bytes-per-token", "1024",
                  "--hicache-write-policy", "write_back"]):
        assert main([*base, *argv]) == 0
        outs.append(capsys.readouterr().out)
    assert '"host_pages": 400' in outs[0]
    assert outs[0].split('"wall_s"')[0] == outs[1].split('"wall_s"')[0] == \
        outs[2].split('"wall_s"')[0]


# ---------------------------------------------------------------------- help
COMMANDS = [["demo"], ["replay"], ["bench"], ["bench", "tree"], ["bench", "copy"],
            ["bench", "storage"], ["bench", "events"]]


def option_helps(text: str) -> dict[str, str]:
    """Each option's help text in an argparse help page (options section)."""
    section = text.split("\noptions:\n", 1)[1]
    helps: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        if re.match(r"^  -", line):
            parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            name = parts[0]
            helps[name] = parts[1] if len(parts) > 1 else ""
        elif name is not None and line.startswith("    "):
            helps[name] += " " + line.strip()
        elif not line.strip():
            name = None
    return helps


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_option_has_help_and_shows_its_default(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "-h"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: radixcache {' '.join(argv)} ")
    helps = option_helps(text)
    assert "-h, --help" in helps
    for name, help_text in helps.items():
        if name == "-h, --help":
            continue
        assert help_text.strip(), f"{name} has no help"
        assert "(default:" in help_text, f"{name}: {help_text!r} shows no default"


def test_the_subcommands_are_the_readme_ones(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"(?:^ {4}|`)radixcache ([a-z]+)", readme, re.M))
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(sub) == documented == {"demo", "replay", "bench"}
    assert main(["-h"]) == 0
    listed = re.findall(r"^    ([a-z]+)  ", capsys.readouterr().out, re.M)
    assert listed == ["demo", "replay", "bench"]

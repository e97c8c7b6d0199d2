"""``radixcache demo --config FILE``: the library's config file under the
command's flags, with the environment's overrides; mistakes in one line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.cli import build_parser
from radixcache.cli.config_option import apply_config, given_dests
from radixcache.cli.parser import UsageError
from radixcache.cli.quota_option import quota_document
from radixcache.cli.replay.presets import MODEL_PRESETS
from tests.radixcache.cli.clikit import ROOT, TRACE, assert_one_line_error, run_cli

SIZES = ["--device", "cpu", "--tenants", "2", "--chats", "3", "--turns", "2", "--system", "128",
         "--user", "32", "--decode", "2", "--restart-requests", "2"]


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "radixcache.toml"
    path.write_text(f"""
[spec]
num_layers = 2
num_kv_heads = 1
head_dim = 8
dtype = "bfloat16"

[cache]
device_pages = 40

[host]
pages = 48

[tiers]
write_policy = "write_back"

[storage]
path = "{tmp_path / 'store'}"
capacity_bytes = 16_777_216
durability = "fast"

[events]
endpoint = "tcp://127.0.0.1:*"
replay_endpoint = "tcp://127.0.0.1:*"
topic = "kv"
""")
    return path


def parsed(argv: list[str]) -> argparse.Namespace:
    """``argv`` as ``radixcache`` parses it, with the file of ``--config`` applied."""
    args, _ = build_parser().parse_known_args(argv)
    apply_config(args, given_dests(build_parser, argv))
    return args


def test_the_demo_runs_from_the_file_and_a_flag_wins(tmp_path: Path) -> None:
    conf = config_file(tmp_path)
    env = {**os.environ, "RADIXCACHE__TIERS__PREFETCH_POLICY": "best_effort"}
    proc = subprocess.run([sys.executable, "-m", "radixcache", "demo", "--config", str(conf),
                           *SIZES, "--device-pages", "32"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = proc.stdout.splitlines()[0]
    # page: 2 layers x 1 head x 8 dims x 16 tokens x K and V x 2 bytes (bfloat16) = 1 KiB
    assert header.startswith("radixcache demo on cpu: page 1 KiB; device 32 pages"), header
    assert "host 48 pages" in header and f"LMDB 16 MiB at {tmp_path / 'store'}" in header
    assert "write policy write_back, prefetch best_effort" in header  # file, then environment
    assert "events: publishing on tcp://127.0.0.1:" in proc.stdout
    assert (tmp_path / "store" / "data.mdb").exists()


def test_flags_given_win_even_at_their_default_values(tmp_path: Path) -> None:
    conf = str(config_file(tmp_path))
    args = parsed(["demo", "--config", conf])
    assert (args.device_pages, args.layers, args.kv_dtype, args.host_pages) == (40, 2, "bfloat16", 48)
    assert args.config_fields["storage"]["durability"] == "fast"
    args = parsed(["demo", "--config", conf, "--device-pages=384", "--kv-dtype", "float16",
                   "--hicache-ratio", "2", "--storage-mib", "8"])
    assert (args.device_pages, args.kv_dtype, args.host_ratio) == (384, "float16", 2.0)
    assert "host" not in args.config_fields  # the ratio flag replaced the file's size
    assert "capacity_bytes" not in args.config_fields["storage"] and args.storage_mib == 8
    assert given_dests(build_parser, ["demo", "--hicache-size", "3"]) == {"host_gb"}


def test_mistakes_in_the_file_are_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    conf = config_file(tmp_path)
    conf.write_text(conf.read_text().replace("topic =", "topc ="))
    line = assert_one_line_error(run_cli("demo", "--config", str(conf)), "demo",
                                 "Object contains unknown field `topc` - at `$.events`")
    assert str(conf) in line
    conf.write_text(conf.read_text().replace("durability = \"fast\"", "durability = \"slow\""))
    conf.write_text(conf.read_text().replace("topc =", "topic ="))
    line = assert_one_line_error(run_cli("demo", "--config", str(conf), *SIZES), "demo",
                                 "[storage]: durability must be one of ('safe', 'fast'), got 'slow'")
    assert str(conf) in line
    assert_one_line_error(run_cli("demo", "--config", str(tmp_path / "none.toml")), "demo",
                          "No such file or directory")
    with pytest.raises(UsageError, match=r"environment \(RADIXCACHE__SPEC__DTYPE\): unknown dtype "
                                         r"'f16'"):
        os.environ["RADIXCACHE__SPEC__DTYPE"] = "f16"
        try:
            parsed(["demo", "--config", str(conf)])
        finally:
            del os.environ["RADIXCACHE__SPEC__DTYPE"]


def test_replay_takes_the_keys_it_has_flags_for_and_the_kv_size(tmp_path: Path) -> None:
    conf = str(config_file(tmp_path))
    trace = str(TRACE)
    args = parsed(["replay", trace, "--config", conf])
    # 2 layers x 1 head x 8 dims x K and V x 2 bytes (bfloat16)
    assert (args.device_pages, args.host_pages, args.write_policy, args.kv_bytes_per_token,
            args.storage_path) == (40, 48, "write_back", 64, str(tmp_path / "store"))
    args = parsed(["replay", trace, "--config", conf, "--model", sorted(MODEL_PRESETS)[0],
                   "--write-policy", "write_through"])
    assert (args.kv_bytes_per_token, args.write_policy) == (None, "write_through")
    proc = run_cli("replay", trace, "--config", conf, "--page-size", "512", "--limit", "50",
                   "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pages of 512 tokens: device 40, host 48" in proc.stdout, proc.stdout


QUOTAS = """
[quotas.noisy]
device_pages = 16

[quotas.quiet]
device_floor = 32
"""


def test_quotas_come_from_the_file_unless_the_flag_is_given(tmp_path: Path) -> None:
    conf = config_file(tmp_path)
    conf.write_text(conf.read_text() + QUOTAS)
    expected = {"noisy": {"device_pages": 16}, "quiet": {"device_floor": 32}}
    for argv in (["demo", "--config", str(conf)], ["replay", str(TRACE), "--config", str(conf)]):
        args = parsed(argv)
        assert quota_document(args.quotas) == expected
        assert "quotas" not in args.config_fields
        args = parsed([*argv, "--quotas", '{"*": {"device_pages": 8}}'])  # the whole table
        assert quota_document(args.quotas) == {"*": {"device_pages": 8}}
    assert build_parser().parse_args(["demo"]).quotas is None  # no file, no flag: quotas off
    os.environ["RADIXCACHE__QUOTAS__NOISY__DEVICE_FLOOR"] = "4"
    try:
        args = parsed(["demo", "--config", str(conf)])
    finally:
        del os.environ["RADIXCACHE__QUOTAS__NOISY__DEVICE_FLOOR"]
    assert quota_document(args.quotas)["noisy"] == {"device_pages": 16, "device_floor": 4}


def test_the_noisy_neighbor_runs_the_files_quotas_and_leaves_its_storage_alone(
        tmp_path: Path) -> None:
    conf = config_file(tmp_path)  # [storage] and [events]: not used by this mode
    conf.write_text(conf.read_text().replace("device_pages = 40", "device_pages = 64") + QUOTAS)
    proc = run_cli("demo", "--noisy-neighbor", "--config", str(conf), "--device", "cpu",
                   "--chats", "2", "--turns", "2", "--system", "64", "--user", "32",
                   "--decode", "2", "--noisy-prompt", "128")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ('quotas (from --quotas or --config): {"noisy": {"device_pages": 16}, '
            '"quiet": {"device_floor": 32}}') in proc.stdout
    assert "device 64 pages (64 KiB), host 48 pages" in proc.stdout  # the file's sizes
    assert not (tmp_path / "store").exists()
    assert_one_line_error(run_cli("demo", "--noisy-neighbor", "--config", str(conf),
                                  "--storage-mib", "8"), "demo", "--storage-mib not used here")


@pytest.mark.parametrize("table, message", [
    ("[quotas.noisy]\ndevice_pages = 2\ndevice_floor = 3\n",
     " [quotas]['noisy']: TenantQuota: device_floor=3 is above device_pages=2"),
    ("[quotas.noisy]\ndevice_pagez = 2\n",
     ": Object contains unknown field `device_pagez` - at `$.quotas.noisy`"),
    ('[quotas."tenant-a"]\nhost_pages = "2"\n',
     ': Expected `int | null`, got `str` - at `$.quotas["tenant-a"].host_pages`'),
])
def test_mistakes_in_the_files_quotas_are_one_line(tmp_path: Path, table: str,
                                                   message: str) -> None:
    conf = config_file(tmp_path)
    conf.write_text(conf.read_text() + table)
    for command in (["demo"], ["replay", str(TRACE)]):
        assert_one_line_error(run_cli(*command, "--config", str(conf)), command[0],
                              f"--config: {conf}{message}")

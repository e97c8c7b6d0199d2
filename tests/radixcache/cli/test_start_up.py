"""The command line starts in a fraction of a second: building the parser,
parsing options, help pages and usage errors import neither torch nor the
engine (the cache, its tiers, storage backends, the event stream); a command
imports them when it runs.

One exception, by design: ``--storage URL`` and ``--config FILE`` are
checked by the library's own readers, which load the backends."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from radixcache.cli import build_parser, command_function
from radixcache.cli.demo.command import resolve_defaults
from tests.radixcache.cli.clikit import ROOT, TRACE

# modules (and their submodules) that only running a command may load
HEAVY = ("torch", "radixcache.cache", "radixcache.tiers", "radixcache.transfer",
         "radixcache.offload.backends", "radixcache.offload.lmdb", "radixcache.offload.host",
         "radixcache.events", "radixcache.config", "zmq", "lmdb")

# In a fresh interpreter: run ``main(ARGV)`` (help and usage errors return
# before a command runs) or, for an ARGV that would run one, only parse it as
# ``main`` does; print main's exit status (None: parsed only) and the HEAVY
# modules loaded.
PROBE = """
import json, sys
from radixcache.cli import build_parser, main
argv, heavy, parse_only = json.loads(sys.argv[1])
if parse_only:
    _args, unknown = build_parser().parse_known_args(argv)
    assert not unknown, unknown
    code = None
else:
    code = main(argv)
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print(json.dumps([code, loaded]))
"""
TRACE_ARG = str(TRACE.relative_to(ROOT))  # the probe runs in ROOT

# argv -> main's exit status
HELP_AND_MISTAKES = [
    (["-h"], 0),
    (["demo", "-h"], 0),
    (["replay", "-h"], 0),
    (["bench", "-h"], 0),
    ([], 2),  # no command
    (["nope"], 2),
    (["demo", "--page-size", "x"], 2),
    (["demo", "--write-policy", "nope"], 2),
    (["demo", "--quotas", '{"noisy": {"device_pages": "many"}}'], 2),
    (["demo", "--no-such-flag"], 2),
    (["replay"], 2),  # no trace
    (["replay", TRACE_ARG, "--warmup", "1.5"], 2),
    (["replay", TRACE_ARG, "--eviction-policy", "nope"], 2),
    (["bench", "nope"], 2),
]

# options a command would run with: parsed only
COMMANDS = [
    ["demo", "--device", "cpu", "--page-size", "32", "--host-pages", "64", "--noisy-neighbor",
     "--quotas", '{"noisy": {"device_pages": 64}}',
     "--kv-events-config", '{"enable_kv_cache_events": true}'],
    ["replay", TRACE_ARG, "--limit", "5", "--model", "qwen2.5-7b", "--eviction-policy", "lfu",
     "--hicache-ratio", "2", "--write-policy", "write_back"],
    ["bench", "tree", "--quick"],
]


def probe(argv: list[str], parse_only: bool) -> tuple[int | None, list[str]]:
    """(main's exit status or None, the HEAVY modules loaded) in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([argv, HEAVY, parse_only])],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, loaded = json.loads(proc.stdout.splitlines()[-1])
    return code, loaded


@pytest.mark.parametrize(("argv", "status"), HELP_AND_MISTAKES,
                         ids=[" ".join(a) or "(none)" for a, _ in HELP_AND_MISTAKES])
def test_help_and_usage_errors_import_neither_torch_nor_the_engine(argv: list[str],
                                                                   status: int) -> None:
    assert probe(argv, parse_only=False) == (status, [])


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_parsing_a_command_imports_neither_torch_nor_the_engine(argv: list[str]) -> None:
    assert probe(argv, parse_only=True) == (None, [])


def test_every_command_names_the_function_that_runs_it() -> None:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in sub.choices.items():
        assert callable(command_function(parser.get_default("entry"))), name


def test_the_demos_default_device_is_decided_when_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    default = sub.choices["demo"].get_default("device")
    assert default.resolve() == ("cuda" if torch.cuda.is_available() else "cpu")
    args = sub.choices["demo"].parse_args([])
    resolve_defaults(args)  # what the run does first
    assert args.device == default.resolve()
    with pytest.raises(SystemExit):
        sub.choices["demo"].parse_args(["-h"])
    assert "(default: cuda where torch sees a GPU, else cpu)" in " ".join(capsys.readouterr().out.split())

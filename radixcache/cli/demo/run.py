"""``radixcache demo``'s run: the workload through a cache with host and
storage tiers, events published, then a warm restart on the same store
(the options and what the demo does: ``radixcache.cli.demo.command``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from radixcache.cache import RadixCache
from radixcache.cli.demo.command import resolve_defaults
from radixcache.cli.demo.noisy import run_noisy_neighbor
from radixcache.cli.demo.report import store_size, summary, tenant_lines
from radixcache.cli.demo.runner import (Runner, build_cache, describe_workload, serve_chats,
                                        settle, workload)
from radixcache.cli.demo.storage import DemoStore, demo_store
from radixcache.cli.config_option import overlay
from radixcache.cli.kv_events_config import publisher_config
from radixcache.cli.options import AUTO_CLUSTER, AUTO_POOL
from radixcache.cli.parser import UsageError, describe
from radixcache.events import NullEventPublisher, PublisherConfig, ZmqEventPublisher
from radixcache.events.publisher import EventPublisher
from radixcache.namespace import Namespace
from radixcache.offload.lmdb.slots import SLOT_FILE
from radixcache.transfer import KVSpec

# what --fresh deletes: LMDB's files, the owner lock, the slot file (offload/lmdb/slots.py)
STORE_FILES = frozenset({"data.mdb", "lock.mdb", "radixcache.lock", SLOT_FILE})


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
    """``radixcache demo`` (or ``--noisy-neighbor``): 0 on success; UsageError
    for options or a store that cannot be used."""
    resolve_defaults(args)  # --noisy-neighbor's sizes and the device, where none was given
    device = str(args.device)
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


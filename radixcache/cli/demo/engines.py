"""``radixcache demo --engines 2``: two engine processes share one Valkey pool.

Engine A (a process of its own, with its own device and host pools) serves
the demo's workload, writing pages through host memory into the pool, and
drains its writes before it exits. Engine B (another process, started after
A has exited, so nothing of A's memory can reach it) replays every prompt A
served: what B does not compute comes from the pool, and B checks every
cached token against the stand-in model's values (the KV A computed),
counting the wrong ones. The two processes share nothing but the pool URL;
each reports back one ``EngineReport``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from radixcache.cli.demo.report import Totals
from radixcache.cli.demo.runner import (Runner, build_cache, describe_workload, serve_chats,
                                        settle, workload)
from radixcache.cli.demo.storage import DemoStore, PoolConfig
from radixcache.cli.parser import UsageError
from radixcache.events import NullEventPublisher
from radixcache.events.types import BlockStored, KvEvent
from radixcache.transfer import KVSpec

EXTERNAL = "EXTERNAL"  # the event medium of pages in a shared pool


class MediumCounter(NullEventPublisher):
    """Sends nothing; counts the pages each event batch says were stored, per medium."""

    def __init__(self) -> None:
        self.stored: dict[str, int] = {}

    def publish(self, events: Sequence[KvEvent]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                medium = ev.medium or "GPU"
                self.stored[medium] = self.stored.get(medium, 0) + len(ev.block_hashes)


@dataclass(slots=True)
class EngineReport:
    """What one engine process sends back."""

    pid: int
    totals: Totals
    seconds: float
    pool_puts: int  # pages this engine wrote into the pool
    pool_hits: int  # pages the pool served this engine, verified
    stored_events: dict[str, int]  # pages announced by BlockStored, per medium
    prompts: list[tuple[int, np.ndarray]] = field(default_factory=list)  # A's, for B


def _engine(role: str, args: argparse.Namespace, device: str, pool: PoolConfig,
            prompts: list[tuple[int, np.ndarray]] | None, conn: object) -> None:
    """One engine process: ``prompts`` None serves the workload (A), otherwise
    replays them without decoding (B). Sends an EngineReport or an error text."""
    send = getattr(conn, "send")
    try:
        spec = KVSpec(num_layers=args.layers, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                      dtype=torch.float16, page_size=args.page_size)
        cache = build_cache(args, spec, device, DemoStore(lmdb=None, pool=pool), args.quotas)
        counter = MediumCounter()
        t0 = time.perf_counter()
        try:
            rng, tenants = workload(args)
            runner = Runner(cache, counter, args.chunk, fail_fast=False)
            if prompts is None:
                print(f"engine A (pid {os.getpid()}): serving the workload", flush=True)
                served = serve_chats(args, runner, rng, tenants, "pool")
            else:
                served = []
                for tenant, prompt in prompts:
                    runner.serve(prompt, tenants[tenant], 0, rng)
            settle(cache)  # every write into the pool is done before the process ends
            counter.publish(cache.take_events())
            ts = cache.tier_stats()
            assert ts is not None and ts.storage is not None
            report = EngineReport(os.getpid(), runner.totals, time.perf_counter() - t0,
                                  ts.storage.puts, ts.storage.hits, dict(counter.stored), served)
        finally:
            cache.close()
        send(report)
    except BaseException as err:  # the parent reports it; the process ends either way
        send(f"engine {role}: {type(err).__name__}: {err}")
        raise


def _spawn(role: str, args: argparse.Namespace, device: str, pool: PoolConfig,
           prompts: list[tuple[int, np.ndarray]] | None) -> EngineReport:
    """Run one engine in a fresh process (spawned: no memory of this one) and wait for it."""
    ctx = multiprocessing.get_context("spawn")
    # the options only (the parser and its callables do not cross a process boundary)
    args = argparse.Namespace(**{k: v for k, v in vars(args).items()
                                 if not callable(v) and not isinstance(v, argparse.ArgumentParser)})
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_engine, args=(role, args, device, pool, prompts, send),
                       name=f"radixcache-engine-{role}")
    proc.start()
    send.close()
    try:
        got = receive.recv()
    except EOFError:
        got = f"engine {role} exited with status {proc.exitcode} before reporting"
    proc.join()
    if isinstance(got, str):
        raise RuntimeError(got)
    assert isinstance(got, EngineReport)
    return got


def _stored(report: EngineReport) -> str:
    return ", ".join(f"{m} {n}" for m, n in sorted(report.stored_events.items())) or "none"


def run_engines(args: argparse.Namespace, device: str, store: DemoStore) -> int:
    """A serves, B replays from the pool; 0 when B got no wrong token, else 1."""
    pool = store.pool
    if pool is None:
        raise UsageError("two engines need a pool (--storage valkey://...)")
    print(f"radixcache demo, two engine processes on the {store.describe()}: each with "
          f"{args.device_pages} device pages and {args.host_pages} host pages of its own on "
          f"{device}; write policy {args.write_policy}, prefetch {args.prefetch_policy}")
    print(describe_workload(args), flush=True)
    a = _spawn("A", args, device, pool, None)
    ta = a.totals
    print(f"engine A (pid {a.pid}) served {ta.requests} requests in {a.seconds:.1f} s: computed "
          f"{ta.computed_tokens} of {ta.prompt_tokens} prompt tokens ({ta.storage_hits} came "
          f"from the pool); wrote {a.pool_puts} pages into the pool and drained; "
          f"BlockStored pages by medium: {_stored(a)}", flush=True)
    if args.kill_node is not None:
        if store.cluster is None:
            raise UsageError("--kill-node kills a node of a scratch cluster: give "
                             "--storage valkey://auto?cluster=true")
        node = store.cluster.kill(args.kill_node)
        share = (node.last_slot - node.first_slot + 1) / 16384
        print(f"killed node {args.kill_node} of the cluster: 127.0.0.1:{node.port} (pid "
              f"{node.pid}), which served slots {node.first_slot}-{node.last_slot} ({share:.0%} "
              f"of the pool's keys); B finds the others' pages through the live nodes",
              flush=True)
    b = _spawn("B", args, device, pool, a.prompts)
    tb = b.totals
    n = max(tb.prompt_tokens, 1)
    print(f"engine B (pid {b.pid}) replayed A's {tb.requests} prompts in {b.seconds:.1f} s: "
          f"storage hits {tb.storage_hits} tokens ({tb.storage_hits / n:.1%}, {b.pool_hits} pages "
          f"read from the pool), device hits {tb.device_hits}, host hits {tb.host_hits}, "
          f"computed {tb.computed_tokens} of {tb.prompt_tokens}; wrote {b.pool_puts} pages; "
          f"BlockStored pages by medium: {_stored(b)}")
    print(f"bit-exact check on B: {tb.checked_tokens} cached tokens compared with the KV A "
          f"computed, {tb.wrong_tokens} wrong")
    return 0 if tb.wrong_tokens == 0 else 1

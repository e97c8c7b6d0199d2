"""Tier-aware routing over the event stream: two engines, one router.

    python examples/router.py

starts two engine processes on this machine. Each runs a RadixCache with a
host tier and publishes its page events over ZMQ on loopback: engine "legal"
serves documents under a legal-assistant system prompt and then offloads most
of them to host memory; engine "code" serves code under a coding-assistant
system prompt. The router subscribes to both, keeps a KvIndex of which blocks
each engine holds on GPU, host and disk, and for each incoming prompt picks
the engine with the lowest tier-aware cost (prefill blocks minus weighted
overlap, plus load), printing the overlaps behind every decision.

Two salted tenants share the legal system prompt: tenant "acme" was served
on engine "code", tenant "globex" on engine "legal". Their pages never mix
(a tenant's salt partitions the cache), and the events say so: every stored
block carries the tenant's ``cache_salt``, so the router routes each tenant to
the engine that holds *its* copy of the shared prompt.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixcache.events import (  # noqa: E402
    EventSubscriber,
    IndexConfig,
    KvIndex,
    PublisherConfig,
    WorkerEndpoint,
    ZmqEventPublisher,
)
from radixcache.offload import HostPoolConfig  # noqa: E402
from radixcache import CacheConfig, KVSpec, Namespace, RadixCache  # noqa: E402
from radixcache.tiers import TierConfig  # noqa: E402

P = 16
VOCAB = 32000


def tokens(seed: int, n: int) -> np.ndarray:
    """Deterministic token ids: the router and the engines agree on them."""
    return np.random.default_rng(seed).integers(0, VOCAB, n, dtype=np.int32)


SYSTEM = {"legal": tokens(1, 256), "code": tokens(2, 256)}


def document(kind: str, i: int) -> np.ndarray:
    seeds = {"legal": 100, "code": 200, "acme": 300, "globex": 400}
    return tokens(seeds[kind] + i, 512)


TENANT_OF = {"code": "acme", "legal": "globex"}  # where each tenant was served


def serve(
    cache: RadixCache, prompt: np.ndarray, publisher: ZmqEventPublisher, tenant: str | None = None
) -> None:
    """Prefill a prompt (no model here: the KV content does not matter)."""
    req = cache.admit(prompt, Namespace(salt=tenant))
    n = prompt.size - req.num_computed
    cache.reserve(req, n)
    cache.commit(req, n)
    cache.release(req)
    cache.poll()
    publisher.publish(cache.take_events())


def run_engine(kind: str) -> int:
    spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float16, page_size=P)
    cache = RadixCache(
        CacheConfig(
            spec=spec,
            device_pages=512,
            tiers=TierConfig(host=HostPoolConfig(pages=1024), write_policy="write_through"),
            record_events=True,
        )
    )
    pub = ZmqEventPublisher(
        PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    )
    print(f"endpoints {pub.endpoint} {pub.replay_endpoint}", flush=True)
    for i in range(6):
        serve(cache, np.concatenate([SYSTEM[kind], document(kind, i)]), pub)
    cache.drain()  # every backup has landed: the host copies exist
    if kind == "legal":  # make room for other work: documents 0-3 move to host memory
        cache.evict(4 * 512 // P)
    pub.publish(cache.take_events())
    tenant = TENANT_OF[kind]  # a tenant's own request under the shared legal system prompt
    serve(cache, np.concatenate([SYSTEM["legal"], document(tenant, 0)]), pub, tenant)
    print("ready", flush=True)
    # Keep serving a tiny request now and then (a live stream), until told to stop.
    beat = 0
    while True:
        line = sys.stdin.readline()
        if line == "" or line.strip() == "stop":
            break
        beat += 1
        serve(cache, np.concatenate([SYSTEM[kind], tokens(10_000 + beat, 40)]), pub)
        print(f"beat {pub.next_seq}", flush=True)  # the number its next batch will take
    cache.close()
    pub.close()
    return 0


def run_router() -> int:
    procs: dict[str, subprocess.Popen[str]] = {}
    workers: list[WorkerEndpoint] = []
    for kind in ("legal", "code"):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--engine", kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        procs[kind] = proc
        assert proc.stdout is not None
        _, live, replay = proc.stdout.readline().split()
        workers.append(WorkerEndpoint(kind, live, replay))
    index = KvIndex(IndexConfig(block_size=P))
    sub = EventSubscriber(index, workers)
    try:
        for kind, proc in procs.items():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        # Ask each engine for one more live batch: a subscriber that joined
        # late sees it as a gap and fetches everything before it from replay.
        upto: dict[str, int] = {}
        for kind, proc in procs.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("beat\n")
            proc.stdin.flush()
            upto[kind] = int(proc.stdout.readline().split()[1])
        # a bound for a broken setup only: a loaded machine may need seconds
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            (sub.next_seq(w.worker_id) or 0) < upto[str(w.worker_id)] for w in workers
        ):
            sub.poll(50)
        # then until the streams fall quiet: a gap found by the last live batch
        # is repaired from replay after it
        while time.monotonic() < deadline and sub.poll(500):
            pass
        if time.monotonic() >= deadline:
            print("warning: the engines' streams did not settle in 60 s", file=sys.stderr)
        prompts = {
            "legal doc 1 + question (on legal's host)": np.concatenate(
                [SYSTEM["legal"], document("legal", 1), tokens(900, 48)]),
            "legal doc 5 + question (on legal's GPU)": np.concatenate(
                [SYSTEM["legal"], document("legal", 5), tokens(901, 48)]),
            "code file 2 + question (on code's GPU)": np.concatenate(
                [SYSTEM["code"], document("code", 2), tokens(902, 48)]),
            "new legal document (system prompt only)": np.concatenate(
                [SYSTEM["legal"], tokens(903, 512)]),
            "unrelated prompt (nothing cached)": tokens(904, 600),
            "tenant acme: legal prompt + its document": np.concatenate(
                [SYSTEM["legal"], document("acme", 0), tokens(905, 48)]),
            "tenant globex: legal prompt + new question": np.concatenate(
                [SYSTEM["legal"], tokens(906, 200)]),
        }
        salts = {"tenant acme": "acme", "tenant globex": "globex"}
        loads = {"legal": 0.0, "code": 0.0}
        print(f"{'prompt':44s} {'blocks':>6s}  {'worker':6s} {'gpu':>4s} {'host':>4s} "
              f"{'disk':>4s} {'cost':>7s}  -> choice")
        for name, prompt in prompts.items():
            salt = salts.get(name.split(":")[0])  # the tenant's namespace, as the wire names it
            decision = index.choose(prompt.tolist(), loads, block_size=P, cache_salt=salt)
            for i, (w, o) in enumerate(decision.overlaps.items()):
                label = name if i == 0 else ""
                blocks = str(decision.request_blocks) if i == 0 else ""
                choice = decision.worker if i == 0 else ""
                print(f"{label:44s} {blocks:>6s}  {w:6s} {o.gpu:4d} {o.host:4d} {o.disk:4d} "
                      f"{decision.costs[w]:7.1f}  {'-> ' + choice if choice else ''}")
            loads[decision.worker] += 2.0  # the chosen engine gets busier
        print(f"subscriber: {sub.stats()}")
    finally:
        sub.close()
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("stop\n")
            proc.stdin.close()
            proc.wait(timeout=20)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["legal", "code"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    return run_engine(args.engine) if args.engine else run_router()


if __name__ == "__main__":
    raise SystemExit(main())

"""``radixcache demo``: the offload demo, on one GPU or on the CPU.

A multi-tenant, multi-turn chat workload that overflows device and host
memory runs through a RadixCache with host and LMDB tiers under a chosen
write policy, publishing page events on ZMQ. The "model" is a stand-in that
writes, for every computed position, K/V values derived from the token and
its position; every request checks that the KV it got from the cache (device
hits, host load-backs, LMDB prefetches) holds exactly those values, so a
wrong page would be caught. Then the cache is closed and a new one opens the
same LMDB directory, as after a restart, and replays the first turns.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixcache.events import NullEventPublisher, PublisherConfig, ZmqEventPublisher
from radixcache.events.publisher import EventPublisher
from radixcache.offload.host import HostPoolConfig
from radixcache.offload.lmdb_storage import StorageConfig
from radixcache.cache import CacheConfig, RadixCache
from radixcache.namespace import Namespace
from radixcache.request import Request
from radixcache.tiers import TierConfig
from radixcache.transfer import KVSpec

VOCAB = 32000


@dataclass(slots=True)
class Totals:
    requests: int = 0
    prompt_tokens: int = 0  # tokens of all prompts
    computed_tokens: int = 0  # prefill tokens actually computed
    device_hits: int = 0  # prompt tokens served from each tier
    host_hits: int = 0
    storage_hits: int = 0
    checked_tokens: int = 0  # cached tokens whose KV was verified
    seconds: float = 0.0


def expected_kv(tokens: np.ndarray, positions: np.ndarray, layer: int) -> torch.Tensor:
    """The stand-in model's K for these tokens at these positions (V is -K)."""
    vals = (tokens.astype(np.int64) * 7 + positions * 13 + layer * 101) % 2039
    return torch.from_numpy(vals.astype(np.float32))


class Runner:
    """Drives the cache like a model runner, without a model."""

    def __init__(self, cache: RadixCache, publisher: EventPublisher, chunk: int) -> None:
        self.cache = cache
        self.publisher = publisher
        self.chunk = chunk
        self.totals = Totals()
        kv = cache.kv
        assert kv is not None
        self.kv = kv

    def _write(self, req: Request, start: int, n: int) -> None:
        slots = self.kv.slots(req.page_table, start, n)
        toks = req.tokens[start : start + n]
        pos = np.arange(start, start + n)
        for layer in range(self.cache.spec.num_layers):
            k, v = self.kv.layer_slots(layer)
            val = expected_kv(toks, pos, layer).to(k.dtype).to(k.device).view(-1, 1, 1)
            k[slots] = val
            v[slots] = -val

    def _check(self, req: Request) -> None:
        n = req.num_computed
        if n == 0:
            return
        slots = self.kv.slots(req.page_table, 0, n)
        pos = np.arange(n)
        for layer in (0, self.cache.spec.num_layers - 1):
            k, _ = self.kv.layer_slots(layer)
            got = k[slots][:, 0, 0].float().cpu()
            want = expected_kv(req.tokens[:n], pos, layer).to(k.dtype).float()
            if not torch.equal(got, want):
                raise AssertionError(f"request {req.rid}: cached KV of another prefix was served")
        self.totals.checked_tokens += n

    def serve(self, prompt: np.ndarray, namespace: Namespace, decode: int,
              rng: np.random.Generator) -> np.ndarray:
        """One request: prefill what is not cached, decode, release."""
        t0 = time.perf_counter()
        cache = self.cache
        req = cache.admit(prompt, namespace)
        cache.reserve(req, 0)  # resolves loads from host or storage (prefetch policy)
        self._check(req)
        tot = self.totals
        tot.requests += 1
        tot.prompt_tokens += int(prompt.size)
        tot.device_hits += req.hit_device
        tot.host_hits += min(req.hit_host, max(req.num_computed - req.hit_device, 0))
        tot.storage_hits += max(req.num_computed - req.hit_device - req.hit_host, 0)
        while req.num_computed < prompt.size:
            n = min(self.chunk, int(prompt.size) - req.num_computed)
            cache.reserve(req, n)
            self._write(req, req.num_computed, n)
            cache.commit(req, n)
            tot.computed_tokens += n
        for tok in rng.integers(0, VOCAB, decode, dtype=np.int32):
            cache.extend(req, [int(tok)])
            cache.reserve(req, 1)
            self._write(req, req.num_computed, 1)
            cache.commit(req, 1)
        out = req.tokens.copy()
        cache.release(req)
        cache.poll()
        self.publisher.publish(cache.take_events())
        tot.seconds += time.perf_counter() - t0
        return out


def build_cache(args: argparse.Namespace, spec: KVSpec, device: str) -> RadixCache:
    tiers = TierConfig(
        host=HostPoolConfig(pages=args.host_pages),
        write_policy=args.write_policy,
        prefetch_policy=args.prefetch_policy,
        storage=StorageConfig(path=args.storage_path, capacity_bytes=args.storage_mib << 20),
        model_id="radixcache-demo",
    )
    return RadixCache(CacheConfig(spec=spec, device_pages=args.device_pages, device=device,
                                  tiers=tiers, record_events=True))


def make_publisher(endpoint: str) -> EventPublisher:
    if endpoint == "none":
        return NullEventPublisher()
    return ZmqEventPublisher(PublisherConfig(endpoint=endpoint, replay_endpoint=None))


def run(args: argparse.Namespace) -> int:
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: running on the CPU")
        device = "cpu"
    spec = KVSpec(num_layers=args.layers, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                  dtype=torch.float16, page_size=args.page_size)
    store = Path(args.storage_path)
    if args.fresh and store.exists():
        shutil.rmtree(store)
    cache = build_cache(args, spec, device)
    publisher = make_publisher(args.events)
    mib = spec.page_bytes / 2**20
    print(f"radixcache demo on {cache.kv.device if cache.kv else device}: "
          f"page {spec.page_bytes // 1024} KiB; device {args.device_pages} pages "
          f"({args.device_pages * mib:.0f} MiB), host {args.host_pages} pages "
          f"({args.host_pages * mib:.0f} MiB), LMDB {args.storage_mib} MiB at {store}; "
          f"write policy {args.write_policy}, prefetch {args.prefetch_policy}")
    print(f"workload: {args.tenants} tenants x {args.chats} chats x {args.turns} turns, "
          f"system prompt {args.system} tokens, +{args.user} user tokens and "
          f"{args.decode} decoded tokens per turn")
    rng = np.random.default_rng(args.seed)
    runner = Runner(cache, publisher, args.chunk)
    systems = [rng.integers(0, VOCAB, args.system, dtype=np.int32) for _ in range(args.tenants)]
    tenants = [Namespace(salt=f"tenant-{t}") for t in range(args.tenants)]
    chats = [(c % args.tenants, systems[c % args.tenants].copy())
             for c in range(args.tenants * args.chats)]
    first_turns: list[tuple[int, np.ndarray]] = []
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for i in rng.permutation(len(chats)).tolist():
            tenant, history = chats[i]
            prompt = np.concatenate([history, rng.integers(0, VOCAB, args.user, dtype=np.int32)])
            if turn == 0:
                first_turns.append((tenant, prompt))
            chats[i] = (tenant, runner.serve(prompt, tenants[tenant], args.decode, rng))
        report_progress(turn + 1, args.turns, runner, time.perf_counter() - t0)
    cache.tiers.drain()
    cache.poll()
    publisher.publish(cache.take_events())
    summary(cache, runner, publisher, time.perf_counter() - t0)
    cache.close()

    # Warm restart: a new cache on the same LMDB directory.
    restarted = build_cache(args, spec, device)
    runner2 = Runner(restarted, NullEventPublisher(), args.chunk)
    t1 = time.perf_counter()
    for tenant, prompt in first_turns[: args.restart_requests]:
        runner2.serve(prompt, tenants[tenant], 0, rng)
    r = runner2.totals
    print(f"\nafter a restart (new process state, same LMDB directory): "
          f"{r.requests} first-turn prompts replayed in {time.perf_counter() - t1:.1f} s: "
          f"{r.storage_hits} prompt tokens came back from LMDB and {r.device_hits} were then "
          f"shared on the device, of {r.prompt_tokens} "
          f"({(r.storage_hits + r.device_hits) / max(r.prompt_tokens, 1):.1%} not recomputed); "
          f"{r.checked_tokens} cached tokens verified")
    restarted.close()
    publisher.close()
    return 0


def report_progress(turn: int, turns: int, runner: Runner, elapsed: float) -> None:
    t = runner.totals
    s = runner.cache.stats()
    ts = runner.cache.tier_stats()
    assert ts is not None
    hit = (t.device_hits + t.host_hits + t.storage_hits) / max(t.prompt_tokens, 1)
    print(f"  turn {turn}/{turns}  {t.requests:5d} requests  {elapsed:6.1f} s  "
          f"hit {hit:6.1%} (device {t.device_hits / max(t.prompt_tokens, 1):5.1%}, "
          f"host {t.host_hits / max(t.prompt_tokens, 1):5.1%}, "
          f"LMDB {t.storage_hits / max(t.prompt_tokens, 1):5.1%})  "
          f"device free {s.free_pages}/{s.pool_pages}  host free {ts.host_free_pages}/{ts.host_pages}",
          flush=True)


def summary(cache: RadixCache, runner: Runner, publisher: EventPublisher, elapsed: float) -> None:
    t = runner.totals
    s = cache.stats()
    ts = cache.tier_stats()
    assert ts is not None and ts.storage is not None
    st = ts.storage
    pct = 100 / max(t.prompt_tokens, 1)
    print(f"\nsummary ({t.requests} requests in {elapsed:.1f} s)")
    print(f"  {'tier':8s} {'hit tokens':>12s} {'share':>7s} {'evicted pages':>14s}")
    print(f"  {'device':8s} {t.device_hits:12d} {t.device_hits * pct:6.1f}% {s.evicted_pages:14d}")
    print(f"  {'host':8s} {t.host_hits:12d} {t.host_hits * pct:6.1f}% {ts.host_evicted_pages:14d}")
    print(f"  {'LMDB':8s} {t.storage_hits:12d} {t.storage_hits * pct:6.1f}% {st.evicted:14d}")
    print(f"  {'moved':22s} {'pages':>10s} {'MiB':>10s} {'MB/s*':>10s}")
    for direction, pages in ts.pages_moved.items():
        mb = ts.bytes_moved[direction] / 2**20
        rate = ts.bytes_per_second[direction] / 1e6
        print(f"  {direction:22s} {pages:10d} {mb:10.1f} {rate:10.1f}")
    print("  * bytes over the summed submit-to-harvest time of the jobs (queueing included)")
    saved = t.prompt_tokens - t.computed_tokens
    print(f"  prefill avoided: {saved} of {t.prompt_tokens} prompt tokens ({saved * pct:.1f}%); "
          f"{t.checked_tokens} cached tokens verified bit-exact, none wrong")
    print(f"  storage: {st.records} records, {st.corrupt} corrupt, {st.failed_ops} failed ops; "
          f"abandoned loads {ts.abandoned_tokens} tokens, failed jobs {ts.failed_jobs}")
    p = publisher.stats()
    print(f"  events: {p.published} batches published, {p.dropped} dropped")


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the offload demo (GPU when present, else CPU)",
                          description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add = demo.add_argument
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--device-pages", type=int, default=384, help="device pool, pages")
    add("--host-pages", type=int, default=768, help="host pool, pages")
    add("--storage-mib", type=int, default=2048, help="LMDB capacity, MiB")
    add("--storage-path", default="./radixcache-data", help="LMDB directory")
    add("--fresh", action="store_true", help="delete the LMDB directory first")
    add("--write-policy", default="write_through",
        choices=["write_through", "write_through_selective", "write_back"])
    add("--prefetch-policy", default="wait_complete",
        choices=["best_effort", "wait_complete", "timeout"])
    add("--events", default="tcp://127.0.0.1:*",
        help="ZMQ endpoint to publish page events on ('none' to disable)")
    add("--tenants", type=int, default=3)
    add("--chats", type=int, default=16, help="chats per tenant")
    add("--turns", type=int, default=8)
    add("--system", type=int, default=1024, help="system prompt tokens per tenant")
    add("--user", type=int, default=256, help="new user tokens per turn")
    add("--decode", type=int, default=32, help="decoded tokens per turn")
    add("--chunk", type=int, default=512, help="prefill chunk, tokens")
    add("--layers", type=int, default=8)
    add("--kv-heads", type=int, default=4)
    add("--head-dim", type=int, default=64)
    add("--page-size", type=int, default=16)
    add("--restart-requests", type=int, default=12)
    add("--seed", type=int, default=0)
    demo.set_defaults(func=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["demo", *sys.argv[1:]])
    raise SystemExit(ns.func(ns))

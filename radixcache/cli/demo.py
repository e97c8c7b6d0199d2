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
so) unless --fresh is given. Copies and storage writes run in the background,
but the demo applies them at fixed points (after every prefill chunk and
decoded token), so two fresh runs with the same --seed give the same figures.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixcache.cache import CacheConfig, RadixCache
from radixcache.cli.demo_report import Totals, report_turn, store_size, summary
from radixcache.cli.hicache_options import add_host_pool_options, add_policy_options, host_pool_config
from radixcache.cli.kv_events_config import publisher_config
from radixcache.cli.options import json_object, non_negative_int, positive_int, power_of_two
from radixcache.cli.parser import UsageError, describe
from radixcache.events import NullEventPublisher, PublisherConfig, ZmqEventPublisher
from radixcache.events.publisher import EventPublisher
from radixcache.namespace import Namespace
from radixcache.offload.lmdb_storage import StorageConfig
from radixcache.request import Request
from radixcache.tiers import TierConfig
from radixcache.transfer import KVSpec

VOCAB = 32000
STORE_FILES = frozenset({"data.mdb", "lock.mdb", "radixcache.lock"})  # what --fresh deletes


def expected_kv(tokens: np.ndarray, positions: np.ndarray, layer: int) -> torch.Tensor:
    """The stand-in model's K for these tokens at these positions (V is -K)."""
    vals = (tokens.astype(np.int64) * 7 + positions * 13 + layer * 101) % 2039
    return torch.from_numpy(vals.astype(np.float32))


def settle(cache: RadixCache) -> None:
    """Wait for every tier job in flight and apply it. Applying jobs at fixed
    points, not whenever a thread happens to finish, makes the figures a
    function of the seed."""
    cache.drain()


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

    def _step(self, req: Request, n: int) -> None:
        """Compute ``n`` more positions of ``req`` (a prefill chunk or one token)."""
        self.cache.reserve(req, n)
        self._write(req, req.num_computed, n)
        self.cache.commit(req, n)
        settle(self.cache)

    def serve(self, prompt: np.ndarray, namespace: Namespace, decode: int,
              rng: np.random.Generator) -> np.ndarray:
        """One request: prefill what is not cached, decode, release."""
        t0 = time.perf_counter()
        cache = self.cache
        req = cache.admit(prompt, namespace)
        settle(cache)
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
            self._step(req, n)
            tot.computed_tokens += n
        for tok in rng.integers(0, VOCAB, decode, dtype=np.int32):
            cache.extend(req, [int(tok)])
            self._step(req, 1)
        out = req.tokens.copy()
        cache.release(req)
        settle(cache)
        self.publisher.publish(cache.take_events())
        tot.seconds += time.perf_counter() - t0
        return out


# ---------------------------------------------------------------------- setup
def build_cache(args: argparse.Namespace, spec: KVSpec, device: str) -> RadixCache:
    """The demo's cache; UsageError for a size or a storage folder it cannot use."""
    try:
        tiers = TierConfig(
            host=host_pool_config(args),
            write_policy=args.write_policy,
            prefetch_policy=args.prefetch_policy,
            # strict: a folder that cannot be used is the user's to fix, not a tier to disable
            storage=StorageConfig(path=args.storage_path, capacity_bytes=args.storage_mib << 20,
                                  on_open_error="strict"),
            model_id="radixcache-demo",
        )
        return RadixCache(CacheConfig(spec=spec, device_pages=args.device_pages, device=device,
                                      tiers=tiers, record_events=True))
    except (ValueError, OSError) as err:  # bad sizes; unwritable, read-only or locked folder
        raise UsageError(describe(err)) from None


def clear_store(path: Path) -> None:
    """--fresh: delete the LMDB files in ``path`` (nothing else). The caller has
    checked that no other process holds the store."""
    if not path.is_dir():
        return
    unknown = sorted(set(os.listdir(path)) - STORE_FILES)
    if unknown:
        raise UsageError(f"--fresh: {str(path)!r} holds files that are not an LMDB store "
                         f"({', '.join(unknown[:3])}); not deleting anything")
    try:
        for name in STORE_FILES:
            (path / name).unlink(missing_ok=True)
    except OSError as err:
        raise UsageError(f"--fresh: cannot empty {str(path)!r}: {err.strerror or err}") from None


def make_publisher(args: argparse.Namespace) -> EventPublisher:
    """The event publisher of ``--events`` or ``--kv-events-config``; UsageError
    for a config or an endpoint that cannot be used."""
    replay = None if args.events_replay == "none" else args.events_replay
    try:
        if args.kv_events_config is not None:
            base = PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint=replay)
            config = publisher_config(args.kv_events_config, base)
        elif args.events == "none":
            config = None
        else:
            config = PublisherConfig(endpoint=args.events, replay_endpoint=replay)
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
    device = args.device
    try:
        torch.device(device)
    except RuntimeError as err:
        raise UsageError(f"--device: {err}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available: running on the CPU")
        device = "cpu"
    try:
        spec = KVSpec(num_layers=args.layers, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                      dtype=torch.float16, page_size=args.page_size)
    except ValueError as err:
        raise UsageError(describe(err)) from None
    longest = args.system + args.turns * (args.user + args.decode)  # a chat's last turn
    need = -(-longest // args.page_size)
    if need > args.device_pages:
        raise UsageError(f"a chat grows to {longest} tokens ({need} pages of {args.page_size}) "
                         f"by its last turn, more than --device-pages {args.device_pages}; "
                         f"give more device pages or fewer/shorter turns")
    store = Path(args.storage_path)
    if args.fresh and store.exists():
        build_cache(args, spec, device).close()  # fails if the folder is unusable or held
        clear_store(store)
    publisher = make_publisher(args)  # first: a bad events option fails before any store opens
    try:
        cache = build_cache(args, spec, device)
        _run(args, spec, device, store, cache, publisher)
    finally:
        publisher.close()
    return 0


def _run(args: argparse.Namespace, spec: KVSpec, device: str, store: Path, cache: RadixCache,
         publisher: EventPublisher) -> None:
    ts = cache.tier_stats()
    assert ts is not None and ts.storage is not None
    mib = spec.page_bytes / 2**20
    print(f"radixcache demo on {cache.kv.device if cache.kv else device}: "
          f"page {spec.page_bytes / 1024:g} KiB; device {args.device_pages} pages "
          f"({args.device_pages * mib:.0f} MiB), host {ts.host_pages} pages "
          f"({ts.host_pages * mib:.0f} MiB), LMDB {args.storage_mib} MiB at {store}; "
          f"write policy {args.write_policy}, prefetch {args.prefetch_policy}")
    if ts.storage.records:
        print(f"found {ts.storage.records} pages from an earlier run in {store}; "
              f"--fresh starts empty")
    print(describe_events(publisher), flush=True)
    print(f"workload: {args.tenants} tenants x {args.chats} chats x {args.turns} turns, "
          f"system prompt {args.system} tokens, +{args.user} user tokens and "
          f"{args.decode} decoded tokens per turn; seed {args.seed}")
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
        report_turn(turn + 1, args.turns, runner.totals, cache, time.perf_counter() - t0)
    settle(cache)
    publisher.publish(cache.take_events())
    summary(cache, runner.totals, publisher, time.perf_counter() - t0)
    cache.close()

    # Warm restart: a new cache on the same LMDB directory.
    restarted = build_cache(args, spec, device)
    try:
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
        settle(restarted)
        after = restarted.tier_stats()
        kept = after.storage.records if after is not None and after.storage is not None else 0
    finally:
        restarted.close()
    size = store_size(store)
    print(f"LMDB store {store}: {size / 2**20:.1f} MiB on disk, {kept} pages; the next run "
          f"reuses it (--fresh starts empty; rm -r {store} removes it)")


# ---------------------------------------------------------------------- options
def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the offload demo (GPU when present, else CPU)",
                          description=__doc__)
    add = demo.add_argument
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device of the KV pool (cuda falls back to cpu when absent)")
    add("--device-pages", type=positive_int, default=384, help="device pool, pages")
    add_host_pool_options(demo, 768, "host pool, pages")
    add("--storage-mib", type=positive_int, default=2048, help="LMDB capacity, MiB")
    add("--storage-path", default="./radixcache-data",
        help="LMDB directory (created if missing; kept after the run)")
    add("--fresh", action="store_true",
        help="empty the LMDB store first (deletes only its LMDB files)")
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
    add("--chats", type=positive_int, default=8, help="chats per tenant")
    add("--turns", type=positive_int, default=8, help="turns per chat")
    add("--system", type=positive_int, default=1024, help="system prompt tokens per tenant")
    add("--user", type=positive_int, default=256, help="new user tokens per turn")
    add("--decode", type=non_negative_int, default=32, help="decoded tokens per turn")
    add("--chunk", type=positive_int, default=512, help="prefill chunk, tokens")
    add("--layers", type=positive_int, default=8, help="model layers (KV geometry)")
    add("--kv-heads", type=positive_int, default=4, help="KV heads per layer")
    add("--head-dim", type=positive_int, default=64, help="head dimension")
    add("--page-size", type=power_of_two, default=16, help="tokens per page, a power of two")
    add("--restart-requests", type=non_negative_int, default=12,
        help="first-turn prompts replayed after the restart")
    add("--seed", type=int, default=0, help="workload seed: the same seed gives the same "
        "figures on a fresh store")
    demo.set_defaults(func=run)

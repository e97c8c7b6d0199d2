"""The ``radixcache`` command line.

``radixcache example`` drives the allocator like a model runner would (a
shared system prompt, several multi-turn chats, chunked prefill and decode)
and prints what it cached; ``radixcache bench NAME`` runs a benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import numpy as np
import torch

from radixcache.cache import CacheConfig, RadixCache
from radixcache.namespace import Namespace
from radixcache.transfer import KVSpec


def run_example(args: argparse.Namespace) -> int:
    spec = KVSpec(num_layers=4, num_kv_heads=2, head_dim=64, dtype=torch.float16, page_size=16)
    cache = RadixCache(
        CacheConfig(spec=spec, device_pages=args.pages, device=args.device,
                    eviction_policy=args.policy)
    )
    assert cache.kv is not None
    rng = np.random.default_rng(args.seed)
    system = rng.integers(0, 32000, 512, dtype=np.int32)
    chats = {t: system.copy() for t in range(args.chats)}
    print(f"radixcache example: {args.chats} chats x {args.turns} turns, "
          f"{args.pages} device pages of {spec.page_bytes} B on {cache.kv.device}")
    for turn in range(args.turns):
        for chat in range(args.chats):
            prompt = np.concatenate([chats[chat], rng.integers(0, 32000, 96, dtype=np.int32)])
            tenant = Namespace(salt=f"tenant-{chat % 2}")
            req = cache.admit(prompt, tenant)
            while req.num_computed < prompt.size:  # chunked prefill
                n = min(args.chunk, prompt.size - req.num_computed)
                cache.reserve(req, n)
                slots = cache.kv.slots(req.page_table, req.num_computed, n)
                for layer in range(spec.num_layers):  # the "model" writes K/V
                    k, v = cache.kv.layer_slots(layer)
                    k[slots] = 1.0
                    v[slots] = 1.0
                cache.commit(req, n)
            for _ in range(args.decode):  # decode one token at a time
                cache.extend(req, [int(rng.integers(0, 32000))])
                cache.reserve(req, 1)
                cache.commit(req, 1)
            chats[chat] = req.tokens.copy()
            cache.release(req)
        s = cache.stats()
        print(f"  turn {turn + 1}: hit ratio {s.hit_ratio:6.1%}  cached pages {s.cached_pages:5d}  "
              f"free {s.free_pages:5d}  evicted {s.evicted_pages:5d}  nodes {s.nodes}")
    cache.check_integrity()
    s = cache.stats()
    print(f"done: {s.requests} requests, {s.hit_tokens} of {s.prompt_tokens} prompt tokens "
          f"served from the cache ({s.hit_ratio:.1%}); integrity check passed")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from radixcache.cli.bench.__main__ import main as bench_main

    return bench_main([args.name, *args.rest])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixcache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("example", help="drive the allocator like a model runner")
    ex.add_argument("--chats", type=int, default=8)
    ex.add_argument("--turns", type=int, default=4)
    ex.add_argument("--pages", type=int, default=2048, help="device pool size in pages")
    ex.add_argument("--chunk", type=int, default=256, help="prefill chunk in tokens")
    ex.add_argument("--decode", type=int, default=32, help="tokens decoded per turn")
    ex.add_argument("--policy", default="lru", help="eviction policy")
    ex.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ex.add_argument("--seed", type=int, default=0)
    ex.set_defaults(func=run_example)
    bench = sub.add_parser("bench", help="run a benchmark (JSON on stdout)")
    bench.add_argument("name", choices=["tree", "copy", "storage", "events"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    for module in COMMANDS:  # each adds its subcommand and sets func
        importlib.import_module(module).register(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


# Modules with a ``register(subparsers)`` that adds one subcommand.
COMMANDS: list[str] = ["radixcache.cli.demo", "radixcache.cli.replay_command"]


if __name__ == "__main__":
    sys.exit(main())

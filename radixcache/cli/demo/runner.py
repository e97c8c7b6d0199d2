"""The demo's engine loop: a stand-in model that writes known K/V, a
``Runner`` that drives a ``RadixCache`` the way a model runner does and checks
every cached token it is served, and the seeded chat workload.

``radixcache demo`` runs it once (then again after a restart); ``--engines 2``
runs it in two engine processes sharing a pool (``engines.py``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from radixcache.cache import CacheConfig, RadixCache
from radixcache.cli.demo.report import Totals, report_turn
from radixcache.cli.demo.storage import DemoStore
from radixcache.cli.config_option import overlay
from radixcache.cli.hicache_options import host_pool_config
from radixcache.cli.parser import UsageError, describe
from radixcache.events.publisher import EventPublisher
from radixcache.namespace import Namespace
from radixcache.request import Request
from radixcache.tenants import QuotaBook
from radixcache.tiers import TierConfig
from radixcache.transfer import KVSpec

VOCAB = 32000

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

    def __init__(self, cache: RadixCache, publisher: EventPublisher, chunk: int,
                 fail_fast: bool = True) -> None:
        self.cache = cache
        self.fail_fast = fail_fast  # False: count wrong tokens (Totals.wrong_tokens) and go on
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
            val = val.expand(-1, k.shape[1], k.shape[2])
            # index_copy_/index_select, not k[slots] = ...: torch's advanced
            # indexing on the CPU takes milliseconds where these take microseconds
            k.index_copy_(0, slots, val)
            v.index_copy_(0, slots, -val)

    def _check(self, req: Request) -> None:
        n = req.num_computed
        if n == 0:
            return
        slots = self.kv.slots(req.page_table, 0, n)
        pos = np.arange(n)
        wrong = torch.zeros(n, dtype=torch.bool)
        for layer in (0, self.cache.spec.num_layers - 1):
            k, _ = self.kv.layer_slots(layer)
            got = k.index_select(0, slots)[:, 0, 0].float().cpu()
            want = expected_kv(req.tokens[:n], pos, layer).to(k.dtype).float()
            wrong |= got != want
        if bool(wrong.any()):
            if self.fail_fast:
                raise AssertionError(f"request {req.rid}: cached KV of another prefix was served")
            self.totals.wrong_tokens += int(wrong.sum())
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


def cache_config(args: argparse.Namespace, spec: KVSpec, device: str, store: DemoStore | None,
                 quotas: QuotaBook | None) -> CacheConfig:
    """The demo's cache config: ``store``'s storage tier (None: device and
    host tiers only), ``quotas`` (None: off); UsageError for a bad size."""
    try:
        tiers = overlay(TierConfig(
            host=overlay(host_pool_config(args), args, "host"),
            write_policy=args.write_policy,
            prefetch_policy=args.prefetch_policy,
            storage=store.config if store is not None else None,
            model_id="radixcache-demo",
        ), args, "tiers")
        return overlay(CacheConfig(spec=spec, device_pages=args.device_pages, device=device,
                                   tiers=tiers, record_events=True, quotas=quotas),
                       args, "cache", skip=("device",))
    except ValueError as err:  # bad sizes
        raise UsageError(describe(err)) from None


def build_cache(args: argparse.Namespace, spec: KVSpec, device: str,
                store: DemoStore | None, quotas: QuotaBook | None = None) -> RadixCache:
    """The demo's cache (``cache_config``); UsageError for a size or a
    storage folder it cannot use."""
    config = cache_config(args, spec, device, store, quotas)
    try:
        return RadixCache(config)
    except (ValueError, OSError) as err:  # bad sizes; unwritable, read-only or locked folder
        raise UsageError(describe(err)) from None
    except ImportError as err:  # a pool without the client library
        raise UsageError(str(err)) from None


def workload(args: argparse.Namespace) -> tuple[np.random.Generator, list[Namespace]]:
    """The seeded generator of the chats and the tenants' namespaces."""
    return (np.random.default_rng(args.seed),
            [Namespace(salt=f"tenant-{t}") for t in range(args.tenants)])


def describe_workload(args: argparse.Namespace) -> str:
    return (f"workload: {args.tenants} tenants x {args.chats} chats x {args.turns} turns, "
            f"system prompt {args.system} tokens, +{args.user} user tokens and "
            f"{args.decode} decoded tokens per turn; seed {args.seed}")


def serve_chats(args: argparse.Namespace, runner: Runner, rng: np.random.Generator,
                tenants: list[Namespace], storage: str) -> list[tuple[int, np.ndarray]]:
    """Every turn of every chat, in a seeded order, through ``runner``; a
    progress line per turn. Returns the prompts served, (tenant, tokens), in
    order: the first ``tenants x chats`` are the first turns."""
    systems = [rng.integers(0, VOCAB, args.system, dtype=np.int32) for _ in range(args.tenants)]
    chats = [(c % args.tenants, systems[c % args.tenants].copy())
             for c in range(args.tenants * args.chats)]
    served: list[tuple[int, np.ndarray]] = []
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for i in rng.permutation(len(chats)).tolist():
            tenant, history = chats[i]
            prompt = np.concatenate([history, rng.integers(0, VOCAB, args.user, dtype=np.int32)])
            served.append((tenant, prompt))
            chats[i] = (tenant, runner.serve(prompt, tenants[tenant], args.decode, rng))
        report_turn(turn + 1, args.turns, runner.totals, runner.cache, time.perf_counter() - t0,
                    storage)
    return served

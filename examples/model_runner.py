"""A tiny Llama-style model runner whose only KV allocator is radixcache.

    python examples/model_runner.py [--tiers none|host|storage] [--requests 8] [--turns 3]

Serves multi-turn chats over shared system prompts twice, through a
``RadixCache`` (prefix reuse; optionally host memory or LMDB underneath) and
with plain per-request K/V and no reuse; checks that greedy outputs and logits
agree and prints how much prefill the cache saved.

How ``CachedRunner`` drives the cache, per request::

    req = cache.admit(prompt)            # req.cached_len tokens already have K/V
    until done:                          # a step: one prefill chunk or one decode token
        n = min(chunk, req.num_tokens - req.num_computed)
        cache.reserve(req, n)            # pages for n more positions; resolves tier loads
        start = req.num_computed         # read AFTER reserve: an abandoned load moves it back
        model.forward(req.tokens[start:start+n], start, PagedKV(cache, req, start, n))
                                         #   writes the chunk's K/V into its pages and reads
                                         #   K/V of [0, start+n) back through the page table
        cache.commit(req, n)             # full pages become shareable at once
        if start + n == req.num_tokens:  # caught up: sample a token, then
            cache.extend(req, [token])   #   extend, or release(req) after the last one
    cache.poll()                         # once per scheduler step: apply finished copies

With host or storage tiers, ``admit`` may hand out pages still being copied in
(``req.ready`` is False); the first ``reserve`` waits for them
(``wait_complete``) or gives up what has not arrived (``best_effort``) and
moves ``req.num_computed`` back, so the runner recomputes those positions.
K is cached after RoPE, so a page holds K/V for fixed positions; prefix reuse
keeps them fixed (a cached prefix always starts at position 0).

Bit-exactness. A cached position's K/V may come from an earlier request's
decode step while the no-cache run computes it in a prefill chunk, so no op
may let a position's result depend on how many positions share the call.
Torch's CPU GEMM does (``F.linear`` rows change with the row count), and so
does SiLU (elements past the last full SIMD vector get a scalar ``exp``).
Hence batch-invariant ops: ``linear`` multiplies and sums, SiLU runs per row,
and ``attend``, which both paths call on contiguous K/V, takes each query
alone over exactly keys ``[0, pos]``. Production runners use GEMMs and paged
attention kernels and compare with a tolerance, as this one does on CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixcache.offload import HostPoolConfig  # noqa: E402
from radixcache.offload import StorageConfig  # noqa: E402
from radixcache import CacheConfig, KVSpec, RadixCache, Request  # noqa: E402
from radixcache.tiers import TierConfig  # noqa: E402

Tensor = torch.Tensor
CUDA_ATOL = 1e-4  # logits tolerance on CUDA: its reductions pick their layout by shape


# ------------------------------------------------------------------ the model
@dataclass(frozen=True)
class ModelConfig:
    """Decoder sizes; the weights are random from ``seed``."""

    vocab: int = 97
    layers: int = 2
    hidden: int = 64
    heads: int = 4  # query heads, a multiple of kv_heads (grouped-query attention)
    kv_heads: int = 2
    head_dim: int = 16  # even (RoPE rotates pairs)
    intermediate: int = 128  # SwiGLU width
    seed: int = 0
    max_positions: int = 4096  # RoPE table length
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        sizes = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.type == "int" and f.name != "seed"}
        if any(not isinstance(v, int) or v <= 0 for v in sizes.values()):
            raise ValueError(f"ModelConfig sizes must be positive ints, got {sizes}")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}"
                             f" and head_dim={self.head_dim} even (RoPE rotates pairs)")


def linear(x: Tensor, w: Tensor) -> Tensor:
    """``x @ w.T`` as multiply + sum over the input dimension: each row's result
    is the same whatever the number of rows (a GEMM's may not be)."""
    return (x.unsqueeze(-2) * w).sum(-1)


def rms_norm(x: Tensor, w: Tensor, eps: float = 1e-6) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def silu_rows(x: Tensor) -> Tensor:
    """SiLU with one call per row, so every row takes the same vector/scalar path."""
    return torch.stack([F.silu(row) for row in x])


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of ``x`` [n, heads, D]; ``cos``, ``sin``: [n, 1, D/2]."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, start: int) -> Tensor:
    """Causal grouped-query attention of the queries at positions ``[start, start+n)``.

    ``q``: [n, heads, D]; ``k``, ``v``: [start+n, kv_heads, D], contiguous, in
    position order (gathered from cache pages or sliced from a plain buffer).
    Query ``i`` attends alone to keys ``[0, start+i]``: its result does not
    depend on the chunk it came in. Returns [n, heads, D].
    """
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(n, kv_heads, heads // kv_heads, dim) * dim**-0.5
    out = torch.empty_like(q)
    for i in range(n):
        end = start + i + 1
        scores = (q[i] * k[:end, :, None, :]).sum(-1)  # [end, kv_heads, group]
        probs = torch.softmax(scores, dim=0)
        out[i] = (probs[..., None] * v[:end, :, None, :]).sum(0)
    return out.reshape(n, heads, dim)


class KVStore(Protocol):
    """Where attention keeps one sequence's K/V during a forward of ``[start, start+n)``."""

    def write(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Store the chunk's K and V ([n, kv_heads, D]) at positions ``[start, start+n)``."""

    def read(self, layer: int) -> tuple[Tensor, Tensor]:
        """K and V of positions ``[0, start+n)``, each contiguous [start+n, kv_heads, D]."""


class PagedKV:
    """One chunk's view of the cache's device buffer through ``req.page_table``.

    Position ``pos`` is slot ``page_table[pos // P] * P + pos % P`` of
    ``cache.kv.layer_slots(layer)``. Only the chunk's positions (at or after
    ``req.num_computed``, in pages this request owns) are written; the pages
    before them may be shared with other requests and are only read.
    """

    def __init__(self, cache: RadixCache, req: Request, start: int, n: int) -> None:
        assert cache.kv is not None, "the runner needs KV tensors (allocate_kv=True)"
        self.kv = cache.kv
        self.chunk_slots = self.kv.slots(req.page_table, start, n)
        self.all_slots = self.kv.slots(req.page_table, 0, start + n)

    def write(self, layer: int, k: Tensor, v: Tensor) -> None:
        k_flat, v_flat = self.kv.layer_slots(layer)  # [pages * P, kv_heads, D] views
        k_flat[self.chunk_slots] = k
        v_flat[self.chunk_slots] = v

    def read(self, layer: int) -> tuple[Tensor, Tensor]:
        k_flat, v_flat = self.kv.layer_slots(layer)
        return k_flat[self.all_slots], v_flat[self.all_slots]  # gathers: contiguous copies


class ContiguousKV:
    """The no-cache reference: K/V in plain [layers, capacity, kv_heads, D] tensors."""

    def __init__(self, k: Tensor, v: Tensor, start: int, n: int) -> None:
        self.k, self.v, self.start, self.end = k, v, start, start + n

    def write(self, layer: int, k: Tensor, v: Tensor) -> None:
        self.k[layer, self.start : self.end] = k
        self.v[layer, self.start : self.end] = v

    def read(self, layer: int) -> tuple[Tensor, Tensor]:
        return self.k[layer, : self.end], self.v[layer, : self.end]


class TinyLlama:
    """RMSNorm, RoPE, grouped-query attention, SwiGLU MLP; random weights."""

    def __init__(self, cfg: ModelConfig, device: str | torch.device = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        gen = torch.Generator().manual_seed(cfg.seed)

        def weight(*shape: int, norm: bool = False) -> Tensor:
            w = torch.randn(*shape, generator=gen)
            w = 1.0 + 0.1 * w if norm else w * shape[-1] ** -0.5
            return w.to(self.device, cfg.dtype)

        h, d = cfg.hidden, cfg.head_dim
        q_dim, kv_dim = cfg.heads * d, cfg.kv_heads * d
        self.embed = weight(cfg.vocab, h) * h**0.5
        self.layers = [
            {"attn_norm": weight(h, norm=True), "wq": weight(q_dim, h), "wk": weight(kv_dim, h),
             "wv": weight(kv_dim, h), "wo": weight(h, q_dim), "mlp_norm": weight(h, norm=True),
             "gate": weight(cfg.intermediate, h), "up": weight(cfg.intermediate, h),
             "down": weight(h, cfg.intermediate)}
            for _ in range(cfg.layers)
        ]
        self.final_norm, self.lm_head = weight(h, norm=True), weight(cfg.vocab, h)
        inv_freq = 10000.0 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.arange(cfg.max_positions, dtype=torch.float64)[:, None] * inv_freq
        self.cos = angles.cos().to(self.device, cfg.dtype)  # [max_positions, D/2]
        self.sin = angles.sin().to(self.device, cfg.dtype)

    def forward(self, tokens: Tensor, start: int, kv: KVStore) -> Tensor:
        """Run positions ``[start, start+n)`` of one sequence (``tokens``: [n]).

        ``kv`` must hold K/V of positions ``[0, start)``; this adds the chunk's.
        Returns the logits of the last position ([vocab]).
        """
        cfg, n = self.cfg, tokens.shape[0]
        if start + n > cfg.max_positions:
            raise ValueError(f"position {start + n - 1} is past max_positions={cfg.max_positions}")
        cos, sin = self.cos[start : start + n, None], self.sin[start : start + n, None]
        x = self.embed[tokens]
        for layer, w in enumerate(self.layers):
            h = rms_norm(x, w["attn_norm"])
            q = rope(linear(h, w["wq"]).view(n, cfg.heads, cfg.head_dim), cos, sin)
            k = rope(linear(h, w["wk"]).view(n, cfg.kv_heads, cfg.head_dim), cos, sin)
            kv.write(layer, k, linear(h, w["wv"]).view(n, cfg.kv_heads, cfg.head_dim))
            keys, values = kv.read(layer)
            x = x + linear(attend(q, keys, values, start).reshape(n, -1), w["wo"])
            h = rms_norm(x, w["mlp_norm"])
            x = x + linear(silu_rows(linear(h, w["gate"])) * linear(h, w["up"]), w["down"])
        return linear(rms_norm(x[-1], self.final_norm), self.lm_head)


# ------------------------------------------------------------------ serving
@dataclass
class Sequence:
    """One request being served: its prompt, what it produced, what it cost."""

    prompt: np.ndarray  # int32 token ids
    max_new: int  # tokens to generate greedily
    output: list[int] = field(default_factory=list)  # generated tokens
    logits: list[Tensor] = field(default_factory=list, repr=False)  # each token's logits
    prefill_computed: int = 0  # prompt positions the model computed (recomputes included)
    computed: int = 0  # positions with K/V (reference runner; the cache's req tracks its own)
    req: Request | None = None  # the cache's handle (cached runner)
    kv: tuple[Tensor, Tensor] | None = field(default=None, repr=False)  # reference's K/V
    done: bool = False

    def after_forward(self, start: int, n: int, num_known: int, logits: Tensor) -> int | None:
        """Account a forward of ``[start, start+n)``; if it reached the last
        known token, sample greedily and return the new token, else None."""
        self.prefill_computed += max(0, min(start + n, self.prompt.size) - start)
        if start + n < num_known:
            return None
        self.logits.append(logits)
        self.output.append(int(torch.argmax(logits)))
        self.done = len(self.output) == self.max_new
        return self.output[-1]


class CachedRunner:
    """Every K/V page is allocated, shared and freed by the cache."""

    def __init__(self, model: TinyLlama, cache: RadixCache, chunk: int) -> None:
        self.model, self.cache, self.chunk = model, cache, chunk

    def start(self, prompt: np.ndarray, max_new: int) -> Sequence:
        return Sequence(prompt, max_new, req=self.cache.admit(prompt))

    def step(self, seq: Sequence) -> None:
        """One prefill chunk, or one decode token, of ``seq``."""
        req = seq.req
        assert req is not None
        n = min(self.chunk, req.num_tokens - req.num_computed)
        self.cache.reserve(req, n)  # may raise OutOfPagesError: a real scheduler preempts
        start = req.num_computed  # after reserve: an abandoned tier load moves it back
        tokens = torch.from_numpy(req.tokens[start : start + n].astype(np.int64))
        kv = PagedKV(self.cache, req, start, n)
        logits = self.model.forward(tokens.to(self.model.device), start, kv)
        self.cache.commit(req, n)
        token = seq.after_forward(start, n, req.num_tokens, logits)
        if seq.done:
            self.cache.release(req)
        elif token is not None:
            self.cache.extend(req, [token])

    def poll(self) -> None:
        self.cache.poll()


class ReferenceRunner:
    """The same schedule without a cache: every sequence computes every position."""

    def __init__(self, model: TinyLlama, chunk: int) -> None:
        self.model, self.chunk = model, chunk

    def start(self, prompt: np.ndarray, max_new: int) -> Sequence:
        cfg = self.model.cfg
        shape = (cfg.layers, prompt.size + max_new, cfg.kv_heads, cfg.head_dim)
        k, v = (torch.zeros(shape, dtype=cfg.dtype, device=self.model.device) for _ in "kv")
        return Sequence(prompt, max_new, kv=(k, v))

    def step(self, seq: Sequence) -> None:
        assert seq.kv is not None
        known = np.concatenate([seq.prompt, np.asarray(seq.output, dtype=np.int32)])
        start = seq.computed
        n = min(self.chunk, known.size - start)
        tokens = torch.from_numpy(known[start : start + n].astype(np.int64))
        kv = ContiguousKV(*seq.kv, start, n)
        logits = self.model.forward(tokens.to(self.model.device), start, kv)
        seq.computed = start + n
        seq.after_forward(start, n, known.size, logits)

    def poll(self) -> None:  # nothing runs in the background
        pass


@dataclass(frozen=True)
class Workload:
    """Chats over two shared system prompts, and how they are scheduled."""

    requests: int = 8  # conversations
    turns: int = 3  # user messages per conversation
    system_len: int = 48  # tokens of each system prompt
    max_new: int = 8  # tokens generated per turn
    chunk: int = 16  # prefill chunk
    max_live: int = 4  # requests live at once
    page_size: int = 4  # cache page (tokens)
    device_pages: int = 1024  # cache pool (the host pool has as many)
    seed: int = 1

    def conversations(self, vocab: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
        """(system prompt, user message of each turn) per conversation."""
        rng = np.random.default_rng(self.seed)
        systems = [rng.integers(0, vocab, self.system_len, dtype=np.int32) for _ in range(2)]
        return [(systems[c % 2], [rng.integers(0, vocab, int(rng.integers(6, 20)), dtype=np.int32)
                                  for _ in range(self.turns)]) for c in range(self.requests)]


def serve(runner: CachedRunner | ReferenceRunner, work: Workload, vocab: int,
          between_turns: Callable[[int], None] | None = None) -> list[list[Sequence]]:
    """Serve turn ``t`` of every conversation, then turn ``t+1``; returns [turn][conversation].

    Turn ``t+1``'s prompt is turn ``t``'s prompt + its output + the next user
    message. Each step admits one waiting request (while fewer than
    ``max_live`` are live) and steps every live one once, round-robin: several
    requests use the cache at a time, later ones reuse what earlier ones
    committed. ``between_turns(t)`` runs before turn ``t`` (t >= 1).
    """
    convs = work.conversations(vocab)
    history: list[list[Sequence]] = []
    for turn in range(work.turns):
        if turn == 0:
            waiting = deque(np.concatenate([system, user[0]]) for system, user in convs)
        else:
            if between_turns is not None:
                between_turns(turn)
            waiting = deque(
                np.concatenate([prev.prompt, np.asarray(prev.output, np.int32), user[turn]])
                for (_, user), prev in zip(convs, history[-1])
            )
        seqs: list[Sequence] = []
        live: list[Sequence] = []
        while waiting or live:
            if waiting and len(live) < work.max_live:
                seqs.append(runner.start(waiting.popleft(), work.max_new))
                live.append(seqs[-1])
            for seq in live:
                runner.step(seq)
            live = [seq for seq in live if not seq.done]
            runner.poll()
        history.append(seqs)
    return history


# ------------------------------------------------------------------ scenarios
@dataclass
class Run:
    seqs: list[list[Sequence]]  # [turn][conversation]
    seconds: float  # wall time of the whole run
    cache: RadixCache | None = None  # the cache at the end, still open (cached runs)

    def flat(self) -> list[Sequence]:
        return [seq for turn in self.seqs for seq in turn]


def make_cache(cfg: ModelConfig, device: str, page_size: int, tiers: str = "none",
               storage_path: str | None = None, prefetch: str = "wait_complete",
               pages: int = 1024) -> RadixCache:
    """A cache for ``cfg``'s K/V. ``tiers``: none, host, or storage (host + LMDB);
    every inserted page is copied to host (write_through), and on to LMDB."""
    spec = KVSpec(cfg.layers, cfg.kv_heads, cfg.head_dim, cfg.dtype, page_size)
    tier_config = None
    if tiers != "none":
        storage = None
        if tiers == "storage":
            assert storage_path is not None, "the storage tier needs a path"
            storage = StorageConfig(path=storage_path, capacity_bytes=64 << 20)
        tier_config = TierConfig(host=HostPoolConfig(pages=pages), write_policy="write_through",
                                 prefetch_policy=prefetch, storage=storage,
                                 model_id=repr(cfg))  # stored pages fit these weights only
    return RadixCache(CacheConfig(spec=spec, device_pages=pages, device=device, tiers=tier_config))


def run_reference(model: TinyLlama, work: Workload) -> Run:
    t0 = time.perf_counter()
    seqs = serve(ReferenceRunner(model, work.chunk), work, model.cfg.vocab)
    return Run(seqs, time.perf_counter() - t0)


def run_cached(model: TinyLlama, work: Workload, tiers: str = "none",
               storage_path: str | None = None, prefetch: str = "wait_complete") -> Run:
    """Serve through a cache. Before each later turn, ``host`` moves every
    cached page down to host memory (backups drained, device copies evicted),
    so the turn loads its prefix back; ``storage`` closes the cache after turn
    1 and opens a new one on the same LMDB directory, as a restarted server
    would, so turn 2 reads its prefix from storage."""
    t0 = time.perf_counter()
    args = (model.cfg, str(model.device), work.page_size, tiers, storage_path, prefetch,
            work.device_pages)
    runner = CachedRunner(model, make_cache(*args), work.chunk)

    def between_turns(turn: int) -> None:
        cache = runner.cache
        cache.check_integrity()
        if tiers == "host":
            cache.tiers.drain()  # every backup done: each cached page has a host copy
            cache.evict(cache.stats().cached_pages)  # device copies dropped; nodes stay on host
        elif tiers == "storage" and turn == 1:
            cache.close()  # finishes the LMDB writes
            runner.cache = make_cache(*args)

    seqs = serve(runner, work, model.cfg.vocab, between_turns)
    return Run(seqs, time.perf_counter() - t0, runner.cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for obj in (ModelConfig(), Workload()):
        for f in dataclasses.fields(obj):
            if f.type == "int" and f.name not in ("max_positions", "seed"):
                flag = "--" + f.name.replace("_", "-")
                ap.add_argument(flag, type=int, default=getattr(obj, f.name),
                                help="default: %(default)s")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiers", choices=("none", "host", "storage"), default="none")
    ap.add_argument("--storage-path", default=None, help="LMDB directory (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the fastest is shown")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the tensors are tiny)")
    args = vars(ap.parse_args(argv))
    torch.set_num_threads(args["threads"])
    cfg = ModelConfig(**{k: v for k, v in args.items() if k in ModelConfig.__dataclass_fields__})
    work = Workload(**{k: v for k, v in args.items() if k in Workload.__dataclass_fields__})
    model = TinyLlama(cfg, args["device"])
    refs, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args["repeat"]):  # alternated, so both see the same machine load
            refs.append(run_reference(model, work))
            path = str(Path(args["storage_path"] or tmp) / f"run-{i}")
            runs.append(run_cached(model, work, args["tiers"], path))
            assert runs[-1].cache is not None
            runs[-1].cache.check_integrity()
            runs[-1].cache.close()
    ref, cached = refs[-1], runs[-1]
    ref_s, cached_s = min(r.seconds for r in refs), min(r.seconds for r in runs)
    pairs = [(torch.stack(x.logits), torch.stack(y.logits), x.output == y.output)
             for x, y in zip(ref.flat(), cached.flat(), strict=True)]
    same_tokens = all(same for _, _, same in pairs)
    same_logits = all(torch.equal(a, b) for a, b, _ in pairs)
    diff = max(float((a - b).abs().max()) for a, b, _ in pairs)
    ref_pf, c_pf = (sum(s.prefill_computed for s in run.flat()) for run in (ref, cached))
    prompt_tokens = sum(s.prompt.size for s in ref.flat())
    reqs = [s.req for s in cached.flat() if s.req is not None]
    print(f"model    {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads "
          f"({cfg.kv_heads} kv) x {cfg.head_dim}, vocab {cfg.vocab}, {cfg.dtype} on {model.device}")
    print(f"serve    {work.requests} chats x {work.turns} turns over 2 system prompts of "
          f"{work.system_len} tokens; chunk {work.chunk}, page {work.page_size}, "
          f"{work.max_live} live; tiers={args['tiers']}")
    print(f"{'':12}{'prefill computed':>17}{'prompt tokens':>15}{'wall s':>9}")
    print(f"{'no cache':12}{ref_pf:>17}{prompt_tokens:>15}{ref_s:>9.3f}")
    print(f"{'radixcache':12}{c_pf:>17}{prompt_tokens:>15}{cached_s:>9.3f}")
    print(f"saved    {ref_pf - c_pf} prefill tokens ({100 * (ref_pf - c_pf) / ref_pf:.0f}%), "
          f"{ref_s - cached_s:.3f} s ({100 * (1 - cached_s / ref_s):.0f}%) of wall time")
    hits = {t: sum(getattr(r, f"hit_{t}") for r in reqs) for t in ("device", "host", "storage")}
    print("hits     " + ", ".join(f"{t} {n}" for t, n in hits.items()) + " prompt tokens "
          "at admission")
    exact = "bit-identical" if same_logits else f"differ by up to {diff:.2e}"
    print(f"check    greedy outputs {'identical' if same_tokens else 'DIFFER'}, logits {exact}")
    ok = same_tokens and (same_logits or (model.device.type == "cuda" and diff <= CUDA_ATOL))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""examples/model_runner.py: a tiny decoder served through the cache agrees bit
for bit with the same decoder without it, with K/V reused from the device, loaded
back from host memory, and read from LMDB by a new cache on the same store."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]


def _load_example() -> ModuleType:
    path = ROOT / "examples" / "model_runner.py"
    spec = importlib.util.spec_from_file_location("example_model_runner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


mr = _load_example()
CFG = mr.ModelConfig(vocab=97, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                     intermediate=100)  # not a multiple of any SIMD width
WORK = mr.Workload(requests=5, turns=2, system_len=24, max_new=5, chunk=8, max_live=3,
                   page_size=4)
P = WORK.page_size


@pytest.fixture(scope="module")
def model() -> Any:
    return mr.TinyLlama(CFG, "cpu")


@pytest.fixture(scope="module")
def reference(model: Any) -> Any:
    run = mr.run_reference(model, WORK)
    assert [len(turn) for turn in run.seqs] == [WORK.requests] * WORK.turns
    return run


def assert_identical(ref_seqs: list, seqs: list) -> None:
    """Same greedy tokens and bit-identical logits, request by request."""
    assert len(seqs) == len(ref_seqs) > 0
    for ref, seq in zip(ref_seqs, seqs):
        assert len(seq.output) == WORK.max_new
        assert seq.output == ref.output
        assert torch.equal(torch.stack(seq.logits), torch.stack(ref.logits))


def assert_skipped_exactly_the_cached_tokens(reference: Any, run: Any) -> None:
    """The model computed every prompt token the cache did not hold, and no other."""
    cached = sum(seq.req.cached_len for seq in run.flat())
    assert cached > 0
    computed = sum(seq.prefill_computed for seq in run.flat())
    assert computed == sum(seq.prefill_computed for seq in reference.flat()) - cached


def finish(run: Any) -> None:
    cache = run.cache
    cache.check_integrity()
    stats = cache.stats()
    assert stats.live_requests == 0 and stats.private_pages == 0
    cache.close()


def test_ops_compute_what_torch_computes() -> None:
    """The batch-invariant ops are a real linear layer and causal GQA attention."""
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 32, generator=gen), torch.randn(24, 32, generator=gen)
    torch.testing.assert_close(mr.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    q = torch.randn(5, 4, 16, generator=gen)
    k, v = torch.randn(9, 2, 16, generator=gen), torch.randn(9, 2, 16, generator=gen)
    mask = torch.ones(5, 9, dtype=torch.bool).tril(diagonal=4)  # queries at positions 4..8
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1),
        v.repeat_interleave(2, 1).transpose(0, 1), attn_mask=mask,
    ).transpose(0, 1)
    torch.testing.assert_close(mr.attend(q, k, v, start=4), want, rtol=1e-5, atol=1e-5)


def test_reference_is_chunking_invariant(model: Any, reference: Any) -> None:
    """The premise of bit-exactness: chunk sizes change no bit of the output."""
    other = mr.run_reference(model, dataclasses.replace(WORK, chunk=5))
    assert_identical(reference.flat(), other.flat())


def history(prev: Any) -> int:
    """Tokens of a turn-2 prompt cached by turn 1: whole pages of the turn-1
    prompt and its output (the last sampled token never had K/V computed)."""
    return (prev.prompt.size + WORK.max_new - 1) // P * P


def test_device_reuse_is_bit_identical(model: Any, reference: Any) -> None:
    run = mr.run_cached(model, WORK)
    assert_identical(reference.flat(), run.flat())
    turn1, turn2 = run.seqs
    hits = [seq.req.hit_device for seq in turn1]
    assert hits[0] == 0 and all(hit > 0 for hit in hits[2:])  # the system prompt, shared
    for prev, seq in zip(turn1, turn2):
        assert seq.req.cached_len == seq.req.hit_device == history(prev)
    assert_skipped_exactly_the_cached_tokens(reference, run)
    # Requests live at once computed the same system-prompt pages: the later
    # commits adopted the tree's copies, which the requests read from then on.
    assert run.cache.stats().duplicate_pages > 0
    finish(run)


def test_host_load_back_is_bit_identical(model: Any, reference: Any) -> None:
    run = mr.run_cached(model, WORK, tiers="host")
    assert_identical(reference.flat(), run.flat())
    turn1, turn2 = run.seqs
    assert turn2[0].req.hit_host == history(turn1[0])  # everything had moved to host
    for prev, seq in zip(turn1, turn2):  # later ones find the system prompt loaded back
        assert seq.req.hit_host > 0  # ...and load their own history
        assert seq.req.cached_len == seq.req.hit_device + seq.req.hit_host == history(prev)
    tiers = run.cache.tier_stats()
    assert tiers.loaded_tokens == tiers.host_hit_tokens == sum(s.req.hit_host for s in turn2)
    assert tiers.abandoned_tokens == 0 and tiers.failed_jobs == 0
    assert_skipped_exactly_the_cached_tokens(reference, run)
    finish(run)


def test_host_best_effort_recomputes_what_has_not_arrived(model: Any,
                                                          reference: Any) -> None:
    run = mr.run_cached(model, WORK, tiers="host", prefetch="best_effort")
    assert_identical(reference.flat(), run.flat())
    tiers = run.cache.tier_stats()
    assert tiers.host_hit_tokens == sum(s.req.hit_host for s in run.seqs[1]) > 0
    # Each host hit either arrived in time or was given up and recomputed.
    assert tiers.loaded_tokens + tiers.abandoned_tokens == tiers.host_hit_tokens
    assert_skipped_exactly_the_cached_tokens(reference, run)
    finish(run)


def test_storage_after_restart_is_bit_identical(model: Any, reference: Any,
                                                tmp_path: Path) -> None:
    run = mr.run_cached(model, WORK, tiers="storage", storage_path=str(tmp_path / "kv"))
    assert_identical(reference.flat(), run.flat())
    turn1, turn2 = run.seqs
    assert all(seq.req.hit_storage == 0 for seq in turn1)  # a fresh store
    assert turn2[0].req.hit_storage == history(turn1[0])  # a fresh cache on the old store
    for prev, seq in zip(turn1, turn2):
        assert seq.req.hit_storage > 0 and seq.req.hit_host == 0
        assert seq.req.cached_len == seq.req.hit_device + seq.req.hit_storage == history(prev)
    tiers = run.cache.tier_stats()
    assert tiers.storage_hit_tokens == sum(s.req.hit_storage for s in turn2)
    assert tiers.loaded_tokens == tiers.storage_hit_tokens
    assert tiers.failed_jobs == 0 and tiers.storage.corrupt == 0
    assert_skipped_exactly_the_cached_tokens(reference, run)
    finish(run)


def test_wrong_kv_is_detected(model: Any, reference: Any) -> None:
    """The equality checks can fail: K off by one part in 10^6 changes the logits."""
    runner = mr.CachedRunner(model, mr.make_cache(CFG, "cpu", P), WORK.chunk)
    seqs = mr.serve(runner, WORK, CFG.vocab, lambda turn: runner.cache.kv.k.mul_(1 + 1e-6))
    assert_identical(reference.seqs[0], seqs[0])
    with pytest.raises(AssertionError):
        assert_identical(reference.seqs[1], seqs[1])
    finish(mr.Run(seqs, 0.0, runner.cache))


def test_script_reports_savings(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "model_runner.py"), "--tiers", "storage",
         "--storage-path", str(tmp_path), "--requests", "4", "--turns", "2", "--repeat", "1"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert "greedy outputs identical, logits bit-identical" in out
    computed = {line.split()[0]: int(line.split()[-3]) for line in out.splitlines()
                if line.startswith(("no cache", "radixcache"))}
    assert 0 < computed["radixcache"] < computed["no"]
    assert "storage 0 " not in out and (tmp_path / "run-0").is_dir()


@pytest.mark.gpu
def test_cuda_cache_matches_no_cache_within_tolerance() -> None:
    """On CUDA, reductions pick their layout by shape: same tokens, logits to CUDA_ATOL."""
    model = mr.TinyLlama(CFG, "cuda")
    reference = mr.run_reference(model, WORK)
    run = mr.run_cached(model, WORK, tiers="host")
    for ref, seq in zip(reference.flat(), run.flat(), strict=True):
        assert seq.output == ref.output
        torch.testing.assert_close(torch.stack(seq.logits), torch.stack(ref.logits),
                                   rtol=0, atol=mr.CUDA_ATOL)
    assert sum(seq.req.hit_host for seq in run.seqs[1]) > 0
    assert_skipped_exactly_the_cached_tokens(reference, run)
    finish(run)

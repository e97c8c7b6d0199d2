"""``replay``: a Mooncake trace through the real ``RadixCache``, one request
at a time, and the figures counted. The method (settling, what is counted)
is described where ``radixcache replay -h`` shows it: the docstring of
``radixcache.cli.replay.command``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import torch

from radixcache.offload import (
    HostPoolConfig,
    StorageConfig,
    make_prefetch_policy,
    make_write_policy,
)
from radixcache.offload.storage import page_record_size
from radixcache.cache import CacheConfig, RadixCache
from radixcache.errors import OutOfPagesError
from radixcache.tree.policies import make_eviction_policy
from radixcache.tiers import HostTiers, TierConfig
from radixcache.transfer import KVSpec
from radixcache.cli.quota_option import quota_document
from radixcache.cli.replay.presets import BLOCK_SIZE
from radixcache.cli.replay.trace import TraceRequest, decode_tokens, prompt_tokens
from radixcache.tenants import QuotaBook

@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """What to replay against; validated on construction (ValueError)."""

    page_size: int = 512  # tokens per page (power of two); 512 = one trace block
    device_pages: int | None = None  # None: 2**20 tokens' worth (2048 pages of 512)
    host_pages: int = 0  # 0: no host tier
    storage_pages: int = 0  # 0: no storage tier (needs a host tier)
    storage_path: str | None = None  # LMDB directory; None: a temporary one
    write_policy: str = "write_through"  # when device pages get a host copy
    write_threshold: int = 2  # hits before write_through_selective copies
    prefetch_policy: str = "wait_complete"  # every load is settled first: all give equal figures
    eviction_policy: str = "lru"
    block_size: int = BLOCK_SIZE  # tokens per trace hash block
    warmup: float = 0.0  # leading fraction of requests replayed but not counted
    decode: bool = False  # also generate output_length tokens per request
    check_integrity: bool = False  # verify the cache after every request (slow)
    # per-tenant quotas (--quotas); the trace's requests carry no salt: tenant "(none)"
    quotas: QuotaBook | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.spec()  # validates the page size
        if self.device_pages is not None and (
            not isinstance(self.device_pages, int) or self.device_pages <= 0
        ):
            raise ValueError(f"device pages must be a positive int, got {self.device_pages!r}")
        if self.host_pages < 0 or self.storage_pages < 0:
            raise ValueError(
                f"host and storage pages must be >= 0, got {self.host_pages}, {self.storage_pages}"
            )
        if self.storage_pages and not self.host_pages:
            raise ValueError("a storage tier needs a host tier: give host pages > 0")
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup}")
        if self.block_size <= 0:
            raise ValueError(f"block size must be positive, got {self.block_size}")
        make_eviction_policy(self.eviction_policy)
        make_write_policy(self.write_policy)
        make_prefetch_policy(self.prefetch_policy)

    @property
    def num_device_pages(self) -> int:
        if self.device_pages is not None:
            return self.device_pages
        return max(1, (1 << 20) // self.page_size)

    def spec(self) -> KVSpec:
        """The tiny KV geometry: tiers copy real bytes, two per token per K and V."""
        return KVSpec(1, 1, 1, dtype=torch.float16, page_size=self.page_size)

    def cache_config(self, storage_dir: str | None) -> CacheConfig:
        """The engine's config (``storage_dir``: where LMDB lives, if storage is on)."""
        spec = self.spec()
        tiers = None
        if self.host_pages:
            storage = None
            if self.storage_pages:
                assert storage_dir is not None
                cap = self.storage_pages * page_record_size(spec.page_size, spec.page_bytes)
                # One writer transaction per job (max_batch_pages=1): batches then
                # cannot depend on timing, nor can the records they evict. The map is
                # sized well above what the records need (a full map would evict).
                storage = StorageConfig(
                    path=storage_dir, capacity_bytes=cap, durability="fast", num_readers=1,
                    max_batch_pages=1, map_size_bytes=4 * cap + (256 << 20),
                    on_open_error="strict",  # a folder that cannot be used: the user's to fix
                )
            tiers = TierConfig(
                host=HostPoolConfig(pages=self.host_pages), write_policy=self.write_policy,
                write_threshold=self.write_threshold, prefetch_policy=self.prefetch_policy,
                storage=storage, model_id="radixcache-replay",
            )
        return CacheConfig(
            spec=spec, device_pages=self.num_device_pages, eviction_policy=self.eviction_policy,
            allocate_kv=tiers is not None, tiers=tiers, quotas=self.quotas,
        )

    def describe(self) -> dict[str, object]:
        d = asdict(replace(self, quotas=None))
        d["device_pages"] = self.num_device_pages
        d["quotas"] = None if self.quotas is None else quota_document(self.quotas)
        del d["check_integrity"]
        return d


# ---------------------------------------------------------------------- figures
@dataclass(frozen=True, slots=True)
class ReplayFigures:
    """What a replay counted (after warmup). Deterministic: equal for equal inputs."""

    requests: int  # requests counted
    warmup_requests: int  # requests replayed before counting
    rejected_requests: int  # prompts the device pool could not hold (not counted)
    prompt_tokens: int  # prompt tokens of counted requests
    hit_device_tokens: int  # found on the device at admission
    hit_host_tokens: int  # found in host memory (loaded back)
    hit_storage_tokens: int  # found in storage (fetched, loaded back)
    saved_tokens: int  # not recomputed: cached_len once the loads settled
    decode_tokens: int  # generated tokens (with decode)
    device_evicted_pages: int  # device pages evicted
    host_evicted_pages: int  # host pages dropped for room
    storage_evicted_pages: int  # records storage evicted for room
    backups_skipped: int  # host copies not made for lack of host room
    failed_jobs: int  # tier copies or storage operations that failed

    @property
    def hit_tokens(self) -> int:
        return self.hit_device_tokens + self.hit_host_tokens + self.hit_storage_tokens

    def ratio(self, tokens: int) -> float:
        return tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, int | float]:
        d: dict[str, int | float] = dict(asdict(self))
        d["hit_tokens"] = self.hit_tokens
        d["computed_tokens"] = self.prompt_tokens - self.saved_tokens
        d["hit_ratio"] = self.ratio(self.hit_tokens)
        d["device_hit_ratio"] = self.ratio(self.hit_device_tokens)
        d["host_hit_ratio"] = self.ratio(self.hit_host_tokens)
        d["storage_hit_ratio"] = self.ratio(self.hit_storage_tokens)
        d["saved_ratio"] = self.ratio(self.saved_tokens)
        return d


@dataclass(frozen=True, slots=True)
class ReplayResult:
    config: ReplayConfig
    figures: ReplayFigures  # deterministic
    wall_s: float  # replay time (not deterministic)

    def to_dict(self) -> dict[str, object]:
        return {"config": self.config.describe(), "figures": self.figures.to_dict(),
                "wall_s": round(self.wall_s, 3)}


@dataclass(slots=True)
class _Tally:
    requests: int = 0
    rejected: int = 0
    prompt: int = 0
    device: int = 0
    host: int = 0
    storage: int = 0
    saved: int = 0
    decode: int = 0


@dataclass(frozen=True, slots=True)
class _Marks:
    """The engine's monotonic counters, read where counting starts and ends."""

    device_evicted: int  # CacheStats.evicted_pages
    host_evicted: int  # TierStats.host_evicted_pages
    storage_evicted: int  # StorageStats.evicted
    backups_skipped: int  # TierStats.backups_skipped
    failed_jobs: int  # TierStats.failed_jobs

    @staticmethod
    def read(cache: RadixCache) -> _Marks:
        t = cache.tier_stats()
        if t is None:
            return _Marks(cache.stats().evicted_pages, 0, 0, 0, 0)
        stored = t.storage.evicted if t.storage is not None else 0
        return _Marks(cache.stats().evicted_pages, t.host_evicted_pages, stored,
                      t.backups_skipped, t.failed_jobs)


# ---------------------------------------------------------------------- replay
def settle(cache: RadixCache) -> None:
    """Wait for every tier job in flight, then apply them all; repeat until
    none is in flight (applying one may start another: backup -> store,
    fetch -> load). Every job is done before the poll that applies it, so the
    order of application is the order of submission, whatever the threads did."""
    tiers = cache.tiers
    if not isinstance(tiers, HostTiers):
        return
    while True:
        tiers.controller.wait_all()
        cache.poll()  # also submits stores deferred by evictions
        if not tiers.controller.in_flight:
            return


def _serve(cache: RadixCache, index: int, r: TraceRequest, config: ReplayConfig,
           t: _Tally | None) -> None:
    """One request through the cache; adds to ``t`` unless it is None (warmup)."""
    req = cache.admit(prompt_tokens(r, config.block_size))
    settle(cache)
    assert req.ready, f"{req!r}: loads still pending after settle"
    saved = req.cached_len
    try:
        n = req.num_tokens - req.num_computed
        cache.reserve(req, n)
        cache.commit(req, n)
    except OutOfPagesError:
        if t is not None:
            t.rejected += 1
        cache.release(req)
        settle(cache)
        return
    decoded = 0
    if config.decode and r.output_length:
        out, p = decode_tokens(index, r.output_length), config.page_size
        try:
            while decoded < out.size:  # page by page: the tree sees what token-by-token would
                n = min(p - req.num_tokens % p, out.size - decoded)
                cache.extend(req, out[decoded : decoded + n])
                cache.reserve(req, n)
                cache.commit(req, n)
                decoded += n
        except OutOfPagesError:
            pass  # the pool cannot hold this request's output: stop generating
    cache.release(req)
    settle(cache)
    if t is not None:
        t.requests += 1
        t.prompt += r.input_length
        t.device += req.hit_device
        t.host += req.hit_host
        t.storage += req.hit_storage
        t.saved += saved
        t.decode += decoded


@contextmanager
def _storage_dir(config: ReplayConfig) -> Iterator[str | None]:
    if not config.storage_pages:
        yield None
    elif config.storage_path is not None:
        yield config.storage_path
    else:
        with tempfile.TemporaryDirectory(prefix="radixcache-replay-") as d:
            yield d


def replay(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``requests`` in order through a fresh cache built from ``config``.

    ``progress`` is called with the number of requests done so far. Raises
    ValueError for a bad config. The storage tier lives in
    ``config.storage_path`` (an existing store there gives hits from the start)
    or in a temporary directory removed at the end.
    """
    warm = int(config.warmup * len(requests))
    start = time.perf_counter()
    with _storage_dir(config) as storage_dir:
        cache = RadixCache(config.cache_config(storage_dir))
        try:
            tally, first = _Tally(), _Marks.read(cache)
            for i, r in enumerate(requests):
                if i == warm:
                    first = _Marks.read(cache)
                _serve(cache, i, r, config, tally if i >= warm else None)
                if config.check_integrity:
                    cache.check_integrity()
                if progress is not None:
                    progress(i + 1)
            last = _Marks.read(cache)
        finally:
            cache.close()
    figures = ReplayFigures(
        requests=tally.requests, warmup_requests=warm, rejected_requests=tally.rejected,
        prompt_tokens=tally.prompt, hit_device_tokens=tally.device, hit_host_tokens=tally.host,
        hit_storage_tokens=tally.storage, saved_tokens=tally.saved, decode_tokens=tally.decode,
        device_evicted_pages=last.device_evicted - first.device_evicted,
        host_evicted_pages=last.host_evicted - first.host_evicted,
        storage_evicted_pages=last.storage_evicted - first.storage_evicted,
        backups_skipped=last.backups_skipped - first.backups_skipped,
        failed_jobs=last.failed_jobs - first.failed_jobs,
    )
    return ReplayResult(config, figures, time.perf_counter() - start)

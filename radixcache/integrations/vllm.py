"""radixcache storage as a vLLM secondary offload tier (``TieringOffloadingSpec``).

Switched on through the connector's extra config (see the README)::

    "secondary_tiers": [{"type": "RadixcacheTier",
                         "module_path": "radixcache.integrations.vllm",
                         "path": "/var/cache/radixcache-vllm",
                         "capacity_bytes": 107374182400}]

vLLM builds the tier in its scheduler process with a memoryview of the CPU
primary tier, ``num_chunks`` rows of one chunk each; chunk ``c`` is row ``c``.
A store job copies rows into records under the chunk's 36-byte offload key, a
load job copies records back into other rows; both run on the store's threads
and are harvested, never waited for, in ``get_finished_jobs``::

    submit_store(job) --put--> PageStore (writer thread)  --+
    submit_load(job)  --get--> PageStore (reader threads) --+--> tickets
    get_finished_jobs():  removed = take_removed()          (1)
                          finished tickets -> JobResults, store events (2)
                          removal event for ``removed``     (3)

Doing (1) before (2) keeps each key's events in their real order: a key is
reported removed only after the put that stored it was reported (see
``PageStore.take_removed``). Every loaded chunk is verified (full key,
fingerprint, checksum); a chunk that fails is not served: its job fails with the
leading keys that did load, and its record is deleted and reported removed.
After a restart the store's index is rebuilt from disk, so lookups hit at
once, and the first ``take_events`` announces the surviving keys as stored.

This module imports vLLM; ``import radixcache`` never imports it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobId, JobResult, SecondaryTierManager, TransferJob

from radixcache.integrations.pagestore import (
    PageStore,
    PageStoreConfig,
    PageTicket,
    RawPages,
    describe_path,
)

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Job:
    """One submitted store or load, until it is harvested."""

    keys: list[OffloadKey]  # the job's keys, in order
    ticket: PageTicket  # the store's handle; leading keys served
    is_load: bool  # True: storage -> primary chunks (promotion)
    submitted: float  # time.monotonic() at submission


def describe_offloading_spec(spec: Any) -> tuple[str, str, int]:
    """(model, page layout, rank) of a vLLM ``OffloadingSpec``, for the fingerprint.

    Reads ``spec.config`` (``OffloadingConfig``): the model name and KV dtype,
    tokens per hash, blocks per chunk, bytes per block and the parallel
    layout. Fields that are not plain values (a mocked spec) are left out.
    """
    config = getattr(spec, "config", None)

    def field(path: str) -> str | int | bool | None:
        value: Any = config
        for name in path.split("."):
            value = getattr(value, name, None)
        return value if isinstance(value, (str, int, bool)) else None

    model = field("model.name")
    parts = [
        f"{name}={value}"
        for name, value in (
            ("kv_dtype", field("model.dtype")),
            ("tokens_per_hash", field("cache.tokens_per_hash")),
            ("blocks_per_chunk", field("cache.blocks_per_chunk")),
            ("kv_bytes_per_block", field("worker_kv_bytes_per_block")),
            ("tp", field("parallel.tp_size")),
            ("pp", field("parallel.pp_size")),
            ("pcp", field("parallel.pcp_size")),
            ("dcp", field("parallel.dcp_size")),
            ("world", field("parallel.world_size")),
            ("layout", field("kv_cache_layout")),
        )
        if value is not None
    ]
    rank = field("parallel.rank")
    return (
        model if isinstance(model, str) and model else "unknown-model",
        ";".join(parts) or "unknown-layout",
        rank if isinstance(rank, int) and not isinstance(rank, bool) else 0,
    )


class RadixcacheTier(SecondaryTierManager):
    """A vLLM ``SecondaryTierManager`` on a radixcache ``PageStore`` (module docstring).

    Called by vLLM's tiering manager under its lock, one call at a time;
    every method returns without waiting for I/O except ``drain_jobs`` and
    ``shutdown``.
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        path: str,
        capacity_bytes: int = 64 << 30,
        durability: str = "safe",
        num_readers: int = 2,
        model: str | None = None,
        enable_kv_events: bool = True,
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        """``path``: the store directory; ``capacity_bytes``: its bound (least
        recently used pages are evicted, and reported removed); ``model``:
        overrides the model name read from ``offloading_spec``;
        ``enable_kv_events``: record store/remove events for ``take_events`` (only
        while the engine has KV cache events on)."""
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        chunk_bytes = self.block_size_bytes
        self._pages = RawPages(primary_kv_view, chunk_bytes)
        spec_model, layout, rank = describe_offloading_spec(offloading_spec)
        self.store = PageStore(
            PageStoreConfig(
                path=path,
                page_bytes=chunk_bytes,
                engine="vllm",
                model=model or spec_model,
                layout=f"{layout};chunk_bytes={chunk_bytes}",
                tp_rank=rank,
                capacity_bytes=capacity_bytes,
                durability=durability,
                num_readers=num_readers,
            )
        )
        self._jobs: dict[JobId, _Job] = {}
        # as vLLM's own tiers: no events unless the engine publishes KV events
        engine_events = getattr(getattr(offloading_spec, "config", None),
                                "enable_kv_cache_events", True)
        record = enable_kv_events and engine_events is not False
        self._events: list[OffloadingEvent] | None = [] if record else None
        if self._events is not None:
            survivors = self.store.stored_keys()
            if survivors:
                self._events.append(self._event(survivors, removed=False))
        log.info("radixcache tier %r opened at %s", tier_type, describe_path(path))

    # -- lookups --------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self.store.contains(key) else LookupResult.MISS

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    # -- jobs -----------------------------------------------------------------
    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        ticket = self.store.put(keys, self._pages, job_metadata.chunk_ids)
        self._add(job_metadata.job_id, _Job(keys, ticket, False, time.monotonic()))

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        ticket = self.store.get(keys, self._pages, job_metadata.chunk_ids)
        self._add(job_metadata.job_id, _Job(keys, ticket, True, time.monotonic()))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        removed = self.store.take_removed()  # first: see the module docstring
        results: list[JobResult] = []
        stored: list[OffloadKey] = []
        now = time.monotonic()
        for job_id in [j for j, job in self._jobs.items() if job.ticket.done()]:
            job = self._jobs.pop(job_id)
            n = job.ticket.count()
            if job.ticket.error is not None:
                log.warning("radixcache tier job %d failed: %s", job_id, job.ticket.error)
            ok = n == len(job.keys)
            partial = tuple(job.keys[:n]) if job.is_load and not ok and n else None
            if not job.is_load:
                stored.extend(job.keys[:n])
            results.append(
                JobResult(
                    job_id=job_id,
                    success=ok,
                    successful_keys=partial,
                    transfer_time=now - job.submitted,
                    transfer_bytes=n * self.block_size_bytes,
                )
            )
        if self._events is not None:
            if stored:
                self._events.append(self._event(stored, removed=False))
            if removed:
                self._events.append(self._event(removed, removed=True))
        return results

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def drain_jobs(self) -> None:
        for job in list(self._jobs.values()):
            job.ticket.wait()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None  # recency is refreshed by every verified read

    def shutdown(self) -> None:
        """Finish every job (its result stays harvestable), then close the store."""
        self.drain_jobs()
        self.store.close()

    # -- helpers ----------------------------------------------------------------
    def _add(self, job_id: JobId, job: _Job) -> None:
        if job_id in self._jobs:
            raise ValueError(f"job id {job_id} is already in flight")
        self._jobs[job_id] = job

    def _event(self, keys: Iterable[bytes], *, removed: bool) -> OffloadingEvent:
        return OffloadingEvent(
            keys=[OffloadKey(k) for k in keys],
            medium=Medium.STORAGE,
            removed=removed,
            locality=self.locality,
            ownership=self.tier_type,
        )

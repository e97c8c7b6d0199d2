"""radixcache storage as a vLLM secondary offload tier (``TieringOffloadingSpec``).

Switched on through the connector's extra config (see the README)::

    "secondary_tiers": [{"type": "RadixcacheTier",
                         "module_path": "radixcache.integrations.vllm",
                         "path": "/var/cache/radixcache-vllm",
                         "capacity_bytes": 107374182400,
                         "locality": "LOCAL", "enable_kv_events": true}]

Every key vLLM documents for a tier entry is taken, with vLLM's defaults:
``type`` and ``module_path`` (read by vLLM's factory), ``backpressure``
(vLLM builds the detector and hands it over), ``locality`` (``LOCAL`` or
``REMOTE``; unset by default, and then left out of events) and
``enable_kv_events`` (off by default; events only when the engine publishes
KV cache events too, as for vLLM's own ``fs`` and ``obj`` tiers).

Tenants: a request's tenant is ``kv_transfer_params["cache_salt"]``
(``radixcache.integrations.tenants``): its pages are stored, looked up and
loaded under that tenant's namespace only. The entry's ``quotas`` (tenant ->
``ttl_s``, ``storage_bytes``, ``storage_floor``; ``radixcache.integrations.quotas``)
bound what each tenant keeps in the store and for how long.

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
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
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
    is_pool_url,
)
from radixcache.config import ConfigError, decode
from radixcache.integrations.config_files import store_options
from radixcache.integrations.quotas import config_quotas
from radixcache.integrations.tenants import salt_of, tenant_namespace
from radixcache.namespace import Namespace

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TierOptions:
    """The keys of a tier entry this tier reads (besides vLLM's ``type``,
    ``module_path`` and ``backpressure``), decoded by type from the entry's
    JSON values (``radixcache.config``): ``"capacity_bytes": "1e9"`` or
    ``"enable_kv_events": "yes"`` is refused with the key named."""

    path: str
    capacity_bytes: int = 64 << 30
    durability: str = "safe"
    num_readers: int = 2
    model: str | None = None
    enable_kv_events: bool = False
    locality: str | None = None
    quotas: dict[str, Any] | None = None  # tenant -> TenantQuota fields (integrations/quotas.py)


@dataclass(slots=True)
class _Job:
    """One submitted store or load, until it is harvested."""

    keys: list[OffloadKey]  # the job's keys, in order
    ticket: PageTicket  # the store's handle; leading keys served
    namespace: Namespace  # the tenant whose pages move
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
        path: str | None = None,
        capacity_bytes: int | None = None,
        durability: str | None = None,
        num_readers: int | None = None,
        model: str | None = None,
        enable_kv_events: bool | None = None,
        locality: str | None = None,
        quotas: dict[str, Any] | None = None,
        config_file: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        """``path``: the store directory or a pool URL; ``capacity_bytes``:
        its bound (least recently used pages are evicted, and reported
        removed); ``durability``, ``num_readers``: as ``PageStoreConfig``;
        ``model``: overrides the model name read from ``offloading_spec``;
        ``config_file``: a radixcache config file whose ``[storage]`` table
        gives the keys above the entry leaves out (integrations/config_files.py);
        ``enable_kv_events``: record store/remove events for ``take_events``
        (only while the engine publishes KV cache events, as vLLM's own
        tiers); ``locality``: ``"LOCAL"`` or ``"REMOTE"``, carried by the
        events (vLLM's ``Locality``); ``backpressure_detector``: built by
        vLLM's factory from the entry's ``backpressure``; ``quotas``: per-tenant
        retention (``ttl_s``) and LMDB byte quotas (``storage_bytes``,
        ``storage_floor``), the JSON form of ``parse_quotas`` keyed by
        ``cache_salt`` (integrations/quotas.py)."""
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        source = f"secondary tier {tier_type!r}"
        given = {k: v for k, v in {
            "path": path, "capacity_bytes": capacity_bytes, "durability": durability,
            "num_readers": num_readers, "model": model, "enable_kv_events": enable_kv_events,
            "locality": locality, "quotas": quotas}.items() if v is not None}  # None: left out of the entry
        if config_file is not None:  # the store from a radixcache config file; entry keys win
            if not isinstance(config_file, str):
                raise ConfigError(f"{source}: Expected `str`, got "
                                  f"`{type(config_file).__name__}` - at `$.config_file`")
            keys = frozenset(f.name for f in dataclasses.fields(TierOptions))
            given = {**store_options(config_file, keys), **given}
        options = decode(TierOptions, given, source)  # the JSON's types, strictly
        book = config_quotas(options.quotas, "valkey" if is_pool_url(options.path) else "lmdb",
                             source)
        self.locality = _locality(options.locality)
        chunk_bytes = self.block_size_bytes
        # a view of vLLM's primary region; dropped at shutdown, so that vLLM can
        # release its memoryview and unmap the region afterwards
        self._pages: RawPages | None = RawPages(primary_kv_view, chunk_bytes)
        spec_model, layout, rank = describe_offloading_spec(offloading_spec)
        self.store = PageStore(
            PageStoreConfig(
                path=options.path,
                page_bytes=chunk_bytes,
                engine="vllm",
                model=options.model or spec_model,
                layout=f"{layout};chunk_bytes={chunk_bytes}",
                tp_rank=rank,
                capacity_bytes=options.capacity_bytes,
                durability=options.durability,
                num_readers=options.num_readers,
            ),
            quotas=book,
        )
        self._jobs: dict[JobId, _Job] = {}
        # as vLLM's own tiers: events only when asked for and the engine publishes
        engine_events = offloading_spec.kv_events_config.enable_kv_cache_events
        if options.enable_kv_events and not engine_events:
            log.warning("enable_kv_events is set on tier %r but the engine publishes no KV "
                        "cache events; the tier records none", tier_type)
        record = options.enable_kv_events and engine_events
        self._events: list[OffloadingEvent] | None = [] if record else None
        if self._events is not None:
            survivors = self.store.stored_keys()
            if survivors:
                self._events.append(self._event(survivors, removed=False))
        log.info("radixcache tier %r opened at %s", tier_type, describe_path(options.path))

    # -- lookups --------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        hit = self.store.contains(key, _tenant(req_context))
        return LookupResult.HIT if hit else LookupResult.MISS

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        _tenant(req_context)  # parsed once; a bad salt is refused here
        return RequestOffloadingContext()

    # -- jobs -----------------------------------------------------------------
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=True)

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
        self._pages = None

    # -- helpers ----------------------------------------------------------------
    def _submit(self, job_metadata: TransferJob, *, is_load: bool) -> None:
        job_id = job_metadata.job_id
        if job_id in self._jobs:
            raise ValueError(f"job id {job_id} is already in flight")
        keys = list(job_metadata.keys)
        namespace = _tenant(job_metadata.req_context)
        if self._pages is None:
            raise RuntimeError(f"tier {self.tier_type!r} is shut down")
        move = self.store.get if is_load else self.store.put
        ticket = move(keys, self._pages, job_metadata.chunk_ids, namespace)
        self._jobs[job_id] = _Job(keys, ticket, namespace, is_load, time.monotonic())

    def _event(self, keys: Iterable[bytes], *, removed: bool) -> OffloadingEvent:
        return OffloadingEvent(
            keys=[OffloadKey(k) for k in keys],
            medium=Medium.STORAGE,
            removed=removed,
            locality=self.locality,
            ownership=self.tier_type,
        )


class _Tenant:
    """A request's tenant, parsed once and kept in its ``ReqContext``."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace


def _tenant(req_context: ReqContext) -> Namespace:
    """The namespace of the request's tenant (``kv_transfer_params["cache_salt"]``)."""
    known = req_context.get_state(_Tenant)
    if known is None:
        known = _Tenant(tenant_namespace(salt_of(req_context.kv_transfer_params)))
        req_context.set_state(known)
    return known.namespace


def _locality(value: str | None) -> Locality | None:
    """vLLM's ``Locality`` of a tier entry's ``locality`` (None: unspecified)."""
    if value is None:
        return None
    try:
        return Locality(value.upper() if isinstance(value, str) else value)
    except ValueError:
        names = [m.value for m in Locality]
        raise ValueError(f"locality must be one of {names} or left out, got {value!r}") from None

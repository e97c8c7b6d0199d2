"""RadixcacheTier inside vLLM's own offloading stack, on the CPU (no mock of vLLM).

Every test builds the stack as ``vllm serve`` does: ``OffloadingSpecFactory
.create_spec`` -> ``get_manager()`` (``tests/radixcache/integrations/vllm_kit.py``),
with a real shared region in /dev/shm. The scenarios follow vLLM's tests of
its tiers (store, drain, load into other chunks bit-exact, cascade from the
primary tier, promotion), plus restart, corruption and tenants.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import Locality, LookupResult, Medium, OffloadingEvent, OffloadKey  # noqa: E402
from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector  # noqa: E402

from tests.radixcache.integrations.conftest import corrupt_record  # noqa: E402
from tests.radixcache.integrations.vllm_kit import (  # noqa: E402
    BLOCK_BYTES,
    ctx,
    job,
    key,
    offloading_config,
    random_block,
    stack,
    tier_entry,
)

CTX = ctx()

# The keys vLLM 0.33's KV offloading guide documents for a secondary tier
# entry ("Secondary Tiers": type, module_path; enable_kv_events and locality,
# as for its fs and obj tiers; backpressure, per tier, from
# TieringOffloadingSpec), written as an operator would, with our tier's own
# "path" (the guide's other tier-specific keys belong to vLLM's tiers).
DOCUMENTED_ENTRY = """
{
  "type": "RadixcacheTier",
  "module_path": "radixcache.integrations.vllm",
  "enable_kv_events": true,
  "locality": "REMOTE",
  "backpressure": {"backpressure_cls": "EMABackpressureDetector", "policy_cls": "DropStorePolicy"},
  "path": "STORE"
}
"""


def test_vllms_documented_tier_entry_works_verbatim(tmp_path: Path) -> None:
    entry: dict[str, Any] = json.loads(DOCUMENTED_ENTRY.replace("STORE", str(tmp_path / "s")))
    with stack(offloading_config([entry])) as s:
        assert s.tier.locality is Locality.REMOTE
        detector = s.tier.bp_detector
        assert isinstance(detector, EMABackpressureDetector)
        assert detector._high == EMABackpressureDetector.NETWORK_HIGH_WATER_S  # REMOTE's marks
        s.tier.submit_store(job(1, [key(1)], [0]))
        assert [r.success for r in s.drain()] == [True]
        (event,) = s.tier.take_events()
        assert (event.keys, event.removed, event.locality) == ([key(1)], False, Locality.REMOTE)
        assert event.medium is Medium.STORAGE and event.ownership == "RadixcacheTier"


def test_vllms_defaults_no_events_unless_asked_and_published(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with stack(offloading_config([tier_entry(tmp_path / "a")])) as s:
        assert s.tier.locality is None  # unspecified unless configured
        s.tier.submit_store(job(1, [key(1)], [0]))
        assert [r.success for r in s.drain()] == [True]
        assert list(s.tier.take_events()) == []
    with caplog.at_level(logging.WARNING):
        entry = tier_entry(tmp_path / "b", enable_kv_events=True, locality="LOCAL")
        with stack(offloading_config([entry], events=False)) as s:
            s.tier.submit_store(job(1, [key(1)], [0]))
            assert [r.success for r in s.drain()] == [True]
            assert list(s.tier.take_events()) == []
            assert s.tier.locality is Locality.LOCAL
    assert "publishes no KV cache events" in caplog.text


def test_a_locality_vllm_does_not_know_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"locality must be one of \['LOCAL', 'REMOTE'\]"):
        with stack(offloading_config([tier_entry(tmp_path / "s", locality="NEARBY")])):
            pass


def test_store_drain_lookup_and_load_into_other_chunks_bit_exact(tmp_path: Path) -> None:
    with stack(offloading_config([tier_entry(tmp_path / "s")])) as s:
        blocks = [random_block(i) for i in range(4)]
        for c, block in enumerate(blocks):
            s.write(c, block)
        keys = [key(i) for i in range(4)]
        s.tier.submit_store(job(1, keys, [0, 1, 2, 3]))
        assert s.tier.has_pending_work()
        (result,) = s.drain()
        assert (result.job_id, result.success, result.transfer_bytes) == (1, True, 4 * BLOCK_BYTES)
        assert [s.tier.lookup(k, CTX) for k in keys] == [LookupResult.HIT] * 4
        for c in range(4):
            s.write(c, np.zeros(BLOCK_BYTES, np.uint8))
        s.tier.submit_load(job(2, keys, [7, 6, 5, 4], load=True))
        (loaded,) = s.drain()
        assert loaded.success and loaded.successful_keys is None
        for i, chunk in enumerate([7, 6, 5, 4]):
            assert np.array_equal(s.read(chunk), blocks[i])
        assert not s.tier.has_pending_work()


def test_load_of_a_missing_key_fails_with_the_leading_keys_that_loaded(tmp_path: Path) -> None:
    with stack(offloading_config([tier_entry(tmp_path / "s")])) as s:
        s.write(0, random_block(0))
        s.write(1, random_block(1))
        s.tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
        assert all(r.success for r in s.drain())
        s.tier.submit_load(job(2, [key(1), key(99), key(2)], [4, 5, 6], load=True))
        (result,) = s.drain()
        assert not result.success and list(result.successful_keys) == [key(1)]
        assert np.array_equal(s.read(4), random_block(0))
        s.tier.submit_load(job(3, [key(98)], [7], load=True))
        (none,) = s.drain()
        assert not none.success and none.successful_keys is None


def events_until_removal(s: Any) -> list[OffloadingEvent]:
    deadline = time.monotonic() + 5
    events: list[OffloadingEvent] = []
    while time.monotonic() < deadline and not any(e.removed for e in events):
        s.tier.get_finished_jobs()
        events += s.tier.take_events()
    return events


def test_events_report_stores_then_removals_in_order(tmp_path: Path) -> None:
    # room for 3 records of 4 KiB: the 4th store evicts the oldest
    entry = tier_entry(tmp_path / "s", capacity_bytes=3 * (BLOCK_BYTES + 200), enable_kv_events=True)
    with stack(offloading_config([entry])) as s:
        for i in range(4):
            s.write(i, random_block(i))
            s.tier.submit_store(job(i, [key(i)], [i]))
            assert [r.success for r in s.drain()] == [True]
        events = events_until_removal(s)
        flat = [(k, e.removed) for e in events for k in e.keys]
        assert flat[:4] == [(key(i), False) for i in range(4)]
        assert flat[4:] == [(key(0), True)]
        assert all(e.medium is Medium.STORAGE for e in events)
        assert s.tier.lookup(key(0), CTX) is LookupResult.MISS
        assert s.tier.lookup(key(3), CTX) is LookupResult.HIT


def test_restart_lookups_hit_survivors_are_announced_and_load_bit_exact(tmp_path: Path) -> None:
    entry = tier_entry(tmp_path / "s", enable_kv_events=True)
    with stack(offloading_config([entry])) as first:
        for c in range(3):
            first.write(c, random_block(c))
        first.tier.submit_store(job(1, [key(1), key(2), key(3)], [0, 1, 2]))
        assert all(r.success for r in first.drain())
    with stack(offloading_config([entry])) as second:  # a new process: empty primary tier
        hits = [second.tier.lookup(key(i), CTX) for i in (1, 2, 3, 4)]
        assert hits == [LookupResult.HIT] * 3 + [LookupResult.MISS]
        (announced,) = list(second.tier.take_events())
        assert not announced.removed and sorted(announced.keys) == [key(1), key(2), key(3)]
        second.tier.submit_load(job(2, [key(1), key(2), key(3)], [5, 6, 7], load=True))
        assert [r.success for r in second.drain()] == [True]
        for i in range(3):
            assert np.array_equal(second.read(5 + i), random_block(i))


def test_another_model_never_hits(tmp_path: Path) -> None:
    with stack(offloading_config([tier_entry(tmp_path / "s")])) as first:
        first.tier.submit_store(job(1, [key(1)], [0]))
        first.drain()
    with stack(offloading_config([tier_entry(tmp_path / "s")], model="another-model")) as other:
        assert other.tier.lookup(key(1), CTX) is LookupResult.MISS
    entry = tier_entry(tmp_path / "s", model="override")  # the entry's model wins
    with stack(offloading_config([entry])) as overridden:
        assert overridden.tier.lookup(key(1), CTX) is LookupResult.MISS


def test_corrupt_record_fails_the_job_is_removed_and_never_served(tmp_path: Path) -> None:
    entry = tier_entry(tmp_path / "s", enable_kv_events=True)
    with stack(offloading_config([entry])) as first:
        first.write(0, random_block(0))
        first.write(1, random_block(1))
        first.tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
        first.drain()
    corrupt_record(tmp_path / "s", key(2))
    with stack(offloading_config([entry])) as second:
        list(second.tier.take_events())  # the survivors
        sentinel = np.full(BLOCK_BYTES, 0xAB, np.uint8)
        second.write(5, sentinel)
        second.tier.submit_load(job(2, [key(1), key(2)], [4, 5], load=True))
        (result,) = second.drain()
        assert not result.success and list(result.successful_keys) == [key(1)]
        assert np.array_equal(second.read(4), random_block(0))
        removed = [k for e in events_until_removal(second) if e.removed for k in e.keys]
        assert removed == [key(2)]
        assert second.tier.lookup(key(2), CTX) is LookupResult.MISS
        assert second.tier.store.stats().corrupt == 1


def test_cascade_from_primary_then_promotion_after_restart(tmp_path: Path) -> None:
    keys = [key(i) for i in range(3)]
    entry = tier_entry(tmp_path / "s")
    expected: dict[OffloadKey, np.ndarray] = {}
    with stack(offloading_config([entry])) as s:
        s.manager.on_new_request(CTX)
        prepared = s.manager.prepare_store(keys, CTX)
        assert prepared is not None and list(prepared.keys_to_store) == keys
        for k, c in zip(keys, prepared.store_spec.chunk_ids):  # the GPU -> primary copy
            expected[k] = random_block(int(c) + 10)
            s.write(int(c), expected[k])
        s.manager.complete_store(keys, CTX, success=True)  # cascades to our tier
        assert s.tier.has_pending_work()
        s.tier.drain_jobs()
        s.end_step()  # prepare_store already polled this step: resets the per-step gate
        s.end_step()  # harvests the cascade job
        assert not s.manager.has_pending_work()
        assert [s.tier.lookup(k, CTX) for k in keys] == [LookupResult.HIT] * 3
        s.manager.on_request_finished(CTX)
    with stack(offloading_config([entry])) as s:  # a new process, the same store
        again = ctx("again")
        s.manager.on_new_request(again)
        assert [s.manager.lookup(k, again) for k in keys] == [LookupResult.HIT_PENDING] * 3
        s.end_step()  # submits the promotion (one load job)
        s.tier.drain_jobs()
        s.end_step()  # harvests it
        assert [s.manager.lookup(k, again) for k in keys] == [LookupResult.HIT] * 3
        spec = s.manager.prepare_load(keys, again)
        for k, c in zip(keys, spec.chunk_ids):
            assert np.array_equal(s.read(int(c)), expected[k])
        s.manager.complete_load(keys, again)
        s.manager.on_request_finished(again)


def test_a_tenants_pages_are_never_another_tenants_hit(tmp_path: Path) -> None:
    """kv_transfer_params["cache_salt"] -> the tenant's namespace, through vLLM's manager."""
    entry = tier_entry(tmp_path / "s")
    acme, other, shared = ctx("a", salt="acme"), ctx("b", salt="globex"), ctx("c")
    with stack(offloading_config([entry])) as s:
        s.write(0, random_block(0))
        s.tier.submit_store(job(1, [key(1)], [0], req=acme))
        assert [r.success for r in s.drain()] == [True]
        assert s.tier.lookup(key(1), acme) is LookupResult.HIT
        assert s.tier.lookup(key(1), other) is LookupResult.MISS
        assert s.tier.lookup(key(1), shared) is LookupResult.MISS
        s.tier.submit_load(job(2, [key(1)], [3], load=True, req=other))
        (denied,) = s.drain()
        assert not denied.success
    with stack(offloading_config([entry])) as s:  # after a restart, through the manager
        # the other tenant first: vLLM's CPU primary tier keys by the engine key
        # alone (vLLM folds the salt into it), so a promotion for acme would hit there
        for req, expected in ((ctx("b2", salt="globex"), LookupResult.MISS),
                              (ctx("a2", salt="acme"), LookupResult.HIT_PENDING)):
            s.manager.on_new_request(req)
            assert s.manager.lookup(key(1), req) is expected
            s.manager.on_request_finished(req)
            s.end_step()
    with pytest.raises(TypeError, match="cache_salt must be a str, got int"):
        with stack(offloading_config([entry])) as s:
            s.tier.on_new_request(ctx("bad", salt=7))  # type: ignore[arg-type]


# -- the worker side, as far as it runs without a GPU -----------------------------


def test_worker_side_maps_the_bytes_the_tier_moves_and_its_copies_need_a_gpu(
    tmp_path: Path,
) -> None:
    """vLLM's worker maps the same shared region (``TieringOffloadingSpec
    .create_worker`` builds it so): what the worker's GPU -> CPU copy writes
    is what our tier stores, and what our tier loads is what the worker's
    CPU -> GPU copy reads. The copies themselves (``CPUOffloadingWorker``,
    vLLM's compiled swap kernels) need CUDA: ``get_worker`` refuses here."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    with stack(offloading_config([tier_entry(tmp_path / "s")])) as s:
        with pytest.raises(Exception, match="only supported on CUDA-alike"):
            s.spec.get_worker(None)
        region = SharedOffloadRegion(
            engine_id=s.spec.config.engine_id, num_chunks=s.spec.num_chunks, rank=0,
            kv_bytes_per_chunk=s.spec.kv_bytes_per_chunk,
            cpu_page_size=s.spec.cpu_page_size_per_worker,
        )
        try:
            worker_view = region.create_next_worker_view(BLOCK_BYTES)  # [chunks, block bytes]
            worker_view[2].copy_(torch.from_numpy(random_block(2).view(np.int8)))  # a GPU store
            s.tier.submit_store(job(1, [key(2)], [2]))
            assert [r.success for r in s.drain()] == [True]
            s.tier.submit_load(job(2, [key(2)], [6], load=True))
            assert [r.success for r in s.drain()] == [True]
            assert np.array_equal(worker_view[6].numpy().view(np.uint8), random_block(2))
            del worker_view
        finally:
            region.cleanup()


def test_a_tier_entry_is_decoded_by_type_and_unknown_keys_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"secondary tier 'RadixcacheTier': Expected `int`, "
                                         r"got `str` - at `\$.capacity_bytes`"):
        with stack(offloading_config([tier_entry(tmp_path / "s", capacity_bytes="1e9")])):
            pass
    with pytest.raises(TypeError, match="unexpected keyword argument 'capacity_gib'"):
        with stack(offloading_config([tier_entry(tmp_path / "s", capacity_gib=1)])):
            pass


def test_a_tier_entry_names_a_radixcache_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``config_file`` in the entry: the store from the file's [storage]
    (through vLLM's own factory); the entry's keys win over the file's."""
    conf = tmp_path / "radixcache.yaml"
    conf.write_text(f"storage:\n  path: {tmp_path / 'from-file'}\n  capacity_bytes: 4194304\n"
                    f"  num_readers: 1\n")
    entry = {"type": "RadixcacheTier", "module_path": "radixcache.integrations.vllm",
             "config_file": str(conf), "durability": "fast"}
    with stack(offloading_config([entry])) as s:
        assert (str(s.tier.store.config.path), s.tier.store.config.capacity_bytes,
                s.tier.store.config.durability, s.tier.store.config.num_readers) == (
            str(tmp_path / "from-file"), 4194304, "fast", 1)
        s.write(0, random_block(1))
        s.tier.submit_store(job(1, [key(1)], [0]))
        assert [r.success for r in s.drain()] == [True]
    monkeypatch.setenv("RADIXCACHE__STORAGE__CAPACITY_BYTES", "8388608")
    with stack(offloading_config([{**entry, "path": str(tmp_path / "entry")}])) as s:
        assert (str(s.tier.store.config.path), s.tier.store.config.capacity_bytes) == (
            str(tmp_path / "entry"), 8388608)  # the entry's path wins, the variable the file's
        assert s.tier.lookup(key(1), ctx()) == LookupResult.MISS  # another store
    conf.write_text("storage:\n  path: /x\n  capacity_byts: 5\n")
    with pytest.raises(ValueError, match=r"radixcache.yaml: Object contains unknown field "
                                         r"`capacity_byts` - at `\$.storage`"):
        with stack(offloading_config([entry])):
            pass

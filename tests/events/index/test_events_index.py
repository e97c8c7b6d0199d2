"""KvIndex: tier overlaps, reference counts, namespaces and the routing cost."""

from __future__ import annotations

import numpy as np
import pytest
from tests.events.events_testkit import BS, chain, holdings, random_batches, reference, stored

from radixcache.events import (
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    IndexConfig,
    KvIndex,
    TierOverlap,
)

A = list(range(100, 100 + 4 * BS))  # a 4-block prompt
B = list(range(500, 500 + 4 * BS))  # another one, sharing nothing with A


def apply(index: KvIndex, worker: str, *events: object) -> None:
    for event in events:
        index.apply_event(worker, event)  # type: ignore[arg-type]
        index.check_integrity()


def test_overlap_per_tier_is_cumulative(index: KvIndex) -> None:
    # blocks 0-1 on GPU, block 2 only on host, block 3 only on disk
    apply(
        index, "w",
        chain(1, A[: 2 * BS]),
        chain(3, A[2 * BS : 3 * BS], medium="CPU_PINNED", parent=2),
        chain(4, A[3 * BS :], medium="DISK", parent=3),
    )
    assert index.overlap(A) == {"w": TierOverlap(gpu=2, host=3, disk=4)}
    assert index.overlap(A[: 3 * BS + 2]) == {"w": TierOverlap(2, 3, 3)}, "only full blocks count"
    assert index.overlap(A[:BS] + [0] * BS + A[2 * BS :]) == {"w": TierOverlap(1, 1, 1)}, "a prefix, not a subset"
    assert index.overlap(B) == {"w": TierOverlap(0, 0, 0)}


def test_a_lower_tier_block_breaks_the_better_tiers_run(index: KvIndex) -> None:
    # block 0 on disk only, blocks 1-3 on GPU: nothing leads on GPU or host
    apply(index, "w", chain(1, A, medium="DISK"), chain(2, A[BS:], parent=1))
    assert index.overlap(A)["w"] == TierOverlap(gpu=0, host=0, disk=4)
    # a block on several media counts for the best of them
    apply(index, "w", chain(1, A[:BS], medium="GPU"))
    assert index.overlap(A)["w"] == TierOverlap(gpu=4, host=4, disk=4)


def test_removal_is_per_medium(index: KvIndex) -> None:
    apply(index, "w", chain(1, A), chain(1, A, medium="CPU_PINNED"))
    apply(index, "w", BlockRemoved([3, 4], "GPU"))
    assert index.overlap(A)["w"] == TierOverlap(gpu=2, host=4, disk=4)
    assert index.resident("w", "GPU") == {1, 2}
    assert index.resident("w", "CPU_PINNED") == {1, 2, 3, 4}
    apply(index, "w", BlockRemoved([1], "CPU_PINNED"), BlockRemoved([1], "GPU"))
    assert index.overlap(A)["w"] == TierOverlap(0, 0, 0)
    assert index.stats().unknown_removals == 0
    apply(index, "w", BlockRemoved([1], "GPU"), BlockRemoved([77], "DISK"))
    assert index.stats().unknown_removals == 2


def test_same_tokens_under_two_engine_hashes_are_refcounted(index: KvIndex) -> None:
    # Two tenants' salted hashes for the same tokens: the wire can't tell them apart.
    apply(index, "w", chain(1, A), chain(101, A))
    apply(index, "w", BlockRemoved([1, 2, 3, 4], "GPU"))
    assert index.overlap(A)["w"] == TierOverlap(4, 4, 4), "the other tenant's copy is still there"
    apply(index, "w", BlockRemoved([103], "GPU"))
    assert index.overlap(A)["w"] == TierOverlap(2, 2, 2)
    apply(index, "w", BlockRemoved([101, 102, 104], "GPU"))
    assert index.overlap(A)["w"] == TierOverlap(0, 0, 0)


def test_storing_twice_on_one_medium_is_one_reference(index: KvIndex) -> None:
    apply(index, "w", chain(1, A), chain(1, A))
    apply(index, "w", BlockRemoved([1, 2, 3, 4], "GPU"))
    assert index.overlap(A)["w"] == TierOverlap(0, 0, 0)


def test_lora_namespaces_never_share_blocks(index: KvIndex) -> None:
    apply(index, "w", stored([1, 2], A[: 2 * BS], lora_id=7, lora_name="fr"))
    assert index.overlap(A)["w"].gpu == 0
    assert index.overlap(A, lora_id=7, lora_name="fr")["w"].gpu == 2
    assert index.overlap(A, lora_id=8, lora_name="fr")["w"].gpu == 0


def test_parent_chaining_and_orphans(index: KvIndex) -> None:
    apply(index, "w", chain(1, A[: 2 * BS]), chain(3, A[2 * BS :], parent=2))
    assert index.overlap(A)["w"].gpu == 4
    # The same tokens under an unknown parent cannot be placed yet: counted,
    # resident by engine hash, unreachable for a prefix query.
    apply(index, "v", chain(50, A[2 * BS :], parent=49))
    assert index.stats().orphan_blocks == 2
    assert index.resident("v", "GPU") == {50, 51}
    assert index.overlap(A)["v"] == TierOverlap(0, 0, 0)
    index.check_integrity()
    # Its parent returns: the orphans are placed under it, their children too.
    apply(index, "v", chain(48, A[: 2 * BS], medium="DISK"))
    assert index.overlap(A)["v"] == TierOverlap(0, 0, 4)  # disk: on some medium
    apply(index, "v", chain(48, A[: 2 * BS]))
    assert index.overlap(A)["v"] == TierOverlap(4, 4, 4)
    index.check_integrity()
    apply(index, "v", BlockRemoved([50, 51], "GPU"))
    assert index.resident("v", "GPU") == {48, 49}
    index.check_integrity()
    # Re-storing known blocks on another medium needs no parent.
    apply(index, "w", chain(3, A[2 * BS :], medium="DISK", parent=999))
    assert index.resident("w", "DISK") == {3, 4}


def test_clear_worker_and_all_blocks_cleared(index: KvIndex) -> None:
    apply(index, "w", chain(1, A), chain(1, A, medium="DISK"))
    apply(index, "v", chain(11, A))
    apply(index, "w", AllBlocksCleared())
    assert index.overlap(A) == {"w": TierOverlap(0, 0, 0), "v": TierOverlap(4, 4, 4)}
    index.clear_worker("v")
    assert index.overlap(A)["v"] == TierOverlap(0, 0, 0)
    index.remove_worker("v")
    assert index.workers() == ["w"]
    index.check_integrity()


def test_token_ids_beyond_int64_are_refused_without_change(index: KvIndex) -> None:
    with pytest.raises(ValueError, match="int64"):
        index.apply_event("w", stored([1], [1 << 64, 0, 0, 0]))
    assert index.resident("w", "GPU") == set()
    index.check_integrity()


def test_a_refused_event_does_not_stop_the_rest_of_its_batch(index: KvIndex) -> None:
    batch = EventBatch(0.0, [chain(1, A[:BS]), stored([7], [1 << 64, 0, 0, 0]), chain(2, A[BS : 2 * BS], parent=1)])
    with pytest.raises(ValueError, match="int64"):
        index.apply_batch("w", batch)
    assert index.resident("w", "GPU") == {1, 2}
    assert index.overlap(A)["w"].gpu == 2
    index.check_integrity()


def test_random_stream_matches_the_reference(index: KvIndex) -> None:
    batches = random_batches(seed=7, count=300)
    for batch in batches:
        index.apply_batch("w", EventBatch(0.0, batch))
    assert holdings(index, "w") == reference(batches)
    index.check_integrity()
    for medium in MEDIA:  # evict everything: nothing may linger in the holders
        held = index.resident("w", medium)
        if held:
            apply(index, "w", BlockRemoved(sorted(held), medium))
    assert holdings(index, "w") == reference([])
    for batch in batches:
        for event in batch:
            if isinstance(event, BlockStored):
                assert index.overlap(event.token_ids)["w"] == TierOverlap(0, 0, 0)


def test_choose_prefers_the_best_tier_then_the_lighter_load() -> None:
    index = KvIndex(IndexConfig(block_size=BS, w_gpu=1.0, w_host=0.5, w_disk=0.25, w_load=1.0))
    apply(index, "gpu", chain(1, A))
    apply(index, "host", chain(1, A, medium="CPU_PINNED"))
    apply(index, "disk", chain(1, A, medium="DISK"))
    idle = {"gpu": 0.0, "host": 0.0, "disk": 0.0, "cold": 0.0}
    decision = index.choose(A, idle)
    assert decision.worker == "gpu"
    assert decision.request_blocks == 4
    assert decision.costs == {"gpu": 0.0, "host": 2.0, "disk": 3.0, "cold": 4.0}
    assert decision.overlaps["host"] == TierOverlap(0, 4, 4)
    # A loaded GPU worker loses to an idle host-tier worker once the load outweighs 2 blocks.
    assert index.choose(A, {**idle, "gpu": 2.5}).worker == "host"
    # Ties keep the order of the loads mapping.
    assert index.choose(B, {"cold": 0.0, "gpu": 0.0}).worker == "cold"
    assert index.choose(B, {"gpu": 0.0, "cold": 0.0}).worker == "gpu"
    with pytest.raises(ValueError, match="at least one"):
        index.choose(A, {})


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="w_gpu >= w_host"):
        IndexConfig(w_gpu=0.5, w_host=0.9)
    with pytest.raises(ValueError, match="block_size"):
        IndexConfig(block_size=0)


def test_salted_tenants_are_kept_apart(index: KvIndex) -> None:
    # Two tenants store the same system prompt; the wire tells them apart by
    # cache_salt and the per-block extra_keys entry (salt first).
    for salt, first in (("acme", 1), ("globex", 11)):
        extra = [(salt,), (salt,)]
        apply(index, "w", BlockStored([first, first + 1], None, A[: 2 * BS], BS, cache_salt=salt, extra_keys=extra))
    apply(index, "w", BlockStored([21, 22], None, A[: 2 * BS], BS, extra_keys=[(b"img",), (b"img",)]))
    assert index.overlap(A)["w"].gpu == 0  # nobody stored it unsalted
    assert index.overlap(A, cache_salt="acme")["w"].gpu == 2
    assert index.overlap(A, cache_salt="globex")["w"].gpu == 2
    assert index.overlap(A, cache_salt="initech")["w"].gpu == 0
    assert index.overlap(A, extra_keys=(b"img",))["w"].gpu == 2
    apply(index, "w", BlockRemoved([1, 2], "GPU"))
    assert index.overlap(A, cache_salt="acme")["w"].gpu == 0
    assert index.overlap(A, cache_salt="globex")["w"].gpu == 2
    index.check_integrity()


def test_numpy_token_ids_are_indexed_like_lists(index: KvIndex) -> None:
    as_array = BlockStored([1, 2, 3, 4], None, np.array(A, dtype=np.int32), BS, None, "GPU", None)
    apply(index, "w", as_array)
    apply(index, "v", chain(11, A))  # the same tokens as a list, on another worker
    full = {"w": TierOverlap(4, 4, 4), "v": TierOverlap(4, 4, 4)}
    assert index.overlap(A) == index.overlap(np.array(A, dtype=np.int64)) == full  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int64"):
        index.apply_event("w", BlockStored([9], None, np.full(BS, 1 << 63, dtype=np.uint64), BS))
    with pytest.raises(ValueError, match="int64"):
        index.apply_event("w", BlockStored([9], None, np.zeros(BS, dtype=np.float32), BS))  # type: ignore[arg-type]
    assert index.resident("w", "GPU") == {1, 2, 3, 4}

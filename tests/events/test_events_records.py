"""Event records built from block-id arrays (what the cache's recorder hands
over) read, compare, print and encode exactly like records built from lists,
and the cache's ``take_events`` builds no Python int per block."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import CacheConfig, KVSpec, RadixCache
from radixcache.events import BatchEncoder, BlockRemoved, BlockStored, check_events, decode_batch
from radixcache.events.types import DeferredIds
from tests.events.events_testkit import BS

ids = st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=20)


@settings(max_examples=100, deadline=None)
@given(ids, st.sampled_from([None, "GPU", "CPU_PINNED", "DISK"]), st.booleans())
def test_array_ids_read_compare_and_encode_as_the_list(hashes: list[int], medium: str | None, salted: bool) -> None:
    arr = np.asarray(hashes, dtype=np.int64)
    tokens = np.arange(len(hashes) * BS, dtype=np.int32)
    extra = [("t",)] * len(hashes) if salted else None
    salt = "t" if salted else None
    from_array = BlockStored(arr, 7, tokens, BS, None, medium, None, salt, extra)  # type: ignore[arg-type]
    from_list = BlockStored(list(hashes), 7, tokens, BS, None, medium, None, salt, extra)  # type: ignore[arg-type]
    gone_array = BlockRemoved(arr, medium)  # type: ignore[arg-type]
    gone_list = BlockRemoved(list(hashes), medium)  # type: ignore[arg-type]
    assert from_array.num_blocks == gone_array.num_blocks == len(hashes)
    enc = BatchEncoder()
    # encoded first (before anything read the ids): the same bytes as the list records
    assert enc.encode([from_array, gone_array], 1.0) == enc.encode([from_list, gone_list], 1.0)
    assert from_array.block_hashes == hashes and type(from_array.block_hashes) is list
    assert all(type(h) is int for h in gone_array.block_hashes)
    assert gone_array == gone_list and repr(gone_array) == repr(gone_list)
    check_events([from_array, gone_array])
    decoded = decode_batch(enc.encode([from_array, gone_array], 2.0)).events
    assert decoded[0].block_hashes == hashes  # type: ignore[union-attr]
    assert decoded[1] == BlockRemoved(list(hashes), medium or "GPU")  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(ids, st.sampled_from([None, "GPU", "CPU_PINNED", "DISK"]))
def test_deferred_ids_are_built_once_when_read(hashes: list[int], medium: str | None) -> None:
    built: list[int] = []

    def build() -> np.ndarray:
        built.append(1)
        return np.asarray(hashes, dtype=np.int64)

    later = BlockRemoved(DeferredIds(len(hashes), build), medium)  # type: ignore[arg-type]
    assert later.num_blocks == len(hashes) and not built  # counted without computing
    plain = BlockRemoved(list(hashes), medium)  # type: ignore[arg-type]
    enc = BatchEncoder()
    assert enc.encode([later], 1.0) == enc.encode([plain], 1.0)
    assert later == plain and repr(later) == repr(plain) and later.block_hashes == hashes
    assert built == [1]
    check_events([later])


def test_records_compare_by_value_and_stay_unhashable() -> None:
    a = BlockRemoved([1, 2], "GPU")
    assert a == BlockRemoved(np.array([1, 2], np.int64), "GPU")  # type: ignore[arg-type]
    assert a != BlockRemoved([1, 2], "DISK") and a != BlockRemoved([1], "GPU")
    assert a != BlockStored([1, 2], None, [0] * 2 * BS, BS)
    b = BlockStored([1], None, [0] * BS, BS, medium="GPU")
    assert b == BlockStored([1], None, [0] * BS, BS, None, "GPU")
    assert b != BlockStored([1], 5, [0] * BS, BS, None, "GPU")
    assert repr(b).startswith("BlockStored(block_hashes=[1], parent_block_hash=None,")
    for record in (a, b):
        try:
            hash(record)
        except TypeError:
            continue
        raise AssertionError(f"{type(record).__name__} is hashable")
    match b:
        case BlockStored(block_hashes=[1], medium="GPU"):
            pass
        case _:
            raise AssertionError("no match on the record's fields")


def test_take_events_hands_the_ids_over_unbuilt() -> None:
    """A store's ids come as an array, a removal's as ``DeferredIds`` (not
    even computed yet); both read as the same list of ints, built once."""
    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=4)
    cache = RadixCache(CacheConfig(spec=spec, device_pages=16, allocate_kv=False, record_events=True))
    req = cache.admit(np.arange(13, dtype=np.int32))
    cache.reserve(req, 13)
    cache.commit(req, 13)
    cache.release(req)
    cache.evict(16)
    stored, removed = cache.take_events()
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    # nothing has read the ids yet: no ints built, the removal's ids not computed
    assert type(stored._hashes) is np.ndarray and type(removed._hashes) is DeferredIds
    assert stored.num_blocks == removed.num_blocks == 3
    assert stored.block_hashes == removed.block_hashes and len(set(stored.block_hashes)) == 3
    assert type(stored._hashes) is list and type(removed._hashes) is list  # built once, when first read

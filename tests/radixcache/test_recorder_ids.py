"""The ids events carry: one fast block id per page on every medium, the
same id in the page's storage record, and storage removals (known by key
only) announced under the id the page was announced with, or not at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from radixcache import CacheConfig, Namespace, RadixCache
from radixcache.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from radixcache.keys.hashing import chain_keys
from radixcache.offload import HostPoolConfig, LmdbStorage, StorageConfig
from radixcache.keys.page_keys import PageKeys
from radixcache.recorder import EventRecorder
from radixcache.tiers import HostTiers, TierConfig
from tests.radixcache.keys.idkit import record_ids, reference_ids
from tests.radixcache.tiers.tierkit import P, SPEC, compute

NS = Namespace(salt="tenant", lora_id=3, lora_name="l3")


def tiered(store: Path, capacity_pages: int = 64) -> RadixCache:
    tiers = TierConfig(
        host=HostPoolConfig(pages=16),
        write_policy="write_through",
        storage=StorageConfig(path=store, capacity_bytes=capacity_pages * 2048),
    )
    return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers, record_events=True))


def by_medium(events: list[KvEvent], kind: type) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in events:
        if isinstance(e, kind):
            assert isinstance(e, (BlockStored, BlockRemoved)) and e.medium is not None
            out.setdefault(e.medium, []).extend(e.block_hashes)
    return out


def test_a_page_has_one_id_on_every_medium_and_in_its_record(tmp_path: Path) -> None:
    cache = tiered(tmp_path / "store")
    prompt = np.arange(3 * P + 1, dtype=np.int32)
    req = cache.admit(prompt, NS)
    compute(cache, req, req.num_tokens)
    cache.release(req)
    cache.drain()
    (node,) = list(cache.tree.nodes())
    want = reference_ids(cache.tree, node)
    stored = by_medium(cache.take_events(), BlockStored)
    assert stored == {"GPU": want, "CPU_PINNED": want, "DISK": want}
    tiers = cache.tiers
    assert isinstance(tiers, HostTiers)
    storage = tiers.controller.storage
    assert isinstance(storage, LmdbStorage)
    keys = chain_keys(NS.digest(), prompt[: 3 * P], P)
    assert record_ids(storage, P) == {keys[16 * i : 16 * (i + 1)]: want[i] for i in range(3)}
    # Storage drops the records (by key): the removals carry the same ids.
    assert storage.delete([keys[16:32], keys[:16]]).wait(10)
    cache.poll()
    assert by_medium(cache.take_events(), BlockRemoved) == {"DISK": [want[1], want[0]]}
    cache.close()


def test_pages_only_on_the_device_compute_no_storage_key() -> None:
    cache = RadixCache(CacheConfig(spec=SPEC, device_pages=8, record_events=True))
    req = cache.admit(np.arange(2 * P, dtype=np.int32), NS)
    compute(cache, req, 2 * P)
    cache.release(req)
    (node,) = list(cache.tree.nodes())
    want = reference_ids(cache.tree, node)
    cache.evict(2)
    events = cache.take_events()
    assert node.keys is None  # no blake2b ran for its events
    assert by_medium(events, BlockStored) == by_medium(events, BlockRemoved) == {"GPU": want}
    cache.close()


def test_removals_of_unknown_keys_are_not_announced() -> None:
    """A removed key this engine never announced on storage (another writer's
    record, a raw page's key) is counted, never announced under a guessed id."""
    rec = EventRecorder(PageKeys(P))
    key = chain_keys(NS.digest(), np.arange(P, dtype=np.int32), P)
    rec.removed_keys([key, b"raw page key"], "DISK")
    assert rec.take() == [] and rec.unknown_removals == 2
    rec.stored_ids([42], None, np.arange(P, dtype=np.int32), NS, "DISK", key)
    rec.removed_keys([key, key], "DISK")  # a key listed twice is removed once
    assert [e for e in rec.take() if isinstance(e, BlockRemoved)] == [BlockRemoved([42], "DISK")]
    assert rec.unknown_removals == 3


def test_reset_forgets_the_announced_storage_pages() -> None:
    rec = EventRecorder(PageKeys(P))
    key = chain_keys(NS.digest(), np.arange(P, dtype=np.int32), P)
    rec.stored_ids([7], None, np.arange(P, dtype=np.int32), NS, "EXTERNAL", key)
    rec.cleared()
    rec.removed_keys([key], "EXTERNAL")  # announced gone with everything at the reset
    assert [type(e) for e in rec.take()] == [BlockStored, AllBlocksCleared]
    assert rec.unknown_removals == 1


def test_a_page_announced_under_an_older_id_is_moved_to_its_id(tmp_path: Path) -> None:
    """A record written before events used fast ids holds an id derived from
    its key; announced with it at start, then read back under its fast id,
    the old id is announced gone, so a router holds the page once."""
    cache = tiered(tmp_path / "store")
    prompt = np.arange(2 * P + 1, dtype=np.int32)
    keys = chain_keys(NS.digest(), prompt[: 2 * P], P)
    rec = cache.tree.recorder
    assert isinstance(rec, EventRecorder)
    old = [int.from_bytes(keys[16 * i : 16 * i + 8], "big") >> 1 for i in range(2)]
    rec.stored_ids(old, None, prompt[: 2 * P], NS, "DISK", keys)  # as a survivor
    req = cache.admit(prompt, NS)
    compute(cache, req, req.num_tokens)
    cache.release(req)
    cache.drain()
    events = cache.take_events()
    (node,) = list(cache.tree.nodes())
    want = reference_ids(cache.tree, node)
    assert by_medium(events, BlockStored)["DISK"] == old + want
    assert by_medium(events, BlockRemoved) == {"DISK": old}
    cache.close()

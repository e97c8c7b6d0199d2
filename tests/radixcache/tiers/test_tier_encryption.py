"""Encryption at rest through the engine: two tenants' pages sealed in LMDB,
served after a restart with the key (and announced as survivors), a miss
recomputed with the wrong key; the data file holds neither KV nor prompt."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from radixcache import CacheConfig, Namespace, RadixCache
from radixcache.events.types import BlockStored
from radixcache.metrics import snapshot
from radixcache.offload import HostPoolConfig, StorageConfig
from radixcache.tiers import HostTiers, TierConfig
from tests.radixcache.tiers.tierkit import SPEC, P, assert_kv_correct, compute, prefill

ALICE = Namespace(salt="tenant-alice")
BOB = Namespace(salt="tenant-bob", lora_id=3)


def key_file(tmp: Path, *keys: bytes, name: str = "rx.key") -> str:
    path = tmp / name
    path.write_text("".join(k.hex() + "\n" for k in keys))
    path.chmod(0o600)
    return str(path)


def make(store: Path, keys: str) -> RadixCache:
    tiers = TierConfig(
        host=HostPoolConfig(pages=16),
        prefetch_policy="wait_complete",
        storage=StorageConfig(path=store, capacity_bytes=1 << 20, key_file=keys),
        model_id="test-model",
    )
    return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers, record_events=True))


def tiers(cache: RadixCache) -> HostTiers:
    t = cache.tiers
    assert isinstance(t, HostTiers)
    return t


def prompt(start: int) -> np.ndarray:
    return np.arange(start, start + 4 * P + 1, dtype=np.int32)


def test_tenants_pages_sealed_served_after_restart_and_announced(tmp_path: Path) -> None:
    keys = key_file(tmp_path, bytes(range(32)))
    first = make(tmp_path / "store", keys)
    for ns, start in ((ALICE, 7000), (BOB, 9000)):
        first.release(prefill(first, prompt(start), ns))
    tiers(first).drain()
    first.close()
    with open(tmp_path / "store" / "data.mdb", "rb") as f, \
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert data.find(prompt(7000)[:P].astype("<i4").tobytes()) < 0
        assert data.find(b"tenant-alice") < 0 and data.find(b"tenant-bob") < 0

    second = make(tmp_path / "store", keys)
    survivors = [e for e in second.take_events() if isinstance(e, BlockStored)]
    salts = {e.cache_salt for e in survivors if e.medium == "DISK"}
    assert salts == {"tenant-alice", "tenant-bob"}
    alice_tokens = [t for e in survivors if e.cache_salt == "tenant-alice" for t in e.token_ids]
    assert alice_tokens == list(prompt(7000)[: 4 * P])
    for ns, start in ((ALICE, 7000), (BOB, 9000)):
        req = second.admit(prompt(start), ns)
        assert req.cached_len == 4 * P
        second.reserve(req, 1)
        assert req.ready and req.cached_len == 4 * P
        assert_kv_correct(second, req)
        second.release(req)
    st = second.tier_stats()
    assert st is not None and st.storage is not None
    assert (st.storage.hits, st.storage.decrypt_failures) == (8, 0)
    assert tiers(second).counters.storage_hit_tokens == 8 * P
    second.check_integrity()
    second.close()


def test_the_wrong_key_is_recomputed_never_served(tmp_path: Path) -> None:
    first = make(tmp_path / "store", key_file(tmp_path, bytes(range(32))))
    first.release(prefill(first, prompt(7000), ALICE))
    tiers(first).drain()
    first.close()
    other = make(tmp_path / "store", key_file(tmp_path, bytes(range(1, 33)), name="other.key"))
    req = other.admit(prompt(7000), ALICE)
    other.reserve(req, 1)  # the fetch finds nothing it can read: recomputed
    assert req.ready
    compute(other, req, req.num_tokens - req.num_computed)
    assert_kv_correct(other, req)
    other.release(req)
    tiers(other).drain()
    st = other.tier_stats()
    assert st is not None and st.storage is not None
    assert st.storage.decrypt_failures == 1 and st.storage.hits == 0
    assert snapshot(other)["storage_decrypt_failures"] == 1  # the Prometheus series
    other.check_integrity()
    other.close()

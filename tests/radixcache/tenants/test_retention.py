"""Retention (TenantQuota.ttl_s) and invalidation by tag on the device and
host tiers: what is past its TTL is never matched and leaves with its events,
held pages are masked until free, and invalidate(tag) forgets tagged namespaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixcache import CacheConfig, KVSpec, Namespace, RadixCache
from radixcache.events.types import BlockRemoved, BlockStored
from radixcache.offload import HostPoolConfig
from radixcache.tenants import TenantQuota, parse_quotas
from radixcache.tiers import TierConfig
from tests.radixcache.tenants.kit import P, prompt, serve

SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
A, B = Namespace("a"), Namespace("b")


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def make(quotas: object, clock: Clock, host: bool = False, pages: int = 32) -> RadixCache:
    tiers = (TierConfig(host=HostPoolConfig(pages=64), write_policy="write_through",
                        prefetch_policy="wait_complete") if host else None)
    return RadixCache(CacheConfig(spec=SPEC, device_pages=pages, allocate_kv=host, tiers=tiers,
                                  quotas=quotas, record_events=True),  # type: ignore[arg-type]
                      clock=clock)


def removed(events: list, medium: str) -> int:  # type: ignore[type-arg]
    return sum(len(e.block_hashes) for e in events
               if isinstance(e, BlockRemoved) and e.medium == medium)


def hit(cache: RadixCache, ns: Namespace, tokens: np.ndarray) -> int:
    req = cache.admit(tokens, ns)
    got = req.cached_len
    cache.release(req)
    cache.check_integrity()
    return got


def test_pages_past_the_ttl_are_not_matched_and_leave_with_events() -> None:
    clock = Clock()
    cache = make({"a": TenantQuota(ttl_s=10)}, clock)
    serve(cache, A, prompt(1, 3))
    serve(cache, B, prompt(1, 3))
    cache.take_events()
    clock.t += 9.5
    assert hit(cache, A, prompt(1, 3)) == 12  # hits do not refresh the date
    clock.t += 0.5
    assert hit(cache, A, prompt(1, 3)) == 0
    events = cache.take_events()
    assert removed(events, "GPU") == 3
    assert hit(cache, B, prompt(1, 3)) == 12  # no TTL: untouched
    assert cache.tenants.stats()["a"].counters.expired_pages == 3
    assert cache.stats().cached_pages == 3  # only B's


def test_an_expired_prefix_takes_what_was_cached_below_it() -> None:
    clock = Clock()
    cache = make({"a": TenantQuota(ttl_s=10)}, clock)
    base = prompt(1, 2)
    serve(cache, A, base)
    clock.t += 6
    longer = np.concatenate([base[:-1], np.arange(50_000, 50_000 + 2 * P + 1, dtype=np.int32)])
    serve(cache, A, longer)  # a child of the first node, dated 6 s later
    clock.t += 4  # the first node's deadline; its child's is 6 s away
    assert hit(cache, A, longer) == 0
    assert sum(1 for n in cache.tree.nodes() if n.namespace == A) == 0


def test_split_pieces_share_their_date_and_both_expire() -> None:
    clock = Clock()
    cache = make({"a": TenantQuota(ttl_s=10)}, clock)
    serve(cache, A, prompt(1, 4))
    clock.t += 5
    half = np.concatenate([prompt(1, 4)[: 2 * P], np.arange(7_000, 7_000 + P + 1, dtype=np.int32)])
    serve(cache, A, half)  # splits the first node after 2 pages; a new leaf dated now
    clock.t += 5
    assert hit(cache, A, prompt(1, 4)) == 0
    assert hit(cache, A, half) == 0  # the upper piece went with the lower


def test_held_expired_pages_are_masked_and_go_when_released() -> None:
    clock = Clock()
    cache = make({"a": TenantQuota(ttl_s=10)}, clock)
    first = serve(cache, A, prompt(1, 3), release=False)
    clock.t += 11
    second = serve(cache, A, prompt(1, 3), release=False)
    assert second.cached_len == 0  # masked: the first request still holds them
    assert not set(second.page_table[:3].tolist()) & set(first.page_table[:3].tolist())
    cache.release(second)
    assert hit(cache, A, prompt(1, 3)) == 0  # its pages stayed private: nothing was inserted
    cache.take_events()
    cache.release(first)
    cache.poll()
    cache.check_integrity()
    assert removed(cache.take_events(), "GPU") == 3
    assert cache.stats().cached_pages == 0


def test_host_copies_expire_too() -> None:
    clock = Clock()
    cache = make({"a": TenantQuota(ttl_s=10)}, clock, host=True, pages=8)
    serve(cache, A, prompt(1, 3))
    cache.drain()
    cache.evict(8)  # only the host copy is left
    assert hit(cache, A, prompt(1, 3)) == 12  # served from the host
    cache.drain()
    cache.evict(8)
    cache.take_events()
    clock.t += 10
    assert hit(cache, A, prompt(1, 3)) == 0
    events = cache.take_events()
    assert removed(events, "CPU_PINNED") == 3
    assert not [e for e in events if isinstance(e, BlockStored)]


def test_a_ttl_set_at_run_time_dates_cached_pages_from_then() -> None:
    clock = Clock()
    cache = make({}, clock)
    serve(cache, A, prompt(1, 2))
    clock.t += 100
    cache.tenants.set_quota("a", TenantQuota(ttl_s=10))
    assert hit(cache, A, prompt(1, 2)) == 8
    clock.t += 10
    assert hit(cache, A, prompt(1, 2)) == 0
    serve(cache, A, prompt(2, 2))
    cache.tenants.set_quota("a", TenantQuota(ttl_s=5))  # lowered below its age: gone at once
    clock.t += 6
    assert cache.tenants.set_quota("a", TenantQuota(ttl_s=5)) == 2
    assert hit(cache, A, prompt(2, 2)) == 0


def test_a_default_ttl_holds_for_every_tenant_not_listed() -> None:
    clock = Clock()
    cache = make(parse_quotas({"*": {"ttl_s": 3}, "b": {}}), clock)
    serve(cache, A, prompt(1, 2))
    serve(cache, B, prompt(1, 2))
    clock.t += 3
    assert hit(cache, A, prompt(1, 2)) == 0
    assert hit(cache, B, prompt(1, 2)) == 8


@pytest.mark.parametrize("bad", [0, -1, True, "5", float("inf"), float("nan")])
def test_a_bad_ttl_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        TenantQuota(ttl_s=bad)  # type: ignore[arg-type]


def test_invalidate_forgets_every_namespace_with_the_tag() -> None:
    clock = Clock()
    cache = make({}, clock)
    v3a = Namespace("a", tags=("model:v3",))
    v3b = Namespace("b", lora_name="x", tags=("model:v3", "template:v8"))
    other = Namespace("c", tags=("model:v4",))
    for ns in (v3a, v3b, other, B):
        serve(cache, ns, prompt(1, 2))
    cache.take_events()
    assert cache.invalidate("model:v3") == 0
    assert removed(cache.take_events(), "GPU") == 4
    assert hit(cache, Namespace("a"), prompt(1, 2)) == 0  # tags are not part of the identity
    assert hit(cache, Namespace("b", lora_name="x"), prompt(1, 2)) == 0
    assert hit(cache, other, prompt(1, 2)) == 8
    assert hit(cache, B, prompt(1, 2)) == 8
    assert cache.tenants.stats()["a"].counters.invalidated_pages == 2
    assert cache.invalidate("model:v3") == 0  # nothing left under it
    assert cache.invalidate("never-used") == 0


def test_invalidate_keeps_held_pages_from_new_requests() -> None:
    cache = make(None, Clock())
    ns = Namespace("a", tags=("t",))
    held = serve(cache, ns, prompt(1, 2), release=False)
    assert cache.invalidate("t") == 2
    assert hit(cache, ns, prompt(1, 2)) == 0
    cache.release(held)
    cache.check_integrity()


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "é", 5, None])
def test_a_bad_tag_is_refused_and_changes_nothing(bad: object) -> None:
    cache = make(None, Clock())
    serve(cache, Namespace("a", tags=("t",)), prompt(1, 2))
    with pytest.raises((TypeError, ValueError), match="tag"):
        cache.invalidate(bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="tags"):
        Namespace("a", tags=(bad,))  # type: ignore[arg-type]
    assert hit(cache, Namespace("a"), prompt(1, 2)) == 8


def _lmdb_cache(path: object, clock: Clock, quotas: object) -> RadixCache:
    from radixcache.offload import StorageConfig

    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
    tiers = TierConfig(host=HostPoolConfig(pages=16), write_policy="write_through",
                       prefetch_policy="wait_complete", model_id="retention",
                       storage=StorageConfig(path=path, capacity_bytes=1 << 20, clock=clock))  # type: ignore[arg-type]
    return RadixCache(CacheConfig(spec=spec, device_pages=16, tiers=tiers, quotas=quotas,  # type: ignore[arg-type]
                                  record_events=True), clock=clock)


def test_pages_read_back_from_lmdb_keep_their_records_deadline(tmp_path: object) -> None:
    """A page stored at t0 with a 10 s TTL and read back from LMDB at t0+8
    (after a restart) is not served at t0+10 from the device or host copy the
    read made: it is dated by its record's deadline, not by the read."""
    clock = Clock()
    t0 = clock.t
    cache = _lmdb_cache(tmp_path, clock, {"a": TenantQuota(ttl_s=10)})
    serve(cache, A, prompt(1, 3))
    cache.drain()
    assert cache.tier_stats().storage.records == 3  # type: ignore[union-attr]
    cache.close()
    clock.t = t0 + 8
    cache = _lmdb_cache(tmp_path, clock, {"a": TenantQuota(ttl_s=10)})
    req = cache.admit(prompt(1, 3), A)
    assert req.cached_len == 12  # from storage, 8 s into its life
    cache.reserve(req, 1)
    cache.release(req)
    cache.drain()
    assert hit(cache, A, prompt(1, 3)) == 12  # now on the device
    clock.t = t0 + 10
    assert hit(cache, A, prompt(1, 3)) == 0  # neither the copies nor the record
    sweep = cache.tiers.storage.sweep_expired()  # type: ignore[attr-defined]
    assert sweep.wait(10) and sweep.result() == 3  # the records went too
    assert cache.tier_stats().storage.expired == 3  # type: ignore[union-attr]
    cache.close()


def test_invalidate_reaches_records_an_earlier_process_stored(tmp_path: object) -> None:
    """After a restart the cache has never seen the namespace: storage's tag
    index still finds its records, and a store reopened after it serves none."""
    clock = Clock()
    ns = Namespace("a", tags=("model:v3",))
    cache = _lmdb_cache(tmp_path, clock, None)
    serve(cache, ns, prompt(1, 3))
    serve(cache, B, prompt(1, 3))
    cache.drain()
    cache.close()
    cache = _lmdb_cache(tmp_path, clock, None)
    cache.invalidate("model:v3")
    cache.close()
    cache = _lmdb_cache(tmp_path, clock, None)
    assert hit(cache, Namespace("a"), prompt(1, 3)) == 0
    assert hit(cache, B, prompt(1, 3)) == 12  # untagged: still there
    cache.close()

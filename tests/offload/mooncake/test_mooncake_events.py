"""Page events of engines on a Mooncake pool: a page stored in the pool is
announced ``BlockStored(medium="EXTERNAL")`` once, by the engine that wrote
it; an engine that reads it, or whose put found it there, announces nothing
for it. Removals: Mooncake's PyPI build reports none (its KV event publisher
is compiled out), so an engine announces ``BlockRemoved(EXTERNAL)`` only for
what it removed itself (here: a forgotten tenant); a page the pool lost
otherwise is a miss when it is read, and announced by nobody. Real master
and holder; engines configured as users do (``TierConfig(storage=url)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixcache import CacheConfig, Namespace, RadixCache
from radixcache.events.types import BlockRemoved, BlockStored, KvEvent
from radixcache.offload import HostPoolConfig
from radixcache.tiers.config import TierConfig
from tests.radixcache.tiers.tierkit import P, SPEC, assert_kv_correct, compute, prefill

if TYPE_CHECKING:
    from tests.offload.mooncake.mooncake_pools import MooncakeKit


def engine(url: str) -> RadixCache:
    tiers = TierConfig(host=HostPoolConfig(pages=16), write_policy="write_through",
                       prefetch_policy="wait_complete", storage=url, model_id="events-model")
    return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers, record_events=True))


def hashes(events: list[KvEvent], medium: str | None, kind: type = BlockStored) -> list[int]:
    return [h for e in events if isinstance(e, kind) and e.medium == medium for h in e.block_hashes]


def test_the_writer_announces_pool_pages_once_and_a_reader_never(mooncake_kit: MooncakeKit) -> None:
    prompt = np.arange(500, 500 + 4 * P + 1, dtype=np.int32)  # 4 full pages
    a = engine(mooncake_kit.url)
    try:
        a.release(prefill(a, prompt))
        a.drain()
        events_a = a.take_events()
        external = hashes(events_a, "EXTERNAL")
        assert len(external) == 4 and external == (hashes(events_a, None) + hashes(events_a, "GPU"))[:4]
        assert hashes(events_a, "DISK") == []
        a.release(prefill(a, prompt))
        a.drain()
        assert hashes(a.take_events(), "EXTERNAL") == []  # stored already: nothing again
    finally:
        a.close()
    b = engine(mooncake_kit.url)
    try:
        req = b.admit(prompt)
        assert req.cached_len == 4 * P  # served from the pool
        b.reserve(req, 1)
        assert_kv_correct(b, req)
        b.release(req)
        b.drain()
        events_b = b.take_events()
        assert hashes(events_b, "EXTERNAL") == [] and hashes(events_b, "CPU_PINNED")
    finally:
        b.close()


def test_a_put_that_finds_the_pages_there_announces_nothing(mooncake_kit: MooncakeKit) -> None:
    prompt = np.arange(9000, 9000 + 3 * P + 1, dtype=np.int32)
    d, e = engine(mooncake_kit.url), engine(mooncake_kit.url)
    try:
        late = e.admit(prompt)  # looked up before D wrote anything: a miss
        assert late.cached_len == 0
        d.release(prefill(d, prompt))
        d.drain()
        assert len(hashes(d.take_events(), "EXTERNAL")) == 3
        compute(e, late, prompt.size)
        e.release(late)
        e.drain()
        events_e = e.take_events()
        assert hashes(events_e, "EXTERNAL") == [] and len(hashes(events_e, "CPU_PINNED")) == 3
    finally:
        d.close()
        e.close()


def test_own_removals_are_announced_and_the_pools_own_only_show_as_misses(mooncake_kit: MooncakeKit) -> None:
    tenant = Namespace(salt="tenant-x")
    kept = np.arange(7000, 7000 + 2 * P + 1, dtype=np.int32)
    lost = np.arange(8000, 8000 + 2 * P + 1, dtype=np.int32)
    a = engine(mooncake_kit.url)
    try:
        a.release(prefill(a, kept, tenant))
        a.release(prefill(a, lost))
        a.drain()
        stored = a.take_events()
        tenant_pages = hashes(stored, "EXTERNAL")[:2]
        assert len(hashes(stored, "EXTERNAL")) == 4
        # the pool loses ``lost``'s records behind the engine's back (an eviction, a holder gone)
        names = _record_names(a, lost)
        assert mooncake_kit.raw(lambda c: c.batch_remove(names, True)) == [0, 0]
        a.drain()
        assert hashes(a.take_events(), "EXTERNAL", BlockRemoved) == []  # nobody tells
        a.forget_namespace(tenant)  # its own removal: announced
        a.drain()
        assert sorted(hashes(a.take_events(), "EXTERNAL", BlockRemoved)) == sorted(tenant_pages)
    finally:
        a.close()
    b = engine(mooncake_kit.url)
    try:  # the lost pages are misses: computed again, KV right
        req = b.admit(lost)
        assert req.cached_len == 0
        b.release(req)
    finally:
        b.close()


def _record_names(cache: RadixCache, tokens: np.ndarray) -> list[str]:
    """The pool's record names of the full pages of ``tokens`` in the default namespace."""
    from tests.radixcache.tiers.tierkit import page_record_keys

    storage = cache.tiers.controller.storage  # type: ignore[attr-defined]
    return storage.pool_names(page_record_keys(cache, tokens))  # type: ignore[no-any-return]

"""Retention in the pool: values expire by their put's deadline (PutMeta.expires_at)
at the latest; a put past its deadline writes nothing and is counted."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache.offload import PutMeta

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyServer


def _meta(n: int, expires_at: float | None) -> PutMeta:
    return PutMeta(block_ids=list(range(n)), parent_block_id=None, first_depth=0, expires_at=expires_at)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_deadline_cuts_the_ttl_of_every_value(single_kit: PoolKit, valkey_server: ValkeyServer) -> None:
    clock = FakeClock(1_000_000.0)
    pool = single_kit.pool(clock=clock, ttl_s=3600)
    keys = single_kit.keys(3)
    host = single_kit.host(4)
    ticket = pool.put(keys, single_kit.tokens(3), host, np.arange(3, dtype=np.int32), b"ns",
                      meta=_meta(3, clock.now + 2.5))
    assert single_kit.done(ticket) == 3
    with valkey_server.client() as raw:
        ttls = [raw.pttl(key) for key in pool.pool_keys(keys)]
    assert all(0 < ttl <= 2500 for ttl in ttls), ttls
    # without a deadline the config's TTL holds
    more = single_kit.keys(2, b"more")
    assert single_kit.done(pool.put(more, single_kit.tokens(2), host, np.arange(2, dtype=np.int32), b"ns")) == 2
    with valkey_server.client() as raw:
        ttls = [raw.pttl(key) for key in pool.pool_keys(more)]
    assert all(3_500_000 < ttl <= 3_600_000 for ttl in ttls), ttls


def test_the_config_ttl_holds_when_it_is_nearer_than_the_deadline(
    single_kit: PoolKit, valkey_server: ValkeyServer
) -> None:
    clock = FakeClock(50.0)
    pool = single_kit.pool(clock=clock, ttl_s=10)
    keys = single_kit.keys(1)
    host = single_kit.host(1)
    single_kit.done(pool.put(keys, single_kit.tokens(1), host, np.zeros(1, np.int32), b"ns",
                             meta=_meta(1, clock.now + 3600)))
    with valkey_server.client() as raw:
        assert 9_000 < raw.pttl(pool.pool_keys(keys)[0]) <= 10_000


def test_values_are_gone_after_their_deadline(single_kit: PoolKit) -> None:
    pool = single_kit.pool()
    keys = single_kit.keys(4)
    tokens = single_kit.tokens(4)
    host = single_kit.host(8)
    ticket = pool.put(keys, tokens, host, np.arange(4, dtype=np.int32), b"ns",
                      meta=_meta(4, time.time() + 0.8))
    assert single_kit.done(ticket) == 4
    assert pool.longest_prefix(keys) == 4
    time.sleep(1.0)
    assert pool.longest_prefix(keys) == 0
    assert single_kit.done(pool.get(keys, tokens, host, np.arange(4, 8, dtype=np.int32), b"ns")) == 0


@pytest.mark.parametrize("late_s", [0.0, 5.0])
def test_a_put_past_its_deadline_writes_nothing_and_is_counted(
    single_kit: PoolKit, late_s: float
) -> None:
    clock = FakeClock(2_000.0)
    pool = single_kit.pool(clock=clock)
    keys = single_kit.keys(3)
    ticket = pool.put(keys, single_kit.tokens(3), single_kit.host(3), np.arange(3, dtype=np.int32),
                      b"ns", meta=_meta(3, clock.now - late_s), tenant=b"s:tenant-a")
    assert single_kit.done(ticket) == 0
    assert pool.longest_prefix(keys) == 0
    assert pool.pool_stats().past_deadline == 3
    assert pool.stats().failed_ops == 0
    assert pool.tenant_stats()[b"s:tenant-a"].past_deadline == 3
    assert pool.take_written() == []

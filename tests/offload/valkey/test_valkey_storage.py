"""ValkeyStorage against real Valkey servers: what is Valkey's own (round trips,
scripts). The storage contract itself runs on every backend in
tests/offload/storage/test_conformance.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyServer


def test_a_2048_page_lookup_takes_one_round_trip(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    n = 2048
    keys = pool_kit.keys(n)
    host = pool_kit.host(n)
    assert pool_kit.done(pool.put(keys[:1500], pool_kit.tokens(1500), host, np.arange(1500, dtype=np.int32), b"ns")) == 1500
    before = pool.pool_stats().round_trips
    assert pool.longest_prefix(keys) == 1500
    assert pool.pool_stats().round_trips - before == 1


def test_without_scripts_a_lookup_takes_at_most_two_round_trips(single_kit: PoolKit, valkey_server: ValkeyServer) -> None:
    with valkey_server.client() as admin:  # a user that may not run scripts
        admin.execute_command("ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha")
    pool = single_kit.pool(url=f"valkey://noscript:pw@127.0.0.1:{valkey_server.port}/0", lookup_first_round=4)
    host = single_kit.host(16)
    keys = single_kit.keys(10)
    single_kit.done(pool.put(keys[:7], single_kit.tokens(7), host, np.arange(7, dtype=np.int32), b"ns"))
    assert pool.longest_prefix(keys) == 7
    assert pool.pool_stats().lookup_round_trips == 2
    assert pool.longest_prefix(keys[:3]) == 3
    assert pool.pool_stats().lookup_round_trips == 1
    assert pool.longest_prefix([keys[0], keys[8]] + keys[1:5]) == 1
    assert pool.pool_stats().unavailable == 0

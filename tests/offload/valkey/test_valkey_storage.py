"""ValkeyStorage against real Valkey servers: one server and a 3-node cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache.offload import ModelFingerprint, Storage

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyServer


def test_put_get_round_trip_is_bit_exact(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    assert isinstance(pool, Storage)
    host = pool_kit.host(16, seed=1)
    raw = host.as_bytes()
    keys = pool_kit.keys(5)
    assert pool_kit.done(pool.put(keys, pool_kit.tokens(5), host, pool_kit.ids(3, 7, 0, 12, 5), b"ns")) == 5
    assert pool.longest_prefix(keys) == 5
    dst = pool_kit.host(16, seed=2)
    out = dst.as_bytes()
    assert pool_kit.done(pool.get(keys, pool_kit.tokens(5), dst, pool_kit.ids(9, 1, 2, 15, 4))) == 5
    for src, to in zip((3, 7, 0, 12, 5), (9, 1, 2, 15, 4)):
        assert np.array_equal(out[to], raw[src])
    stats = pool.stats()
    assert (stats.puts, stats.hits, stats.misses, stats.corrupt) == (5, 5, 0, 0)


def test_longest_prefix_stops_at_the_first_missing_page(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    host = pool_kit.host(16)
    keys = pool_kit.keys(10)
    assert pool_kit.done(pool.put(keys[:7], pool_kit.tokens(7), host, np.arange(7, dtype=np.int32), b"ns")) == 7
    assert pool.longest_prefix(keys) == 7
    assert pool.pool_stats().lookup_round_trips == 1  # one script call per node, all at once
    assert pool.longest_prefix(keys[:3]) == 3
    assert pool.longest_prefix(keys[7:]) == 0
    assert pool.longest_prefix([keys[0], keys[8], keys[1]]) == 1
    assert pool.longest_prefix([]) == 0


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


def test_put_skips_stored_keys_and_a_second_engine_reads_them(pool_kit: PoolKit) -> None:
    a, b = pool_kit.pool(), pool_kit.pool()
    host = pool_kit.host(16, seed=3)
    keys = pool_kit.keys(4)
    assert pool_kit.done(a.put(keys, pool_kit.tokens(4), host, pool_kit.ids(0, 1, 2, 3), b"ns")) == 4
    assert pool_kit.done(b.put(keys, pool_kit.tokens(4), host, pool_kit.ids(0, 1, 2, 3), b"ns")) == 4
    assert (b.stats().puts, b.stats().put_skipped) == (0, 4)
    # each page is announced (EXTERNAL) once, by the engine that wrote it
    assert (a.medium, a.take_written(), b.take_written(), a.take_written()) == ("EXTERNAL", keys, [], [])
    dst = pool_kit.host(16, seed=4)
    assert pool_kit.done(b.get(keys, pool_kit.tokens(4), dst, pool_kit.ids(4, 5, 6, 7))) == 4
    assert np.array_equal(dst.as_bytes()[4:8], host.as_bytes()[0:4])


def test_get_stops_at_a_missing_page_and_counts_the_rest_as_misses(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    host = pool_kit.host(16)
    keys = pool_kit.keys(6)
    tokens = pool_kit.tokens(6)
    pool_kit.done(pool.put(keys[:2], tokens[:2], host, pool_kit.ids(0, 1), b"ns"))
    pool_kit.done(pool.put(keys[3:], tokens[3:], host, pool_kit.ids(3, 4, 5), b"ns"))
    assert pool_kit.done(pool.get(keys, tokens, pool_kit.host(16), np.arange(6, dtype=np.int32))) == 2
    assert (pool.stats().hits, pool.stats().misses) == (2, 4)


def test_another_fingerprint_never_sees_the_pages(pool_kit: PoolKit) -> None:
    mine = pool_kit.pool()
    other = pool_kit.pool(ModelFingerprint("other-model", pool_kit.spec.describe(), 0))
    host = pool_kit.host(16)
    keys = pool_kit.keys(3)
    pool_kit.done(mine.put(keys, pool_kit.tokens(3), host, pool_kit.ids(0, 1, 2), b"ns"))
    assert other.longest_prefix(keys) == 0
    assert pool_kit.done(other.get(keys, pool_kit.tokens(3), pool_kit.host(16), pool_kit.ids(0, 1, 2))) == 0
    assert mine.longest_prefix(keys) == 3


def test_wrong_tokens_are_a_miss_and_the_record_is_deleted(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    host = pool_kit.host(16)
    keys = pool_kit.keys(2)
    pool_kit.done(pool.put(keys, pool_kit.tokens(2), host, pool_kit.ids(0, 1), b"ns"))
    wrong = pool_kit.tokens(2, start=50)
    assert pool_kit.done(pool.get(keys, wrong, pool_kit.host(16), pool_kit.ids(2, 3))) == 0
    pool_kit.done(pool.delete([]))  # the corrupt record's deletion is queued before this
    assert pool.stats().corrupt == 1
    assert pool.longest_prefix(keys) == 0
    assert pool.take_removed() == [keys[0]]


def test_delete_and_forget_namespace_report_removals_in_order(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    host = pool_kit.host(16)
    keys = pool_kit.keys(6)
    tokens = pool_kit.tokens(6)
    pool_kit.done(pool.put(keys[:3], tokens[:3], host, pool_kit.ids(0, 1, 2), b"tenant-a"))
    pool_kit.done(pool.put(keys[3:], tokens[3:], host, pool_kit.ids(3, 4, 5), b"tenant-b"))
    assert pool_kit.done(pool.delete([keys[0], pool_kit.keys(1, b"never")[0]])) == 1
    assert pool_kit.done(pool.forget_namespace(b"tenant-b")) == 3
    assert pool_kit.done(pool.forget_namespace(b"tenant-b")) == 0
    assert pool.longest_prefix(keys[1:3]) == 2
    assert pool.longest_prefix(keys[3:]) == 0
    removed = pool.take_removed()
    # keys[0] went first; within one forget, a cluster's nodes report in their own order
    assert removed[0] == keys[0] and sorted(removed[1:]) == sorted(keys[3:]), removed
    assert pool.take_removed() == []
    assert pool.stats().deleted == 4


def test_bad_calls_raise_clear_errors(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    host = pool_kit.host(4)
    with pytest.raises(ValueError, match="1 to 256"):
        pool.longest_prefix([b""])
    with pytest.raises(ValueError, match="shape"):
        pool.put(pool_kit.keys(2), pool_kit.tokens(3), host, pool_kit.ids(0, 1), b"ns")
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        pool.get(pool_kit.keys(1), pool_kit.tokens(1), host, pool_kit.ids(4))
    with pytest.raises(TypeError, match="namespace"):
        pool.put(pool_kit.keys(1), pool_kit.tokens(1), host, pool_kit.ids(0), "ns")  # type: ignore[arg-type]
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.longest_prefix(pool_kit.keys(1))


def test_raw_pages_with_engine_keys_round_trip(pool_kit: PoolKit) -> None:
    """Raw pages (tokens None; keys of 1 to 256 bytes, as serving engines key them)."""
    pool = pool_kit.pool()
    host = pool_kit.host(8, seed=11)
    keys = [b"k", b"engine-block-" + bytes(range(40)), bytes(256)]
    assert pool_kit.done(pool.put(keys, None, host, pool_kit.ids(5, 6, 7), b"raw-ns")) == 3
    assert pool.longest_prefix(keys) == 3
    dst = pool_kit.host(8, seed=12)
    assert pool_kit.done(pool.get(keys, None, dst, pool_kit.ids(0, 1, 2), namespace=b"raw-ns")) == 3
    assert np.array_equal(dst.as_bytes()[:3], host.as_bytes()[5:8])
    # a raw record is never served as a token page (and the other way round)
    assert pool_kit.done(pool.get(keys[:1], pool_kit.tokens(1), dst, pool_kit.ids(0))) == 0
    with pytest.raises(ValueError, match="1 to 256"):
        pool.put([bytes(257)], None, host, pool_kit.ids(0), b"raw-ns")

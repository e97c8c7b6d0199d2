"""Values of several pages (``chunk_pages``): fewer keys, every page still
verified on its own, prefixes and removals as with one page per value.
Real servers: the session's single server and its 3-node cluster."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from radixcache.offload import ModelFingerprint
from radixcache.offload.storage import record as rec
from radixcache.offload.valkey.layout import Cuts, leading

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit

N = 4  # pages per value on average in these tests


def _values(kit: PoolKit, servers: Any) -> dict[bytes, bytes]:
    """Every value in the pool (no index sets), by pool key."""
    out = {}
    for node in getattr(servers, "nodes", [servers]):
        with node.client() as c:
            for key in c.scan_iter(match=b"rxkv:*"):
                if b"ns:" not in key:
                    out[key] = c.get(key)
    return out


@pytest.fixture
def servers(pool_kit: PoolKit, request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(
        "valkey_server" if "single" in request.node.callspec.id else "valkey_cluster"
    )


def test_cuts_are_decided_by_the_keys_alone() -> None:
    cuts = Cuts(N)
    keys = [bytes([i]) * 24 for i in range(200)]
    runs = cuts.runs(keys, raw=False)
    assert runs[0][0] == 0 and runs[-1][1] == 200
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))  # every page once, in order
    assert all(0 < e - s <= 4 * N for s, e in runs)
    flags = cuts.flags(keys)
    assert all(flags[e - 1] for s, e in runs[:-1] if e - s < 4 * N)  # cut at boundaries
    assert 200 / len(runs) > 1.5  # several pages per value on average
    # a second put of the same pages from a boundary on cuts them the same way
    start = runs[3][0]
    assert cuts.runs(keys[start:], raw=False)[:3] == [(s - start, e - start) for s, e in runs[3:6]]
    assert cuts.runs(keys, raw=True) == [(i, i + 1) for i in range(200)]
    assert Cuts(1).runs(keys[:3], raw=False) == [(0, 1), (1, 2), (2, 3)]


def test_leading_walks_values_that_reach_back() -> None:
    # pages 0-2 in a value ending at 2, page 3 alone, 4-5 in a value ending at 5
    assert leading([0, 0, 3, 1, 0, 2], [False] * 6) == 6
    assert leading([0, 0, 3, 0, 0, 2], [False, False, True, False, False, True]) == 3
    assert leading([0, 0, 3, 0, 0, 1], [False] * 6) == 3  # the value at 5 does not reach 3
    assert leading([0, 0, 0], [False] * 3) == 0  # ends past these keys: not found
    assert leading([5, 1], [True, True]) == 2  # a value reaching back before the first key


def test_pages_round_trip_in_values_of_several_pages(pool_kit: PoolKit, servers: Any) -> None:
    pool = pool_kit.pool(chunk_pages=N)
    n = 40
    keys, tokens, host = pool_kit.keys(n), pool_kit.tokens(n), pool_kit.host(n, seed=1)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(pool.put(keys, tokens, host, ids, b"ns")) == n
    values = _values(pool_kit, servers)
    assert 4 <= len(values) <= n // 2  # fewer keys than pages
    assert pool.longest_prefix(keys) == n
    dst = pool_kit.host(n, seed=2)
    assert pool_kit.done(pool.get(keys, tokens, dst, ids[::-1].copy())) == n
    assert np.array_equal(dst.as_bytes()[::-1], host.as_bytes())
    assert (pool.stats().puts, pool.stats().hits, pool.stats().corrupt) == (n, n, 0)
    assert pool.take_written() == keys
    # reads that start inside a value, and a second engine without the lookup
    other = pool_kit.pool(chunk_pages=N)
    dst = pool_kit.host(n, seed=3)
    assert pool_kit.done(other.get(keys[5:], tokens[5:], dst, ids[5:])) == n - 5
    assert np.array_equal(dst.as_bytes()[5:], host.as_bytes()[5:])
    # a prefix that ends inside a value finds the pages up to the value before it
    cuts = Cuts(N)
    ends = [e for _s, e in cuts.runs(pool.record_keys(keys), raw=False)]
    cut = next(e for e in ends if e > 3) - 1  # the last page before a value's end
    found = pool.longest_prefix(keys[:cut])
    assert found == max([e for e in ends if e <= cut], default=0)
    assert pool_kit.done(other.get(keys[:cut], tokens[:cut], pool_kit.host(n), ids[:cut])) == found


def test_a_damaged_record_inside_a_value_is_refused_alone(pool_kit: PoolKit, servers: Any) -> None:
    pool = pool_kit.pool(chunk_pages=N)
    n = 24
    keys, tokens, host = pool_kit.keys(n, b"dmg"), pool_kit.tokens(n), pool_kit.host(n, seed=4)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(pool.put(keys, tokens, host, ids, b"ns")) == n
    runs = Cuts(N).runs(pool.record_keys(keys), raw=False)
    start, end = next((s, e) for s, e in runs if e - s >= 2 and s > 0)
    target = start + 1  # the second record of a value of several pages
    vkey = pool.pool_keys([keys[end - 1]])[0]
    with servers.client() as c:  # routes by key on a cluster
        damaged = bytearray(c.get(vkey))
        first = rec.HEADER.size + 24 + 4 * pool_kit.spec.page_size + pool_kit.spec.page_bytes
        damaged[8 + first + rec.HEADER.size + 30] ^= 1  # a token byte of the second record
        c.set(vkey, bytes(damaged))
    dst = pool_kit.host(n, seed=5)
    assert pool_kit.done(pool.get(keys, tokens, dst, ids)) == target  # served up to it
    assert np.array_equal(dst.as_bytes()[:target], host.as_bytes()[:target])
    pool_kit.done(pool.delete([]))
    assert pool.stats().corrupt == 1
    removed = pool.take_removed()
    assert sorted(removed) == sorted(keys[start:end])  # the whole value went, page by page
    assert pool.longest_prefix(keys) == start
    # the engine recomputes from the refused page on and puts again: all served
    assert pool_kit.done(pool.put(keys[start:], tokens[start:], host, ids[start:], b"ns")) == n - start
    dst = pool_kit.host(n, seed=6)
    assert pool_kit.done(pool.get(keys, tokens, dst, ids)) == n
    assert np.array_equal(dst.as_bytes(), host.as_bytes())


def test_removals_of_a_value_name_all_its_pages_and_forget_removes_them(
    pool_kit: PoolKit, servers: Any
) -> None:
    pool = pool_kit.pool(chunk_pages=N)
    n = 16
    keys, tokens, host = pool_kit.keys(n, b"rm"), pool_kit.tokens(n), pool_kit.host(n)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(pool.put(keys[:8], tokens[:8], host, ids[:8], b"a")) == 8
    assert pool_kit.done(pool.put(keys[8:], tokens[8:], host, ids[8:], b"b")) == 8
    vkeys = [k for k in _values(pool_kit, servers)]
    first = next(k for k in vkeys if k.endswith(keys[7]))  # the value ending put "a"
    with servers.client() as c:  # an operator deletes it
        c.delete(first)
    removed: list[bytes] = []
    deadline = time.monotonic() + 10
    while not set(keys[:8]) & set(removed) and time.monotonic() < deadline:
        removed += pool.take_removed()
        time.sleep(0.02)
    runs = Cuts(N).runs(pool.record_keys(keys[:8]), raw=False)
    last = next((s, e) for s, e in runs if e == 8)
    assert sorted(removed) == sorted(keys[last[0] : 8])
    assert pool_kit.done(pool.forget_namespace(b"b")) == 8
    assert pool.longest_prefix(keys[8:]) == 0
    assert sorted(pool.take_removed()) == sorted(keys[8:])


def test_ranks_sharing_one_copy_store_each_page_once(pool_kit: PoolKit, servers: Any) -> None:
    """MLA-style layouts (every rank holds the same KV): the rank leaves the
    fingerprint, the second rank's put finds the pages and sends none."""
    spec = pool_kit.spec.describe()
    rank0 = pool_kit.pool(ModelFingerprint("mla", spec, 0, rank_shared=True), chunk_pages=N)
    rank1 = pool_kit.pool(ModelFingerprint("mla", spec, 1, rank_shared=True), chunk_pages=N)
    n = 12
    keys, tokens, host = pool_kit.keys(n, b"mla"), pool_kit.tokens(n), pool_kit.host(n, seed=7)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(rank0.put(keys, tokens, host, ids, b"ns")) == n
    before = len(_values(pool_kit, servers))
    assert pool_kit.done(rank1.put(keys, tokens, host, ids, b"ns")) == n
    assert len(_values(pool_kit, servers)) == before  # one copy
    assert (rank1.stats().puts, rank1.stats().put_skipped) == (0, n)
    dst = pool_kit.host(n, seed=8)
    assert pool_kit.done(rank1.get(keys, tokens, dst, ids)) == n
    assert np.array_equal(dst.as_bytes(), host.as_bytes())
    apart = pool_kit.pool(ModelFingerprint("mla", spec, 1), chunk_pages=N)  # not shared: its own
    assert apart.longest_prefix(keys) == 0


@pytest.mark.parametrize("pages_per_value", [1, N])
def test_reads_of_several_batches_serve_every_page_every_time(
    pool_kit: PoolKit, pages_per_value: int
) -> None:
    """A read longer than a batch fetches the next batch while it files the
    first; a page is served only once its record is filed (a race that once
    cut such reads short at the batch boundary, now and then)."""
    pool = pool_kit.pool(chunk_pages=pages_per_value, batch_pages=8, num_readers=2)
    reader = pool._reader
    verify = reader._verify

    def slow_verify(*args: Any) -> bool:  # holds each read mid-way: the next batch's fetch runs ahead
        time.sleep(0.002)
        return verify(*args)

    reader._verify = slow_verify  # type: ignore[method-assign]
    n = 53
    keys, tokens, host = pool_kit.keys(n, b"batches"), pool_kit.tokens(n), pool_kit.host(n, seed=9)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(pool.put(keys, tokens, host, ids, b"ns")) == n
    for round_ in range(6):
        if round_ % 2:
            assert pool.longest_prefix(keys) == n  # half the reads follow a lookup (hints)
        dsts = [pool_kit.host(n, seed=round_) for _ in range(3)]
        tickets = [pool.get(keys, tokens, dst, ids) for dst in dsts]  # at once, on both readers
        assert [pool_kit.done(t) for t in tickets] == [n, n, n]
        assert all(np.array_equal(dst.as_bytes(), host.as_bytes()) for dst in dsts)
    assert pool.stats().misses == 0

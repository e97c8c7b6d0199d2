"""Faults of the pool degrade to misses: counted, never raised, never a hang or wrong KV.

Each test starts its own ``valkey-server`` (the fault would disturb the
session's servers): down at start, killed and restarted, paused (SIGSTOP: a
stalled network), too small (LRU evicting between lookup and read), and
records that are corrupt or were written for another key or model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest
from tests.offload.valkey.valkey_servers import ValkeyServer, free_port

from radixcache.offload import ModelFingerprint

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit

KitAt = Callable[[str], "PoolKit"]


@pytest.fixture
def server() -> Iterator[ValkeyServer]:
    s = ValkeyServer(maxmemory=64 << 20)
    yield s
    s.stop()


@pytest.fixture
def kit(server: ValkeyServer, pool_kit_at: KitAt) -> PoolKit:
    return pool_kit_at(server.url)


def _fill(kit: PoolKit, pool, n: int, salt: bytes = b"", seed: int = 0):  # type: ignore[no-untyped-def]
    """Put ``n`` pages; returns (keys, tokens, host)."""
    host = kit.host(max(n, 1), seed=seed)
    keys = kit.keys(n, salt)
    tokens = kit.tokens(n)
    assert kit.done(pool.put(keys, tokens, host, np.arange(n, dtype=np.int32), b"ns")) == n
    return keys, tokens, host


def _wait_until(check, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_pool_down_at_start_is_a_miss_then_used_once_it_answers(pool_kit_at: KitAt) -> None:
    port = free_port()
    kit = pool_kit_at(f"valkey://127.0.0.1:{port}/0")
    try:
        pool = kit.pool()
        host = kit.host(4)
        keys, tokens = kit.keys(4), kit.tokens(4)
        started = time.monotonic()
        assert pool.longest_prefix(keys) == 0
        assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 0
        assert kit.done(pool.get(keys, tokens, kit.host(4), kit.ids(0, 1, 2, 3))) == 0
        assert time.monotonic() - started < 3.0
        assert pool.pool_stats().unavailable >= 2 and pool.stats().failed_ops >= 2
        server = ValkeyServer(port=port)
        try:
            time.sleep(0.25)  # past retry_after_s: the next call reconnects
            assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4
            dst = kit.host(4, seed=9)
            assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 4
            assert np.array_equal(dst.as_bytes(), host.as_bytes())
        finally:
            kit.close_all()
            server.stop()
    finally:
        kit.close_all()


def test_killed_mid_run_then_restarted_reconnects(server: ValkeyServer, kit: PoolKit) -> None:
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 4)
    server.kill()
    assert pool.longest_prefix(keys) == 0
    assert kit.done(pool.get(keys, tokens, kit.host(4), kit.ids(0, 1, 2, 3))) == 0
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 0
    misses = pool.stats().misses
    assert misses == 4
    server.start()  # same port, empty (no persistence)
    time.sleep(0.25)
    assert pool.longest_prefix(keys) == 0  # the pages died with the server: a miss
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4
    dst = kit.host(4, seed=5)
    assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 4
    assert np.array_equal(dst.as_bytes(), host.as_bytes())
    assert pool.pool_stats().connects >= 2


def test_a_stalled_server_times_out_to_misses_and_recovers(server: ValkeyServer, kit: PoolKit) -> None:
    pool = kit.pool(socket_timeout_s=0.3, retry_after_s=0.5)
    keys, tokens, host = _fill(kit, pool, 4)
    server.pause()
    try:
        started = time.monotonic()
        assert pool.longest_prefix(keys) == 0  # times out after 0.3 s
        assert pool.longest_prefix(keys) == 0  # marked down: answers at once
        ticket = pool.get(keys, tokens, kit.host(4), kit.ids(0, 1, 2, 3))
        assert kit.done(ticket) == 0
        assert time.monotonic() - started < 2.0
    finally:
        server.resume()
    time.sleep(0.6)
    assert pool.longest_prefix(keys) == 4
    dst = kit.host(4, seed=6)
    assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 4
    assert np.array_equal(dst.as_bytes(), host.as_bytes())


def test_eviction_between_lookup_and_read_is_a_short_read(pool_kit_at: KitAt) -> None:
    server = ValkeyServer(maxmemory=4 << 20, policy="volatile-lru")
    kit = pool_kit_at(server.url)
    try:
        pool = kit.pool()
        keys, tokens, host = _fill(kit, pool, 8, salt=b"first")
        assert pool.longest_prefix(keys) == 8
        # other engines fill the pool: 8 MiB of pages through a 4 MiB pool
        other = kit.pool()
        big = kit.host(1024, seed=2)
        for round_ in range(8):
            more = kit.keys(1024, b"other%d" % round_)
            kit.done(other.put(more, kit.tokens(1024), big, np.arange(1024, dtype=np.int32), b"ns"))
        dst = kit.host(8, seed=3)
        served = kit.done(pool.get(keys, tokens, dst, np.arange(8, dtype=np.int32)))
        assert served < 8  # evicted (least recently used first): the rest is a miss
        assert np.array_equal(dst.as_bytes()[:served], host.as_bytes()[:served])
        assert pool.stats().misses == 8 - served and pool.stats().corrupt == 0
        # the evictions reached take_removed through keyspace notifications
        _wait_until(lambda: len(pool.take_removed()) > 0)
    finally:
        kit.close_all()
        server.stop()


def test_a_corrupt_value_is_a_miss_counted_and_deleted(server: ValkeyServer, kit: PoolKit) -> None:
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 4)
    raw = server.client()
    rkey = pool.pool_keys([keys[2]])[0]
    value = bytearray(raw.get(rkey))
    value[-1] ^= 0x40  # one flipped bit in the KV bytes
    raw.set(rkey, bytes(value))
    dst = kit.host(4, seed=7)
    assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 2
    assert np.array_equal(dst.as_bytes()[:2], host.as_bytes()[:2])
    kit.done(pool.delete([]))  # after the queued deletion of the corrupt record
    assert pool.stats().corrupt == 1
    assert raw.exists(rkey) == 0
    raw.set(pool.pool_keys([keys[0]])[0], b"garbage")  # not a record at all
    assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 0
    kit.done(pool.delete([]))
    assert pool.stats().corrupt == 2
    # another type under the key (an error reply), and a value longer than a record
    keys, tokens, host = _fill(kit, pool, 4, salt=b"again", seed=1)
    raw.delete(pool.pool_keys([keys[1]])[0])
    raw.sadd(pool.pool_keys([keys[1]])[0], b"member")
    assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 1
    raw.set(pool.pool_keys([keys[2]])[0], bytes(3 * kit.spec.page_bytes))
    assert kit.done(pool.get(keys[2:], tokens[2:], dst, kit.ids(2, 3))) == 0
    kit.done(pool.delete([]))
    assert pool.stats().corrupt == 4
    # the connections are still in step: the last page reads back exactly
    assert kit.done(pool.get(keys[3:], tokens[3:], dst, kit.ids(3))) == 1
    assert np.array_equal(dst.as_bytes()[3], host.as_bytes()[3])


def test_a_value_written_for_another_model_or_key_is_refused(server: ValkeyServer, kit: PoolKit) -> None:
    mine = kit.pool()
    other = kit.pool(ModelFingerprint("other-model", kit.spec.describe(), 0))
    keys, tokens, host = _fill(kit, other, 2, seed=4)
    raw = server.client()
    # the other model's records copied under this model's keys: same tokens, same page keys
    for key in keys:
        raw.set(mine.pool_keys([key])[0], raw.get(other.pool_keys([key])[0]))
    assert mine.longest_prefix(keys) == 2  # present, but ...
    assert kit.done(mine.get(keys, tokens, kit.host(2), kit.ids(0, 1))) == 0  # ... refused
    kit.done(mine.delete([]))
    assert mine.stats().corrupt == 1
    # a record of this model copied under another page key of this model
    keys2, tokens2, _ = _fill(kit, mine, 1, salt=b"x")
    raw.set(mine.pool_keys([keys[1]])[0], raw.get(mine.pool_keys(keys2)[0]))
    assert kit.done(mine.get([keys[1]], tokens2, kit.host(2), kit.ids(0))) == 0
    # and another tenant's page is refused when the reader names its namespace
    assert kit.done(mine.get(keys2, tokens2, kit.host(2), kit.ids(0), namespace=b"other")) == 0
    kit.done(mine.delete([]))  # after the refused record's deletion
    assert mine.stats().corrupt == 3
    assert kit.done(mine.get(keys2, tokens2, kit.host(2), kit.ids(0), namespace=b"ns")) == 0  # deleted


def test_wrong_password_is_a_miss_and_never_shown(pool_kit_at: KitAt, caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cret-Pa55word"
    server = ValkeyServer(password=secret)
    kit = pool_kit_at(f"valkey://:{secret}@127.0.0.1:{server.port}/0")
    try:
        caplog.set_level(logging.DEBUG)
        good = kit.pool()
        assert secret not in repr(good) and secret not in repr(good.config)
        assert secret not in good.config.describe()
        keys, tokens, host = _fill(kit, good, 2)
        bad = kit.pool(url=f"valkey://:wrong-{secret}@127.0.0.1:{server.port}/0", retry_after_s=0.1)
        assert bad.longest_prefix(keys) == 0
        assert kit.done(bad.get(keys, tokens, kit.host(2), kit.ids(0, 1))) == 0
        ticket = bad.forget_namespace(b"ns")
        assert ticket.wait(5) and ticket.error is not None
        assert secret not in str(ticket.error)
        assert bad.pool_stats().unavailable >= 2
        assert secret not in caplog.text
        assert "unavailable" in caplog.text  # the failure itself is logged
    finally:
        kit.close_all()
        server.stop()

"""The pool comes back whole: settings and subscriptions after an outage,
refused records rewritten, "not now" replies (LOADING, READONLY) never taken
for corrupt, refused puts warned once, and the storage-hit metric counting
what storage served. Each test starts its own ``valkey-server``(s)."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pytest
import redis
from tests.offload.valkey.valkey_servers import ValkeyServer, free_port, server_binary

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit

KitAt = Callable[[str], "PoolKit"]


def _wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_an_engine_opened_while_the_pool_was_down_subscribes_once_it_returns(
    pool_kit_at: KitAt,
) -> None:
    """Defect 3: opened while the pool is down, the store learns the servers'
    settings and subscribes to removals when the pool answers, without
    traffic; a restart with other settings is read again."""
    port = free_port()
    kit = pool_kit_at(f"valkey://127.0.0.1:{port}/0")
    pool = kit.pool(retry_after_s=0.2)
    assert not pool.pool_stats().removals_observed and pool.pool_stats().maxmemory == 0
    server = ValkeyServer(port=port, maxmemory=32 << 20)
    try:
        _wait_until(lambda: pool.pool_stats().removals_observed)
        assert pool.pool_stats().maxmemory == 32 << 20
        assert pool.pool_stats().policy == "volatile-lru"
        keys = kit.keys(4)
        host = kit.host(4)
        assert kit.done(pool.put(keys, kit.tokens(4), host, kit.ids(0, 1, 2, 3), b"ns")) == 4
        with server.client() as raw:  # another engine (or an operator) removes two pages
            raw.delete(*pool.pool_keys(keys[:2]))
        removed: list[bytes] = []
        _wait_until(lambda: len(removed.__iadd__(pool.take_removed())) >= 2)
        assert sorted(removed) == sorted(keys[:2])
        # restarted with another memory bound: read again on reconnect
        server.kill()
        server._args[server._args.index("--maxmemory") + 1] = str(48 << 20)
        server.start()
        kit.done(pool.put(kit.keys(1, b"x"), kit.tokens(1), host, kit.ids(0), b"ns"))  # a failed call
        _wait_until(lambda: pool.pool_stats().maxmemory == 48 << 20)
        _wait_until(lambda: pool.pool_stats().removals_observed)  # subscribed again
        with server.client() as raw:
            assert kit.done(pool.put(keys, kit.tokens(4), host, kit.ids(0, 1, 2, 3), b"ns")) == 4
            raw.delete(pool.pool_keys(keys[3:])[0])
        _wait_until(lambda: keys[3] in pool.take_removed())
    finally:
        kit.close_all()
        server.stop()


def test_refused_records_are_rewritten_by_the_next_put(pool_kit_at: KitAt) -> None:
    """Defect 4: records 3, 5 and 7 of a prefix are damaged. The first read
    serves 3 pages; the engine's next put of pages 3.. replaces every damaged
    record (not only the one that was read), so the next read serves all 10."""
    server = ValkeyServer(maxmemory=64 << 20)
    try:
        kit = pool_kit_at(server.url)
        pool = kit.pool()
        keys, tokens, host = kit.keys(10), kit.tokens(10), kit.host(10, seed=3)
        ids = np.arange(10, dtype=np.int32)
        assert kit.done(pool.put(keys, tokens, host, ids, b"ns")) == 10
        with server.client() as raw:
            for i in (3, 5, 7):
                rkey = pool.pool_keys([keys[i]])[0]
                value = bytearray(raw.get(rkey))
                value[-5] ^= 0x10
                raw.set(rkey, bytes(value))
        dst = kit.host(10, seed=4)
        assert kit.done(pool.get(keys, tokens, dst, ids)) == 3
        assert kit.done(pool.put(keys[3:], tokens[3:], host, ids[3:], b"ns")) == 7  # recomputed
        dst = kit.host(10, seed=5)
        assert kit.done(pool.get(keys, tokens, dst, ids)) == 10
        assert np.array_equal(dst.as_bytes(), host.as_bytes())
        assert pool.stats().corrupt == 1  # one refusal, then every damaged record rewritten
    finally:
        server.stop()


def test_a_full_pool_under_noeviction_warns_once_per_interval(
    pool_kit_at: KitAt, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 6 (warnings): every put refused by a full pool (OOM under
    noeviction) logged a warning; now one line per interval says how many."""
    server = ValkeyServer(maxmemory=3 << 20, policy="noeviction")
    try:
        kit = pool_kit_at(server.url)
        pool = kit.pool()
        host = kit.host(64)
        caplog.set_level(logging.WARNING, logger="radixcache.offload.valkey")
        refused = 0
        for round_ in range(60):
            keys = kit.keys(64, b"fill%d" % round_)
            stored = kit.done(pool.put(keys, kit.tokens(64), host, np.arange(64, dtype=np.int32), b"ns"))
            refused += stored < 64
        assert refused >= 20  # the pool filled up on the way
        lines = [r for r in caplog.records if "refused" in r.getMessage()]
        assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
        assert pool.stats().failed_ops >= refused
    finally:
        server.stop()


def test_a_loading_server_is_unavailable_not_corrupt(pool_kit_at: KitAt, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A server still loading its data answers LOADING: misses, never corrupt."""
    port = free_port()
    base = [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--appendonly", "no", "--save", "", "--enable-debug-command", "local"]
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        _wait_until(lambda: _pings(client))
        client.execute_command("DEBUG", "POPULATE", 200000)
        client.save()
        client.close()
        proc.kill()
        proc.wait()
        slow = ["--key-load-delay", "50", "--loading-process-events-interval-bytes", "1024"]
        proc = subprocess.Popen(base + slow, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kit = pool_kit_at(f"valkey://127.0.0.1:{port}/0")
        pool = kit.pool(retry_after_s=0.1)
        keys = kit.keys(4)
        loading = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and loading < 3:
            assert kit.done(pool.get(keys, kit.tokens(4), kit.host(4), kit.ids(0, 1, 2, 3))) == 0
            assert pool.longest_prefix(keys) == 0
            loading = pool.pool_stats().unavailable
            time.sleep(0.15)
        assert loading >= 3  # the LOADING replies were seen as "not now"
        kit.done(pool.delete([]))
        assert pool.stats().corrupt == 0 and pool.stats().deleted == 0
    finally:
        proc.kill()
        proc.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


def test_a_replica_refuses_puts_as_unavailable_and_serves_reads(pool_kit_at: KitAt) -> None:
    """A node that became a replica (after a failover) answers READONLY to
    writes: the put is short and counted unavailable, not a refused record."""
    primary = ValkeyServer(maxmemory=32 << 20)
    replica = ValkeyServer(maxmemory=32 << 20)
    try:
        kit = pool_kit_at(primary.url)
        keys, tokens, host = kit.keys(4), kit.tokens(4), kit.host(4)
        writer = kit.pool()
        assert kit.done(writer.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4
        with replica.client() as c:
            c.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        _wait_until(lambda: replica.client().dbsize() >= 4)
        pool = kit.pool(url=replica.url)
        dst = kit.host(4, seed=2)
        assert kit.done(pool.get(keys, tokens, dst, kit.ids(0, 1, 2, 3))) == 4
        assert np.array_equal(dst.as_bytes(), host.as_bytes())
        more = kit.keys(2, b"more")
        assert kit.done(pool.put(more, kit.tokens(2), host, kit.ids(0, 1), b"ns")) == 0
        assert pool.pool_stats().unavailable >= 1 and pool.stats().corrupt == 0
    finally:
        replica.stop()
        primary.stop()


def test_the_storage_hit_metric_counts_pages_served_not_promised(pool_kit_at: KitAt) -> None:
    """Defect 6 (metric): a lookup promises 4 pages, the read serves 2 (the
    third fails verification): the storage hits count the 2 served."""
    from radixcache import CacheConfig, RadixCache
    from radixcache.offload import HostPoolConfig
    from radixcache.tiers.config import TierConfig
    from tests.radixcache.tiers.tierkit import P, SPEC, prefill

    server = ValkeyServer(maxmemory=64 << 20)

    def engine() -> RadixCache:
        tiers = TierConfig(host=HostPoolConfig(pages=16), write_policy="write_through",
                           prefetch_policy="wait_complete", storage=server.url, model_id="m")
        return RadixCache(CacheConfig(spec=SPEC, device_pages=8, tiers=tiers))

    try:
        prompt = np.arange(300, 300 + 4 * P + 1, dtype=np.int32)
        a = engine()
        a.release(prefill(a, prompt))
        a.drain()
        a.close()
        with server.client() as raw:  # damage the third page's record
            values = sorted(raw.scan_iter(match=b"rxkv:*"))
            records = [k for k in values if b"ns:" not in k]
            assert len(records) == 4
            third = next(k for k in records if raw.get(k)[64:68] == (2).to_bytes(4, "little"))
            value = bytearray(raw.get(third))
            value[-1] ^= 1
            raw.set(third, bytes(value))
        b = engine()
        try:
            req = b.admit(prompt)
            assert req.cached_len == 4 * P  # promised at admission
            b.reserve(req, 1)
            assert req.cached_len == 2 * P  # two served, the rest recomputed
            tiers = b.tier_stats()
            assert tiers is not None and tiers.storage is not None
            assert tiers.storage.hits == 2 and tiers.storage_hit_tokens == 2 * P
            b.release(req)
        finally:
            b.close()
    finally:
        server.stop()

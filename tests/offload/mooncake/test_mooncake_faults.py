"""Faults of a Mooncake pool degrade to misses: counted, never raised, never wrong KV.

Each test runs its own ``mooncake_master`` and holder process (the fault
would disturb the session's pool): the master killed and restarted (its index
is lost: misses, then the engine uses the new one), down when the engine
starts, the holder process stopping (its segment's pages leave) or being
killed (its segment stays mounted, unreadable, until the master's
``client_ttl``), and calls after close (the client would segfault).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixcache.offload import ModelFingerprint, PutMeta

from tests.offload.mooncake.mooncake_pools import MooncakeKit, require_mooncake, wait_until

KitAt = Callable[[str], MooncakeKit]
REPO = Path(__file__).resolve().parents[3]


@dataclass
class OwnPool:
    master: Any  # MasterProcess
    holder: Any  # HolderProcess
    kit: MooncakeKit

    def new_holder(self, segment_mib: int = 64) -> None:
        from radixcache.offload.mooncake import HolderProcess

        self.holder = HolderProcess(self.master.url, segment_mib).start()


@pytest.fixture
def own(mooncake_kit_at: KitAt) -> Iterator[OwnPool]:
    """A master (client_ttl 2 s) and a 64 MiB holder of this test's own."""
    require_mooncake()
    from radixcache.offload.mooncake import HolderProcess, MasterProcess

    master = MasterProcess(client_ttl_s=2).start()
    holder = HolderProcess(master.url, 64).start()
    pool = OwnPool(master, holder, mooncake_kit_at(master.url))
    try:
        yield pool
    finally:
        pool.kit.close_all()
        pool.holder.kill()
        master.kill()


def _fill(kit: MooncakeKit, pool: Any, n: int, salt: bytes = b"", seed: int = 0) -> tuple[list[bytes], Any, Any]:
    host = kit.host(max(n, 1), seed=seed)
    keys = kit.keys(n, salt)
    tokens = kit.tokens(n)
    assert kit.done(pool.put(keys, tokens, host, np.arange(n, dtype=np.int32), b"ns")) == n
    return keys, tokens, host


def _served_exactly(kit: MooncakeKit, pool: Any, keys: list[bytes], tokens: Any, host: Any) -> int:
    """Read ``keys`` into fresh pages; every page served must be the one written."""
    dst = kit.host(len(keys), seed=99)
    served = kit.done(pool.get(keys, tokens, dst, np.arange(len(keys), dtype=np.int32)))
    assert np.array_equal(dst.as_bytes()[:served], host.as_bytes()[:served]), "wrong KV served"
    return int(served)


def test_master_killed_and_restarted_is_a_miss_and_the_engine_recovers(own: OwnPool) -> None:
    kit = own.kit
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 4)
    own.master.kill()
    assert pool.longest_prefix(keys) == 0
    assert _served_exactly(kit, pool, keys, tokens, host) == 0
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 0
    assert pool.pool_stats().unavailable >= 2 and pool.stats().failed_ops >= 1
    own.master.start()  # the same ports; its index is empty
    # the engine reconnects by itself, and the holder remounts its segment
    wait_until(lambda: own.master.capacity() > 0, what="the holder's segment remounted")
    wait_until(lambda: kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4,
               what="a put on the restarted master")
    assert pool.longest_prefix(keys) == 4
    assert _served_exactly(kit, pool, keys, tokens, host) == 4


def test_a_lost_master_fails_fast_after_the_first_slow_call(own: OwnPool) -> None:
    """A dead master answers gets and puts only after seconds; after the first
    such call the pool is marked down and the next calls are misses at once."""
    kit = own.kit
    pool = kit.pool(retry_after_s=30.0)
    keys, tokens, host = _fill(kit, pool, 2)
    own.master.kill()
    _served_exactly(kit, pool, keys, tokens, host)  # finds the master gone
    started = time.monotonic()
    for _ in range(5):
        assert pool.longest_prefix(keys) == 0
        assert _served_exactly(kit, pool, keys, tokens, host) == 0
        assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1), b"ns")) == 0
    assert time.monotonic() - started < 2.0
    assert pool.pool_stats().connected is False


def test_master_down_at_start_is_a_miss_then_used_once_it_answers(mooncake_kit_at: KitAt) -> None:
    require_mooncake()
    from radixcache.offload.mooncake import HolderProcess, MasterProcess

    master = MasterProcess(client_ttl_s=2)  # ports chosen, not started
    kit = mooncake_kit_at(master.url)
    holder = None
    try:
        pool = kit.pool(connect_timeout_s=0.2)
        keys, tokens = kit.keys(3), kit.tokens(3)
        host = kit.host(3, seed=4)
        assert pool.longest_prefix(keys) == 0
        assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2), b"ns")) == 0
        assert _served_exactly(kit, pool, keys, tokens, host) == 0
        assert pool.pool_stats().connects == 0
        master.start()
        holder = HolderProcess(master.url, 64).start()
        wait_until(lambda: pool.pool_stats().connects == 1, timeout_s=20.0, what="the client set up")
        assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2), b"ns")) == 3
        assert _served_exactly(kit, pool, keys, tokens, host) == 3
    finally:
        kit.close_all()
        if holder is not None:
            holder.kill()
        master.kill()


def test_a_holder_that_stops_takes_its_pages_and_a_new_one_serves(own: OwnPool) -> None:
    kit = own.kit
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 4)
    own.holder.stop()  # SIGTERM: it unmounts its segment, its objects leave the pool
    wait_until(lambda: pool.longest_prefix(keys) == 0, what="the pages gone with the segment")
    assert _served_exactly(kit, pool, keys, tokens, host) == 0
    # no memory anywhere: a put is refused, counted, and raises nothing
    failed = pool.stats().failed_ops
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 0
    assert pool.stats().failed_ops > failed
    own.new_holder()
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4
    assert _served_exactly(kit, pool, keys, tokens, host) == 4


def test_a_killed_holder_is_a_miss_until_the_master_drops_it(own: OwnPool) -> None:
    kit = own.kit
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 4)
    own.holder.kill()  # SIGKILL: its segment stays mounted, unreadable, for client_ttl (2 s)
    # the master may still list them (until client_ttl), but none can be read
    assert _served_exactly(kit, pool, keys, tokens, host) == 0
    # after client_ttl the master drops the dead segment and its objects
    wait_until(lambda: pool.longest_prefix(keys) == 0, timeout_s=15.0, what="the dead segment dropped")
    own.new_holder()
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1, 2, 3), b"ns")) == 4
    assert _served_exactly(kit, pool, keys, tokens, host) == 4


def test_an_engine_with_no_segment_takes_no_pages_with_it(own: OwnPool) -> None:
    """An engine process (no memory of its own, the default) writes pages and
    is killed; the holder keeps them, and another engine reads them bit-exact."""
    kit = own.kit
    code = (
        "import os, sys, numpy as np\n"
        "from tests.offload.mooncake.mooncake_pools import MooncakeKit\n"
        "kit = MooncakeKit(__import__('pathlib').Path('.'), sys.argv[1])\n"
        "pool = kit.pool()\n"
        "host = kit.host(6, seed=21)\n"
        "assert kit.done(pool.put(kit.keys(6), kit.tokens(6), host, np.arange(6, dtype=np.int32), b'ns')) == 6\n"
        "print('stored', flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, own.master.url], cwd=REPO, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == -9 and "stored" in out.stdout, out.stderr[-2000:]
    pool = kit.pool()
    assert pool.longest_prefix(kit.keys(6)) == 6
    assert _served_exactly(kit, pool, kit.keys(6), kit.tokens(6), kit.host(6, seed=21)) == 6


def test_calls_after_close_never_reach_the_client(mooncake_kit: MooncakeKit) -> None:
    """The Mooncake client segfaults on a call after close: every way in is
    refused first (the process is still here to assert it)."""
    from radixcache.offload.mooncake import PoolUnavailable
    from radixcache.offload.mooncake.link import MooncakeLink

    kit = mooncake_kit
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 2)
    pool.close()
    for call in (
        lambda: pool.longest_prefix(keys),
        lambda: pool.get(keys, tokens, host, kit.ids(0, 1)),
        lambda: pool.put(keys, tokens, host, kit.ids(0, 1), b"ns"),
        lambda: pool.delete(keys),
        lambda: pool.forget_namespace(b"ns"),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    link = MooncakeLink(kit.config())
    wait_until(link.available, what="a client")
    link.close()
    link.close()
    with pytest.raises(PoolUnavailable):
        link.run(lambda client: client.batch_is_exist(["k"]))
    link.register(host.as_bytes())  # a no-op, not a call into a closed client
    pool.close()


def test_a_lease_that_expires_mid_read_is_a_miss_never_its_bytes(mooncake_kit: MooncakeKit, monkeypatch: pytest.MonkeyPatch) -> None:
    """LEASE_EXPIRED cannot be forced on a real master deterministically (it
    takes a read slower than the lease), so this test makes the client report
    it for the third page of a read: that page and the rest are misses, and
    the bytes the transfer may have left in its host page are not served."""
    from radixcache.offload.mooncake.link import LEASE_EXPIRED

    kit = mooncake_kit
    pool = kit.pool()
    keys, tokens, host = _fill(kit, pool, 4)
    real_run = pool._link.run

    def run(fn: Any) -> Any:
        result = real_run(fn)
        if isinstance(result, list) and len(result) == 4 and result[0] > 1:  # the batch get
            result[2] = LEASE_EXPIRED
        return result

    monkeypatch.setattr(pool._link, "run", run)
    assert _served_exactly(kit, pool, keys, tokens, host) == 2
    assert (pool.stats().hits, pool.stats().misses, pool.stats().corrupt) == (2, 2, 0)


def test_a_short_lease_on_a_real_master_never_serves_wrong_bytes(mooncake_kit_at: KitAt) -> None:
    """A master whose leases last 1 ms: reads may outlive them (LEASE_EXPIRED)
    or not; whatever is served is exactly what was written."""
    require_mooncake()
    from radixcache.offload.mooncake import HolderProcess, MasterProcess

    master = MasterProcess(lease_ttl_ms=1, client_ttl_s=2).start()
    holder = HolderProcess(master.url, 64).start()
    kit = mooncake_kit_at(master.url)
    try:
        pool = kit.pool(batch_pages=256)
        keys, tokens, host = _fill(kit, pool, 256, seed=3)
        for _ in range(5):
            _served_exactly(kit, pool, keys, tokens, host)
        assert pool.stats().corrupt == 0
    finally:
        kit.close_all()
        holder.kill()
        master.kill()


def test_namespace_info_of_another_length_is_learnt_once(mooncake_kit: MooncakeKit) -> None:
    """A record's head grows with its namespace's info bytes, which a reader
    cannot know: the first read of such a namespace asks the size once, the
    next ones read straight into the host pages."""
    kit = mooncake_kit
    pool = kit.pool()
    keys, tokens = kit.keys(8), kit.tokens(8)
    host = kit.host(8, seed=8)
    meta = PutMeta(block_ids=list(range(8)), parent_block_id=None, first_depth=0, info=b"i" * 100)
    assert kit.done(pool.put(keys, tokens, host, np.arange(8, dtype=np.int32), b"ns", meta)) == 8
    reader = kit.pool()
    assert _served_exactly(kit, reader, keys, tokens, host) == 8
    assert reader.pool_stats().size_lookups == 1
    assert _served_exactly(kit, reader, keys, tokens, host) == 8
    assert reader.pool_stats().size_lookups == 1


def test_removals_stay_within_the_fingerprint_and_the_prefix(mooncake_kit: MooncakeKit) -> None:
    """Forget and delete never touch another model's pages or another program's keys."""
    kit = mooncake_kit
    mine = kit.pool()
    other = kit.pool(ModelFingerprint("other-model", kit.spec.describe(), 0))
    keys, tokens, host = _fill(kit, mine, 3)
    _fill(kit, other, 3)
    kit.write_object("another-program/key", b"theirs")
    assert kit.done(mine.forget_namespace(b"ns")) == 3
    assert kit.done(mine.delete(keys)) == 0  # gone with the forget
    assert other.longest_prefix(keys) == 3
    assert _served_exactly(kit, other, keys, tokens, host) == 3
    assert kit.read_object("another-program/key") == b"theirs"

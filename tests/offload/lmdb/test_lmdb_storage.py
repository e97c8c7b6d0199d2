from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from radixcache.offload import ModelFingerprint, NullStorage, Storage, StorageConfig, StorageStats

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

REPO = Path(__file__).resolve().parents[3]


def test_put_get_round_trip_is_bit_exact(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host(16, seed=1)
    raw = host.as_bytes()
    keys = kit.keys(5)
    assert kit.done(store.put(keys, kit.tokens(5), host, kit.ids(3, 7, 0, 12, 5), b"ns")) == 5
    # read back into other, scattered host pages
    dst = kit.ids(15, 1, 9, 2, 11)
    raw[dst] = 0
    assert kit.done(store.get(keys, kit.tokens(5), host, dst)) == 5
    assert np.array_equal(raw[dst], raw[[3, 7, 0, 12, 5]])
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.puts, stats.records) == (5, 0, 5, 5)
    assert stats.stored_bytes == 5 * kit.record_bytes
    store.check_integrity()


def test_longest_prefix_counts_leading_stored_keys(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(6)
    kit.done(store.put(keys[:3], kit.tokens(3), host, kit.ids(0, 1, 2), b""))
    kit.done(store.put(keys[4:5], kit.tokens(1, 4), host, kit.ids(4), b""))
    assert store.longest_prefix(keys) == 3
    assert store.longest_prefix(keys[:2]) == 2
    assert store.longest_prefix(keys[3:]) == 0
    assert store.longest_prefix(keys[4:5]) == 1
    assert store.longest_prefix([]) == 0
    with pytest.raises(ValueError, match="page keys are 1 to 256 bytes; key 1 is b''"):
        store.longest_prefix([keys[0], b""])
    with pytest.raises(ValueError, match="page keys are 1 to 256 bytes; key 0"):
        store.longest_prefix([b"x" * 257])


def test_get_stops_at_the_first_miss(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(4)
    kit.done(store.put([keys[0], keys[1], keys[3]], kit.tokens(3), host, kit.ids(0, 1, 3), b""))
    toks = np.concatenate([kit.tokens(2), kit.tokens(1, 5), kit.tokens(1, 2)])
    raw = host.as_bytes()
    before = raw[10:14].copy()
    assert kit.done(store.get(keys, toks, host, kit.ids(10, 11, 12, 13))) == 2
    assert np.array_equal(raw[10:12], raw[0:2])
    assert np.array_equal(raw[13], before[3])  # nothing read past the miss
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.corrupt) == (2, 2, 0)


def test_put_skips_keys_already_stored(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(3)
    raw = host.as_bytes()
    assert kit.done(store.put(keys[:2], kit.tokens(2), host, kit.ids(0, 1), b"")) == 2
    original = raw[0].copy()
    raw[0] ^= 0xFF  # a different page under the same key is NOT written
    assert kit.done(store.put(keys, kit.tokens(3), host, kit.ids(0, 1, 2), b"")) == 3
    stats = store.stats()
    assert (stats.puts, stats.put_skipped, stats.records) == (3, 2, 3)
    assert kit.done(store.get(keys[:1], kit.tokens(1), host, kit.ids(9))) == 1
    assert np.array_equal(raw[9], original)


def test_queued_puts_are_batched_into_one_transaction(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host(32)
    writer = store._writer
    gate, entered = threading.Event(), threading.Event()
    real = writer._commit_making_room

    def held(batch: Any) -> Any:
        entered.set()
        gate.wait(10)
        return real(batch)

    writer._commit_making_room = held  # type: ignore[method-assign]
    keys = kit.keys(20)
    first = store.put(keys[:1], kit.tokens(1), host, kit.ids(0), b"")
    assert entered.wait(10)  # the writer holds the first job's transaction
    rest = [
        store.put(keys[i : i + 1], kit.tokens(1, i), host, kit.ids(i), b"") for i in range(1, 20)
    ]
    assert not first.done()
    gate.set()
    assert kit.done(first) == 1 and [kit.done(t) for t in rest] == [1] * 19
    assert store.stats().write_txns == 2  # the first job alone, then the 19 waiting ones
    assert store.longest_prefix(keys) == 20


def test_batches_respect_the_page_limit(kit: StoreKit) -> None:
    store = kit.open(max_batch_pages=4)
    host = kit.host(32)
    keys = kit.keys(16)
    tickets = [
        store.put(keys[i : i + 2], kit.tokens(2, i), host, kit.ids(i, i + 1), b"")
        for i in range(0, 16, 2)
    ]
    assert [kit.done(t) for t in tickets] == [2] * 8
    assert store.stats().write_txns >= 4  # 16 pages, at most 4 per transaction


def test_eviction_is_least_recently_used_and_reported(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=5 * kit.record_bytes)
    host = kit.host()
    a = kit.keys(5, b"a")
    for i, key in enumerate(a):
        assert kit.done(store.put([key], kit.tokens(1, i), host, kit.ids(i), b"")) == 1
    # A hit makes a[0] the most recently used: a[1] and a[2] are now the oldest.
    assert kit.done(store.get(a[:1], kit.tokens(1, 0), host, kit.ids(10))) == 1
    b = kit.keys(2, b"b")
    assert kit.done(store.put(b, kit.tokens(2, 7), host, kit.ids(7, 8), b"")) == 2
    assert store.take_removed() == [a[1], a[2]]
    assert store.take_removed() == []  # handed over once
    assert [store.longest_prefix([k]) for k in a] == [1, 0, 0, 1, 1]
    stats = store.stats()
    assert (stats.records, stats.evicted, stats.stored_bytes) == (5, 2, 5 * kit.record_bytes)
    store.check_integrity()


def test_a_put_larger_than_the_store_keeps_its_leading_pages(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=3 * kit.record_bytes + 10)
    host = kit.host()
    keys = kit.keys(5)
    assert kit.done(store.put(keys, kit.tokens(5), host, kit.ids(0, 1, 2, 3, 4), b"")) == 3
    assert store.longest_prefix(keys) == 3
    assert store.stats().stored_bytes <= store.config.capacity_bytes
    store.check_integrity()


def test_forget_namespace_removes_only_that_namespace(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    a, b = kit.keys(3, b"a"), kit.keys(2, b"b")
    kit.done(store.put(a, kit.tokens(3), host, kit.ids(0, 1, 2), b"tenant-a"))
    kit.done(store.put(b, kit.tokens(2), host, kit.ids(3, 4), b"tenant-b"))
    assert kit.done(store.forget_namespace(b"tenant-a")) == 3
    assert sorted(store.take_removed()) == sorted(a)
    assert store.longest_prefix(a[:1]) == 0 and store.longest_prefix(b) == 2
    assert kit.done(store.forget_namespace(b"tenant-a")) == 0
    assert kit.done(store.forget_namespace(b"nobody")) == 0
    assert store.take_removed() == []
    assert store.stats().deleted == 3
    store.check_integrity()


def test_delete_reports_only_keys_that_were_stored(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(4)
    kit.done(store.put(keys[:2], kit.tokens(2), host, kit.ids(0, 1), b"ns"))
    assert kit.done(store.delete([keys[1], keys[3]])) == 1
    assert store.take_removed() == [keys[1]]
    assert store.longest_prefix(keys) == 1
    # the namespace index no longer lists the deleted record
    assert kit.done(store.forget_namespace(b"ns")) == 1
    assert store.take_removed() == [keys[0]]
    store.check_integrity()


def test_close_commits_every_queued_put(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host(64)
    keys = kit.keys(64)
    tickets = [
        store.put(keys[i : i + 4], kit.tokens(4, i), host, np.arange(i, i + 4, dtype=np.int32), b"")
        for i in range(0, 64, 4)
    ]
    store.close()
    assert all(t.done() for t in tickets)
    assert [t.result() for t in tickets] == [4] * 16
    with pytest.raises(RuntimeError, match="is closed"):
        store.longest_prefix(keys)
    store.close()  # idempotent
    again = kit.open()
    assert again.longest_prefix(keys) == 64


def test_warm_restart_keeps_pages_and_write_order(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=4 * kit.record_bytes)
    host = kit.host()
    keys = sorted(kit.keys(4), reverse=True)  # written in the reverse of LMDB's key order
    for i, key in enumerate(keys):
        kit.done(store.put([key], kit.tokens(1, i), host, kit.ids(i), b""))
    store.close()
    again = kit.open(capacity_bytes=4 * kit.record_bytes)
    again.check_integrity()
    assert again.longest_prefix(keys) == 4
    # After a restart recency is the write order: the first page written goes first.
    kit.done(again.put(kit.keys(1, b"new"), kit.tokens(1, 9), host, kit.ids(4), b""))
    assert again.take_removed() == [keys[0]]
    assert kit.done(again.get(keys[1:], kit.tokens(3, 1), host, kit.ids(9, 10, 11))) == 3
    assert np.array_equal(host.as_bytes()[9:12], host.as_bytes()[1:4])


_CHILD_READ = """
import hashlib, json, sys
import numpy as np, torch
from radixcache.offload import LmdbStorage, ModelFingerprint, StorageConfig
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec
spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float16, page_size=4)
keys = [bytes.fromhex(k) for k in json.loads(sys.argv[2])]
store = LmdbStorage(StorageConfig(path=sys.argv[1]), spec,
                    ModelFingerprint("tiny-model", spec.describe(), 0))
host = HostKVBuffer(spec, len(keys))
tokens = np.arange(len(keys) * 4, dtype=np.int32).reshape(-1, 4)
ticket = store.get(keys, tokens, host, np.arange(len(keys), dtype=np.int32))
ticket.wait(10)
print(json.dumps({"prefix": store.longest_prefix(keys), "read": ticket.result(),
                  "sha": hashlib.sha256(host.as_bytes().tobytes()).hexdigest()}))
store.close()
"""


def test_warm_restart_in_another_process(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=64 << 20)
    host = kit.host(6, seed=3)
    keys = kit.keys(6)
    kit.done(store.put(keys, kit.tokens(6), host, np.arange(6, dtype=np.int32), b""))
    store.close()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD_READ,
            str(kit.root / "store"),
            json.dumps([k.hex() for k in keys]),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "prefix": 6,
        "read": 6,
        "sha": hashlib.sha256(host.as_bytes().tobytes()).hexdigest(),
    }


def test_argument_errors_are_raised_at_once(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(2)
    with pytest.raises(ValueError, match=r"tokens must be an int array of shape \(2, 4\)"):
        store.get(keys, kit.tokens(3), host, kit.ids(0, 1))
    with pytest.raises(ValueError, match=r"host page ids must lie in \[0, 16\)"):
        store.put(keys, kit.tokens(2), host, kit.ids(0, 16), b"")
    with pytest.raises(ValueError, match="host_pages must be an int array"):
        store.put(keys, kit.tokens(2), host, kit.ids(0), b"")
    with pytest.raises(TypeError, match="namespace must be bytes"):
        store.put(keys, kit.tokens(2), host, kit.ids(0, 1), "ns")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="page keys are 1 to 256 bytes"):
        store.delete([b""])
    from radixcache.transfer.host import HostKVBuffer
    from radixcache.transfer.layout import KVSpec

    other = HostKVBuffer(KVSpec(2, 2, 16, kit.spec.dtype, 8), 2)
    with pytest.raises(ValueError, match="the page buffer has pages of"):
        store.get(keys, kit.tokens(2), other, kit.ids(0, 1))
    assert kit.done(store.get([], kit.tokens(0), host, kit.ids())) == 0
    assert store.stats().queued_writes == 0


def test_fingerprint_must_describe_the_spec(kit: StoreKit) -> None:
    with pytest.raises(ValueError, match="does not describe the KV spec"):
        kit.open(fingerprint=ModelFingerprint("m", "layers=1", 0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity_bytes": 0}, "capacity_bytes must be a positive int"),
        ({"durability": "none"}, "durability must be one of"),
        ({"num_readers": 0}, "num_readers must be a positive int"),
        ({"max_batch_pages": -1}, "max_batch_pages"),
        ({"path": ""}, "path must be a non-empty"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StorageConfig(**kwargs)


def test_default_config_and_map_size() -> None:
    config = StorageConfig(capacity_bytes=100 << 20)
    assert config.path == "./radixcache-data"
    assert config.durability == "safe"
    assert config.map_size == (200 << 20) + (64 << 20)
    assert StorageConfig(capacity_bytes=1, map_size_bytes=5).map_size == 1 << 20


@pytest.mark.parametrize("durability, metasync", [("safe", True), ("fast", False)])
def test_durability_modes_set_lmdb_flags(kit: StoreKit, durability: str, metasync: bool) -> None:
    store = kit.open(durability=durability)
    flags = store._env.flags()
    assert flags["sync"] is True and flags["metasync"] is metasync
    host = kit.host()
    keys = kit.keys(2)
    assert kit.done(store.put(keys, kit.tokens(2), host, kit.ids(0, 1), b"")) == 2
    assert kit.done(store.get(keys, kit.tokens(2), host, kit.ids(5, 6))) == 2


def test_fingerprint_digest_binds_every_field() -> None:
    base = ModelFingerprint("m", "layers=1", 0)
    digests = {
        base.digest(),
        ModelFingerprint("m2", "layers=1", 0).digest(),
        ModelFingerprint("m", "layers=2", 0).digest(),
        ModelFingerprint("m", "layers=1", 1).digest(),
    }
    assert len(digests) == 4 and all(len(d) == 8 for d in digests)
    assert base.digest() == ModelFingerprint("m", "layers=1", 0).digest()


def test_protocol_and_null_storage(kit: StoreKit) -> None:
    null = NullStorage()
    assert isinstance(null, Storage) and isinstance(kit.open(), Storage)
    host = kit.host(2)
    keys = kit.keys(1)
    assert null.longest_prefix(keys) == 0
    assert kit.done(null.put(keys, kit.tokens(1), host, kit.ids(0), b"")) == 0
    assert kit.done(null.get(keys, kit.tokens(1), host, kit.ids(0))) == 0
    assert null.take_removed() == []
    assert isinstance(null.stats(), StorageStats) and null.stats().records == 0

"""Encryption at rest on a real Valkey pool (one server and a 3-node cluster):
sealed values, tampered with in the pool, read with the wrong key, by another
tenant, after a rotation and by a new engine; a record this engine cannot
read is a miss it never deletes (the pool is shared)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixcache.offload import ValkeyConfig, ValkeyStorage, storage_config
from radixcache.offload.storage import record
from radixcache.offload.storage.crypt.keys import KeyRing
from tests.offload.conftest import PoolKit

K1, K2 = bytes(range(32)), bytes(range(100, 132))
ALICE, BOB = b"sS\0\0\0\x05alice", b"sS\0\0\0\x03bob"
KV_AT = 72 + 24 + 20 + 16 + 16  # header, key, key id + nonce, token ciphertext, meta tag


class Pool:
    """A ``PoolKit`` on an emptied server or cluster, with a raw client of it."""

    def __init__(self, kit: PoolKit, servers: Any, tmp: Path) -> None:
        self.kit = kit
        self.raw = servers.client()
        self.tmp = tmp

    def key_file(self, *keys: bytes, name: str = "rx.key") -> str:
        path = self.tmp / name
        path.write_text("".join(k.hex() + "\n" for k in keys))
        path.chmod(0o600)
        return str(path)

    def pkey(self, key: bytes) -> bytes:
        return b"rxkv:" + self.kit.fingerprint.digest() + key

    def put(self, pool: ValkeyStorage, n: int = 3, tenant: bytes | None = ALICE,
            ns: bytes = b"ns-a", salt: bytes = b"", seed: int = 5) -> tuple[list[bytes], Any]:
        kit = self.kit
        host = kit.host(8, seed=seed)
        keys = kit.keys(n, salt)
        assert kit.done(pool.put(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), ns,
                                 tenant=tenant)) == n
        return keys, host.as_bytes()[:n].copy()

    def get(self, pool: ValkeyStorage, keys: list[bytes], tenant: bytes | None = ALICE,
            ns: bytes | None = b"ns-a") -> tuple[int, Any]:
        kit = self.kit
        host = kit.host(8, seed=99)
        n = len(keys)
        got = kit.done(pool.get(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), ns,
                                tenant=tenant))
        kit.done(pool.delete([]))  # any deletion the read queued has run
        return got, host.as_bytes()[:n]


@pytest.fixture(params=["single", "cluster"])
def pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pool]:
    servers = request.getfixturevalue(
        "valkey_server" if request.param == "single" else "valkey_cluster"
    )
    servers.flush()
    kit = PoolKit(tmp_path, servers.url)
    p = Pool(kit, servers, tmp_path)
    yield p
    kit.close_all()
    p.raw.close()


def test_round_trip_and_a_new_engine_with_the_key(pool: Pool) -> None:
    kf = pool.key_file(K1)
    writer = pool.kit.pool(key_file=kf)
    keys, pages = pool.put(writer)
    got, out = pool.get(writer, keys)
    assert got == 3 and np.array_equal(out, pages)
    value = pool.raw.get(pool.pkey(keys[0]))
    assert len(value) == pool.kit.record_bytes + 52
    assert pages[0, :64].tobytes() not in value and b"alice" not in value
    reader = pool.kit.pool(key_file=kf)  # another engine (or a restart) with the key
    got, out = pool.get(reader, keys)
    assert got == 3 and np.array_equal(out, pages)
    assert (reader.stats().hits, reader.stats().decrypt_failures) == (3, 0)


@pytest.mark.parametrize("at", [24, 96 + 2, 104 + 5, 116 + 1, KV_AT + 300, -2],
                         ids=["header", "key id", "nonce", "token ciphertext", "kv", "kv tag"])
def test_a_tampered_value_is_a_miss_counted_and_kept(pool: Pool, at: int) -> None:
    store = pool.kit.pool(key_file=pool.key_file(K1))
    keys, pages = pool.put(store)
    value = bytearray(pool.raw.get(pool.pkey(keys[1])))
    value[at] ^= 0x04
    pool.raw.set(pool.pkey(keys[1]), bytes(value))
    got, out = pool.get(store, keys)
    assert got == 1 and np.array_equal(out[0], pages[0])
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.decrypt_failures, stats.corrupt) == (1, 2, 1, 0)
    assert pool.raw.exists(pool.pkey(keys[1]))  # not deleted: it may be another's
    assert store.take_removed() == []


def test_the_wrong_key_is_a_miss_never_deletes_and_never_shows(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    mine = pool.kit.pool(key_file=pool.key_file(K1))
    keys, pages = pool.put(mine)
    with caplog.at_level(logging.DEBUG):
        theirs = pool.kit.pool(key_file=pool.key_file(K2, name="theirs.key"))
        assert pool.get(theirs, keys)[0] == 0
        clear = pool.kit.pool()  # a deployment without keys on the same pool
        assert pool.get(clear, keys)[0] == 0
    assert (theirs.stats().decrypt_failures, clear.stats().decrypt_failures) == (1, 1)
    assert clear.stats().corrupt == 0
    assert all(pool.raw.exists(pool.pkey(k)) for k in keys)
    got, out = pool.get(mine, keys)  # still there for the engines that hold the key
    assert got == 3 and np.array_equal(out, pages)
    assert "leaving it (a shared store)" in caplog.text
    text = caplog.text + repr(theirs) + repr(theirs.config) + repr(theirs.codec)
    assert K1.hex() not in text and K2.hex() not in text


def test_another_tenants_record_copied_in_the_pool_is_a_miss(pool: Pool) -> None:
    store = pool.kit.pool(key_file=pool.key_file(K1))
    alice_keys, _ = pool.put(store, 2, ALICE, b"ns-a")
    bob_keys, bob_pages = pool.put(store, 2, BOB, b"ns-b", salt=b"bob", seed=8)
    got, out = pool.get(store, bob_keys, BOB, b"ns-b")
    assert got == 2 and np.array_equal(out, bob_pages)
    assert pool.get(store, bob_keys, ALICE, b"ns-b")[0] == 0
    digest = pool.kit.fingerprint.digest()
    forged = bytearray(pool.raw.get(pool.pkey(alice_keys[0])))
    forged[32:48] = record.namespace_tag(digest, b"ns-b")
    forged[72 : 72 + 24] = digest + bob_keys[0]
    pool.raw.set(pool.pkey(bob_keys[0]), bytes(forged))
    before = store.stats().decrypt_failures
    assert pool.get(store, bob_keys, BOB, b"ns-b")[0] == 0
    assert store.stats().decrypt_failures == before + 1


def test_rotation_in_the_pool(pool: Pool) -> None:
    old = pool.kit.pool(key_file=pool.key_file(K1))
    old_keys, old_pages = pool.put(old, 2)
    rotated = pool.kit.pool(key_file=pool.key_file(K2, K1, name="rotated.key"))
    got, out = pool.get(rotated, old_keys)
    assert got == 2 and np.array_equal(out, old_pages)
    new_keys, new_pages = pool.put(rotated, 2, salt=b"new", seed=7)
    assert pool.raw.get(pool.pkey(new_keys[0]))[96:104] == KeyRing([K2]).current_id
    only_new = pool.kit.pool(key_file=pool.key_file(K2, name="new.key"))
    got, out = pool.get(only_new, new_keys)
    assert got == 2 and np.array_equal(out, new_pages)
    assert pool.get(only_new, old_keys)[0] == 0
    assert only_new.stats().decrypt_failures == 1


def test_pool_urls_take_a_key_file_or_variable(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    kf = pool.key_file(K1)
    config = storage_config(f"{pool.kit.url}{'&' if '?' in pool.kit.url else '?'}key_file={kf}")
    assert isinstance(config, ValkeyConfig) and config.key_file == kf
    monkeypatch.setenv("RX_POOL_KEYS", K1.hex())
    store = pool.kit.pool(key_env="RX_POOL_KEYS")
    keys, pages = pool.put(store)
    got, out = pool.get(pool.kit.pool(key_file=kf), keys)  # the same key, from a file
    assert got == 3 and np.array_equal(out, pages)
    with pytest.raises(ValueError, match="unknown option 'key'"):
        ValkeyConfig.from_url("valkey://127.0.0.1:1/0?key=" + K1.hex())

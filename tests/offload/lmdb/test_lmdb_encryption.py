"""Encryption at rest on LMDB: sealed records through the store, tampered with
in the raw store, read with the wrong key or as another tenant, rotated,
reopened; the key never shows in logs, reprs or errors."""

from __future__ import annotations

import logging
import mmap
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb
import numpy as np
import pytest

from radixcache.offload import LmdbStorage, StorageConfig, open_backend, storage_config
from radixcache.offload.storage import record
from radixcache.offload.storage.crypt import KeyLoadError
from radixcache.offload.storage.crypt.keys import KeyRing

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

K1, K2 = bytes(range(32)), bytes(range(100, 132))
ALICE, BOB = b"sS\0\0\0\x05alice", b"sS\0\0\0\x03bob"


def key_file(tmp: Path, *keys: bytes, name: str = "rx.key") -> str:
    path = tmp / name
    path.write_text("".join(k.hex() + "\n" for k in keys))
    path.chmod(0o600)
    return str(path)


def raw_values(kit: StoreKit, name: str = "store") -> dict[bytes, bytes]:
    env = lmdb.open(str(kit.root / name), max_dbs=3, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(b"pages", create=False)) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def rewrite(kit: StoreKit, rkey: bytes, value: bytes, name: str = "store") -> None:
    """Put ``value`` under record key ``rkey`` with a raw LMDB write (store closed)."""
    env = lmdb.open(str(kit.root / name), max_dbs=3)
    try:
        with env.begin(write=True, db=env.open_db(b"pages")) as txn:
            txn.put(rkey, value)
    finally:
        env.close()


def put(kit: StoreKit, store: LmdbStorage, n: int = 3, tenant: bytes | None = ALICE,
        ns: bytes = b"ns-a", salt: bytes = b"", seed: int = 5) -> tuple[list[bytes], np.ndarray]:
    host = kit.host(8, seed=seed)
    keys = kit.keys(n, salt)
    assert kit.done(store.put(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), ns,
                              tenant=tenant)) == n
    return keys, host.as_bytes()[:n].copy()


def get(kit: StoreKit, store: LmdbStorage, keys: list[bytes], tenant: bytes | None = ALICE,
        ns: bytes | None = b"ns-a") -> tuple[int, np.ndarray]:
    host = kit.host(8, seed=99)
    n = len(keys)
    got = kit.done(store.get(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), ns,
                             tenant=tenant))
    return got, host.as_bytes()[:n]


def test_round_trip_and_restart_with_the_key(kit: StoreKit, tmp_path: Path) -> None:
    kf = key_file(tmp_path, K1)
    store = kit.open(key_file=kf)
    assert store.codec.sealed
    keys, pages = put(kit, store)
    got, out = get(kit, store, keys)
    assert got == 3 and np.array_equal(out, pages)
    store.check_integrity()
    assert all(len(v) == kit.record_bytes + 52 for v in raw_values_open(store).values())
    store.close()
    again = kit.open(key_file=kf)
    got, out = get(kit, again, keys)
    assert got == 3 and np.array_equal(out, pages)
    meta = {m.key: m for m in again.scan()}
    assert set(meta) == set(keys) and all(m.num_tokens == 4 for m in meta.values())
    tokens = again.read_tokens(keys)
    assert all(t is not None and np.array_equal(t, kit.tokens(3)[i]) for i, t in enumerate(tokens))
    stats = again.stats()
    assert (stats.hits, stats.decrypt_failures, stats.corrupt) == (3, 0, 0)


def raw_values_open(store: LmdbStorage) -> dict[bytes, bytes]:
    with store._env.begin(db=store._pages) as txn:
        return {bytes(k): bytes(v) for k, v in txn.cursor()}


def test_the_data_file_holds_no_kv_token_ids_or_salt(kit: StoreKit, tmp_path: Path) -> None:
    store = kit.open(key_file=key_file(tmp_path, K1))
    host = kit.host(8, seed=5)
    keys = kit.keys(2)
    tokens = np.array([[7001, 7002, 7003, 7004], [7005, 7006, 7007, 7008]], dtype=np.int32)
    assert kit.done(store.put(keys, tokens, host, np.arange(2, dtype=np.int32), b"ns",
                              tenant=ALICE)) == 2
    store.close()
    with open(kit.root / "store" / "data.mdb", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert data.find(host.as_bytes()[0, :64].tobytes()) < 0
        assert data.find(host.as_bytes()[1, -64:].tobytes()) < 0
        assert data.find(tokens[0].astype("<i4").tobytes()) < 0
        assert data.find(b"alice") < 0


TAMPER = {
    "header seq": 24,
    "key id": 72 + 24 + 1,
    "nonce": 72 + 24 + 10,
    "token ciphertext": 72 + 24 + 20 + 2,
    "meta tag": 72 + 24 + 20 + 16 + 3,
    "kv ciphertext": 72 + 24 + 20 + 16 + 16 + 500,
    "kv tag": -1,
}


@pytest.mark.parametrize("field", list(TAMPER))
def test_a_tampered_record_is_a_miss_counted_and_deleted(
    kit: StoreKit, tmp_path: Path, field: str
) -> None:
    kf = key_file(tmp_path, K1)
    store = kit.open(key_file=kf)
    keys, pages = put(kit, store)
    store.close()
    rkey = kit.fingerprint.digest() + keys[1]
    value = bytearray(raw_values(kit)[rkey])
    value[TAMPER[field]] ^= 0x10
    rewrite(kit, rkey, bytes(value))
    store = kit.open(key_file=kf)
    got, out = get(kit, store, keys)
    assert got == 1 and np.array_equal(out[0], pages[0])
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.decrypt_failures, stats.corrupt) == (1, 2, 1, 0)
    kit.barrier(store)
    assert store.take_removed() == [keys[1]]  # the store is this engine's own: deleted
    assert store.longest_prefix(keys) == 1
    store.check_integrity()


def test_the_wrong_key_is_a_miss_and_its_records_make_room(
    kit: StoreKit, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = kit.open(key_file=key_file(tmp_path, K1))
    keys, pages = put(kit, store)
    store.close()
    with caplog.at_level(logging.DEBUG):
        wrong = kit.open(key_file=key_file(tmp_path, K2, name="other.key"))
        got, _ = get(kit, wrong, keys)
        kit.barrier(wrong)
    assert got == 0
    assert (wrong.stats().decrypt_failures, wrong.stats().misses) == (1, 3)
    assert "unreadable (sealed under a key this store does not hold); deleting it" in caplog.text
    assert wrong.take_removed() == [keys[0]]
    # a page read once under the wrong key is gone: written again, under this key
    assert put(kit, wrong, 1, seed=6)[0] == keys[:1]
    assert get(kit, wrong, keys[:1])[0] == 1
    text = caplog.text + repr(wrong) + repr(wrong.config) + repr(wrong.codec) + str(wrong.stats())
    assert K1.hex() not in text and K2.hex() not in text


def test_another_tenants_record_copied_into_the_raw_store_is_a_miss(
    kit: StoreKit, tmp_path: Path
) -> None:
    kf = key_file(tmp_path, K1)
    store = kit.open(key_file=kf)
    alice_keys, alice_pages = put(kit, store, 2, ALICE, b"ns-a")
    bob_keys, _ = put(kit, store, 2, BOB, b"ns-b", salt=b"bob", seed=8)
    assert get(kit, store, bob_keys, BOB, b"ns-b")[0] == 2
    assert get(kit, store, bob_keys, ALICE, b"ns-b")[0] == 0  # bob's page, alice's key
    store.close()
    digest = kit.fingerprint.digest()
    values = raw_values(kit)
    # alice's record, moved under bob's key as it is: its clear key does not match
    rewrite(kit, digest + bob_keys[0], values[digest + alice_keys[0]])
    # ... and with its clear key and namespace tag rewritten to bob's: its tags fail
    forged = bytearray(values[digest + alice_keys[1]])
    forged[32:48] = record.namespace_tag(digest, b"ns-b")
    forged[72 : 72 + 24] = digest + bob_keys[1]
    rewrite(kit, digest + bob_keys[1], bytes(forged))
    store = kit.open(key_file=kf)
    assert get(kit, store, bob_keys[:1], BOB, b"ns-b")[0] == 0
    assert get(kit, store, bob_keys[1:], BOB, b"ns-b")[0] == 0
    stats = store.stats()
    assert (stats.corrupt, stats.decrypt_failures, stats.hits) == (1, 1, 0)
    got, out = get(kit, store, alice_keys, ALICE, b"ns-a")
    assert got == 2 and np.array_equal(out, alice_pages)


def test_rotation_old_key_reads_new_writes_removed_key_misses(kit: StoreKit, tmp_path: Path) -> None:
    old = kit.open(key_file=key_file(tmp_path, K1))
    old_keys, old_pages = put(kit, old, 2)
    old.close()
    rotated = kit.open(key_file=key_file(tmp_path, K2, K1, name="rotated.key"))
    got, out = get(kit, rotated, old_keys)
    assert got == 2 and np.array_equal(out, old_pages)
    new_keys, new_pages = put(kit, rotated, 2, salt=b"new", seed=7)
    rotated.close()
    values = raw_values(kit)
    key_id = {bytes(values[kit.fingerprint.digest() + k][96:104]) for k in new_keys}
    assert key_id == {KeyRing([K2]).current_id}
    assert {bytes(values[kit.fingerprint.digest() + k][96:104]) for k in old_keys} == {
        KeyRing([K1]).current_id}
    only_new = kit.open(key_file=key_file(tmp_path, K2, name="new.key"))
    got, out = get(kit, only_new, new_keys)
    assert got == 2 and np.array_equal(out, new_pages)
    assert get(kit, only_new, old_keys)[0] == 0
    assert only_new.stats().decrypt_failures == 1


def test_turning_encryption_on_or_off_never_serves_the_other_kind(
    kit: StoreKit, tmp_path: Path
) -> None:
    clear = kit.open()
    clear_keys, _ = put(kit, clear, 2, ns=b"ns-a")
    clear.close()
    sealed = kit.open(key_file=key_file(tmp_path, K1))
    assert get(kit, sealed, clear_keys)[0] == 0  # clear records are not trusted
    assert sealed.stats().decrypt_failures == 1
    sealed_keys, _ = put(kit, sealed, 2, salt=b"s", seed=3)
    sealed.close()
    clear = kit.open()
    assert get(kit, clear, sealed_keys)[0] == 0
    assert (clear.stats().decrypt_failures, clear.stats().corrupt) == (1, 0)
    # the sealed store deleted the clear record it read; scan lists clear records only
    assert {m.key for m in clear.scan()} == {clear_keys[1]}
    assert clear.read_tokens(sealed_keys[1:]) == [None]


def test_key_errors_refuse_to_open_and_never_show_the_key(
    kit: StoreKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad.key"
    secret = K1.hex()[:-2]  # 62 hex digits
    bad.write_text(secret + "\n")
    bad.chmod(0o600)
    with pytest.raises(KeyLoadError, match="62 hex digits") as err:
        kit.open(key_file=str(bad), on_open_error="recover")
    assert secret not in str(err.value) and secret not in repr(err.value)
    assert not (kit.root / "store").exists()  # nothing opened, nothing disabled quietly
    monkeypatch.setenv("RX_STORAGE_KEYS", K1.hex())
    store = kit.open(key_env="RX_STORAGE_KEYS")
    assert store.codec.sealed and K1.hex() not in repr(store.config)
    with pytest.raises(ValueError, match="not both"):
        StorageConfig(path=tmp_path, key_file="a", key_env="B")


def test_urls_name_the_key_source_and_open_backend_seals(kit: StoreKit, tmp_path: Path) -> None:
    kf = key_file(tmp_path, K1)
    config = storage_config(f"lmdb://{tmp_path}/via-url?key_file={kf}&capacity_gib=0.1")
    assert isinstance(config, StorageConfig) and config.key_file == kf
    assert storage_config(f"lmdb://{tmp_path}/x?key_env=RX_K").key_env == "RX_K"  # type: ignore[union-attr]
    opening = open_backend(config, kit.spec, kit.fingerprint)
    try:
        assert opening.storage.codec.sealed  # type: ignore[attr-defined]
    finally:
        opening.storage.close()

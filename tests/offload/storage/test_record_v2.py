"""Storage records (v3, as v2 before): a record proves it belongs to the key and namespace it is
read under; raw pages (engine keys, no token ids); event metadata for scan()."""

from __future__ import annotations

from typing import TYPE_CHECKING

import lmdb
import numpy as np
import pytest

from radixcache.offload.storage import record as rec
from radixcache.offload import PutMeta

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit


def _copy_record(store_path: str, src: bytes, dst: bytes) -> None:
    """Write the raw value stored under record key ``src`` under ``dst``
    (what a bug, an operator or a hostile tenant could do to the files)."""
    env = lmdb.open(store_path, max_dbs=3, subdir=True)
    try:
        pages = env.open_db(b"pages")
        with env.begin(write=True, db=pages) as txn:
            value = txn.get(src)
            assert value is not None
            txn.put(dst, value)
    finally:
        env.close()


def test_a_value_copied_under_another_key_is_refused(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(2)
    toks = kit.tokens(1)
    assert kit.done(store.put(keys[:1], toks, host, kit.ids(0), b"tenant-a")) == 1
    prefix = kit.fingerprint.digest()
    path = store.path
    store.close()
    _copy_record(path, prefix + keys[0], prefix + keys[1])  # same tokens, other key
    store = kit.open()
    assert store.longest_prefix(keys[1:]) == 1  # the lookup sees a record ...
    host.as_bytes()[5] = 0
    assert kit.done(store.get(keys[1:], toks, host, kit.ids(5))) == 0  # ... never served
    kit.barrier(store)
    stats = store.stats()
    assert (stats.corrupt, stats.hits) == (1, 0)
    assert store.longest_prefix(keys[1:]) == 0  # deleted as corrupt
    assert kit.done(store.get(keys[:1], toks, host, kit.ids(5))) == 1  # the original is fine


def test_a_record_read_for_another_namespace_is_refused(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(1)
    toks = kit.tokens(1)
    kit.done(store.put(keys, toks, host, kit.ids(0), b"tenant-a"))
    assert kit.done(store.get(keys, toks, host, kit.ids(1), namespace=b"tenant-b")) == 0
    kit.barrier(store)
    assert store.stats().corrupt == 1
    kit.done(store.put(keys, toks, host, kit.ids(0), b"tenant-a"))
    assert kit.done(store.get(keys, toks, host, kit.ids(1), namespace=b"tenant-a")) == 1
    assert np.array_equal(host.as_bytes()[1], host.as_bytes()[0])


def test_raw_pages_round_trip_with_long_keys_and_never_mix_with_token_pages(
    kit: StoreKit,
) -> None:
    store = kit.open()
    host = kit.host(seed=3)
    raw_keys = [b"engine-key-%03d" % i + b"\x00" * 40 for i in range(3)]  # 54-byte keys
    assert kit.done(store.put(raw_keys, None, host, kit.ids(2, 4, 6), b"")) == 3
    host.as_bytes()[[8, 9, 10]] = 0
    assert kit.done(store.get(raw_keys, None, host, kit.ids(8, 9, 10))) == 3
    assert np.array_equal(host.as_bytes()[[8, 9, 10]], host.as_bytes()[[2, 4, 6]])
    # a raw record asked for with token ids (and the reverse) is a miss
    assert kit.done(store.get(raw_keys[:1], kit.tokens(1), host, kit.ids(11))) == 0
    tk = kit.keys(1)
    kit.done(store.put(tk, kit.tokens(1), host, kit.ids(0), b""))
    assert kit.done(store.get(tk, None, host, kit.ids(11))) == 0


def test_scan_lists_event_metadata_of_this_fingerprint_only(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(3)
    meta = PutMeta(block_ids=[11, 12, 13], parent_block_id=None, first_depth=0, info=b'{"s":1}')
    kit.done(store.put(keys, kit.tokens(3), host, kit.ids(0, 1, 2), b"ns", meta))
    other = kit.keys(1, salt=b"x")
    kit.done(store.put(other, kit.tokens(1, 7), host, kit.ids(3), b"ns",
                       PutMeta(block_ids=[99], parent_block_id=13, first_depth=3)))
    found = {m.key: m for m in store.scan()}
    assert set(found) == {*keys, *other}
    assert [(found[k].block_id, found[k].parent_block_id, found[k].depth) for k in keys] == [
        (11, None, 0), (12, 11, 1), (13, 12, 2)]
    assert (found[other[0]].block_id, found[other[0]].parent_block_id, found[other[0]].depth) == (
        99, 13, 3)
    assert found[keys[1]].info == b'{"s":1}' and found[other[0]].info == b""
    path = store.path
    store.close()
    from radixcache.offload import ModelFingerprint

    foreign = kit.open(fingerprint=ModelFingerprint("another-model", kit.spec.describe(), 0))
    assert list(foreign.scan()) == []
    foreign.close()
    again = kit.open()
    assert again.path == path and {m.key for m in again.scan()} == {*keys, *other}


def test_record_functions_check_their_arguments() -> None:
    kv = np.zeros(8, dtype=np.uint8)
    toks = np.arange(4, dtype=np.int32)
    size = rec.record_size(5, 0, 4, 8)
    out = bytearray(size)
    rec.encode_into(out, key=b"kkkkk", ns_tag=b"t" * 16, tokens=toks, kv=kv, seq=1, block_id=5)
    meta = rec.read_meta(out)
    assert meta is not None and (meta.key, meta.block_id, meta.parent_block_id) == (b"kkkkk", 5, None)
    assert np.array_equal(rec.read_tokens(out), toks)
    dst = np.empty(8, dtype=np.uint8)
    assert rec.read_into(out, key=b"kkkkk", ns_tag=b"t" * 16, tokens=toks, dst=dst)
    assert not rec.read_into(out, key=b"kkkkK", ns_tag=None, tokens=toks, dst=dst)
    out[-1] ^= 1
    assert not rec.read_into(out, key=b"kkkkk", ns_tag=None, tokens=toks, dst=dst)
    with pytest.raises(ValueError, match="block ids lie in"):
        rec.encode_into(out, key=b"kkkkk", ns_tag=b"t" * 16, tokens=toks, kv=kv, seq=1,
                        block_id=2**63)
    with pytest.raises(ValueError, match="record buffer of"):
        rec.encode_into(bytearray(3), key=b"kkkkk", ns_tag=b"t" * 16, tokens=toks, kv=kv, seq=1)

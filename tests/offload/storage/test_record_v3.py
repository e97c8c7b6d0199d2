"""Record v3 (KV checksum: the 2-D sum code) is what is written; records v2
(crc32), in stores from before the upgrade, are still read and verified.

``fixtures/record_v2_*.bin`` were written by ``record.encode_into`` of the
v2 code (commit 55b5071), with the fields in ``V2_TOKENS`` / ``V2_RAW``;
``encode_v2`` below is a minimal v2 writer, checked against them byte for
byte, for v2 records of other sizes."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb
import numpy as np
import redis
import numpy.typing as npt
import pytest

from radixcache.offload.storage import record as rec
from radixcache.offload.storage.kv_checksum import ROW_BYTES

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit, StoreKit

FIXTURES = Path(__file__).parent / "fixtures"
PREFIX = bytes.fromhex("c7d7692a5c808bf7")  # the digest of conftest's fingerprint
V2_TOKENS: dict[str, Any] = {
    "file": "record_v2_tokens.bin",
    "namespace": b"tenant-a",
    "tokens": np.arange(100, 104, dtype=np.int32),
    "kv_seed": 2026,
    "seq": 41,
    "block_id": 123456789,
    "parent_block_id": 987,
    "depth": 3,
    "info": b"lora-7",
}
V2_RAW: dict[str, Any] = {
    "file": "record_v2_raw.bin",
    "page_key": b"engine-key-v2-" + b"\x07" * 40,
    "namespace": b"",
    "tokens": None,
    "kv_seed": 2027,
    "seq": 42,
    "block_id": None,
    "parent_block_id": None,
    "depth": 0,
    "info": b"",
}
KV_BYTES = 1024  # conftest's SPEC.page_bytes


def _kv(fields: dict[str, Any]) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(fields["kv_seed"]).integers(0, 256, KV_BYTES, dtype=np.uint8)


def _page_key(kit: StoreKit, fields: dict[str, Any]) -> bytes:
    return fields["page_key"] if "page_key" in fields else kit.keys(1, salt=b"v2")[0]


def encode_v2(
    *, key: bytes, ns_tag: bytes, tokens: npt.NDArray[np.int32] | None, kv: npt.NDArray[np.uint8],
    seq: int, block_id: int | None = None, parent_block_id: int | None = None, depth: int = 0,
    info: bytes = b"",
) -> bytes:
    """A record v2: the v3 layout with version 2 and crc32(bytes 12 .. end)."""
    t = 0 if tokens is None else tokens.size
    toks = b"" if tokens is None else tokens.astype("<i4").tobytes()
    head = rec.HEADER.pack(
        rec.MAGIC, 2, rec.FLAG_RAW if tokens is None else 0, 0, t, kv.size, seq, ns_tag,
        -1 if block_id is None else block_id, -1 if parent_block_id is None else parent_block_id,
        depth, len(key), len(info),
    )  # fmt: skip
    value = bytearray(head + key + info + toks + kv.tobytes())
    struct.pack_into("<I", value, 8, zlib.crc32(memoryview(value)[12:]))
    return bytes(value)


def _v2_value(kit: StoreKit, fields: dict[str, Any]) -> tuple[bytes, bytes]:
    """(record key, v2 value built by ``encode_v2``) of a fixture's fields."""
    key = PREFIX + _page_key(kit, fields)
    value = encode_v2(
        key=key, ns_tag=rec.namespace_tag(PREFIX, fields["namespace"]), tokens=fields["tokens"],
        kv=_kv(fields), seq=fields["seq"], block_id=fields["block_id"],
        parent_block_id=fields["parent_block_id"], depth=fields["depth"], info=fields["info"],
    )  # fmt: skip
    return key, value


def test_the_fingerprint_prefix_is_the_one_the_fixtures_were_written_under(kit: StoreKit) -> None:
    assert kit.fingerprint.digest() == PREFIX


@pytest.mark.parametrize("fields", [V2_TOKENS, V2_RAW], ids=["tokens", "raw"])
def test_the_v2_writer_here_reproduces_the_v2_codes_records(
    kit: StoreKit, fields: dict[str, Any]
) -> None:
    key, value = _v2_value(kit, fields)
    assert value == (FIXTURES / fields["file"]).read_bytes()


@pytest.mark.parametrize("fields", [V2_TOKENS, V2_RAW], ids=["tokens", "raw"])
def test_v2_records_are_read_verified_and_described(kit: StoreKit, fields: dict[str, Any]) -> None:
    value = (FIXTURES / fields["file"]).read_bytes()
    key = PREFIX + _page_key(kit, fields)
    tag = rec.namespace_tag(PREFIX, fields["namespace"])
    kv, toks = _kv(fields), fields["tokens"]
    dst = np.zeros(KV_BYTES, dtype=np.uint8)
    assert rec.read_into(value, key=key, ns_tag=tag, tokens=toks, dst=dst)
    assert np.array_equal(dst, kv)
    head = value[: len(value) - KV_BYTES]
    assert rec.verify_parts(head, kv, key=key, ns_tag=tag, tokens=toks)
    meta = rec.read_meta(value)
    assert meta is not None
    assert (meta.key, meta.seq, meta.block_id, meta.parent_block_id, meta.depth, meta.info) == (
        key, fields["seq"], fields["block_id"], fields["parent_block_id"], fields["depth"],
        fields["info"])  # fmt: skip
    for at in (12, 60, len(value) - KV_BYTES + 5, len(value) - 1):  # count, ids, KV bytes
        bad = bytearray(value)
        bad[at] ^= 0x10
        assert not rec.read_into(bytes(bad), key=key, ns_tag=tag, tokens=toks, dst=dst), at
    bad_kv = kv.copy()
    bad_kv[700] ^= 1
    assert not rec.verify_parts(head, bad_kv, key=key, ns_tag=tag, tokens=toks)


def test_records_are_written_as_v3_and_a_head_plus_its_page_is_the_record() -> None:
    kv = np.random.default_rng(1).integers(0, 256, 3 * ROW_BYTES + 77, dtype=np.uint8)
    toks = np.arange(16, dtype=np.int32)
    args: dict[str, Any] = dict(key=b"k" * 24, ns_tag=b"t" * 16, tokens=toks, seq=9, block_id=3,
                                parent_block_id=2, depth=1, info=b"i")  # fmt: skip
    whole = bytearray(rec.record_size(24, 1, 16, kv.size))
    rec.encode_into(whole, kv=kv, **args)
    head = bytearray(rec.head_size(24, 1, 16))
    rec.encode_head(head, kv=kv, **args)
    assert bytes(head) + kv.tobytes() == bytes(whole)
    assert struct.unpack_from("<4sH", whole) == (b"RXKV", 3)
    v2 = encode_v2(kv=kv, **args)
    assert v2[12:] == bytes(whole)[12:] and v2[8:12] != bytes(whole)[8:12]  # only the checksum
    dst = np.empty(kv.size, dtype=np.uint8)
    check: dict[str, Any] = dict(key=b"k" * 24, ns_tag=b"t" * 16, tokens=toks)
    assert rec.read_into(bytes(whole), dst=dst, **check) and np.array_equal(dst, kv)
    assert rec.read_into(v2, dst=dst, **check)
    assert rec.verify_parts(bytes(head), kv, **check)


def test_a_v3_record_cut_short_fails_even_with_its_lengths_rewritten() -> None:
    kv = np.random.default_rng(2).integers(0, 256, 4 * ROW_BYTES, dtype=np.uint8)
    toks = np.arange(4, dtype=np.int32)
    value = bytearray(rec.record_size(8, 0, 4, kv.size))
    rec.encode_into(value, key=b"kkkkkkkk", ns_tag=b"t" * 16, tokens=toks, kv=kv, seq=0)
    check: dict[str, Any] = dict(key=b"kkkkkkkk", ns_tag=None, tokens=toks)
    assert not rec.read_into(bytes(value[:-1]), dst=np.empty(kv.size, np.uint8), **check)
    assert not rec.read_into(bytes(value[:-1]), dst=np.empty(kv.size - 1, np.uint8), **check)
    short = value[:-ROW_BYTES]
    struct.pack_into("<Q", short, 16, kv.size - ROW_BYTES)  # a consistent-looking shorter record
    assert not rec.read_into(bytes(short), dst=np.empty(kv.size - ROW_BYTES, np.uint8), **check)
    zeroed = bytearray(value)
    zeroed[-ROW_BYTES:] = bytes(ROW_BYTES)
    assert not rec.read_into(bytes(zeroed), dst=np.empty(kv.size, np.uint8), **check)


def _put_raw_values(path: str, values: dict[bytes, bytes]) -> None:
    """Write record values into a store's ``pages`` database as a v2 process
    left them (the namespace index and recency are rebuilt at open)."""
    env = lmdb.open(path, max_dbs=3, subdir=True, writemap=True)
    try:
        pages = env.open_db(b"pages")
        ns = env.open_db(b"ns", dupsort=True)
        with env.begin(write=True) as txn:
            for key, value in values.items():
                txn.put(key, value, db=pages)
                txn.put(value[32:48], key, db=ns)
    finally:
        env.close()


def test_a_store_written_by_v2_serves_its_pages_after_the_upgrade(kit: StoreKit) -> None:
    store = kit.open()
    path = store.path
    store.close()
    tkey = _page_key(kit, V2_TOKENS)
    rkey = _page_key(kit, V2_RAW)
    bad_key = kit.keys(1, salt=b"bad")[0]
    bad = bytearray(_v2_value(kit, V2_TOKENS)[1])
    bad[-3] ^= 4  # a v2 record whose KV bytes rotted
    _put_raw_values(path, {
        PREFIX + tkey: (FIXTURES / V2_TOKENS["file"]).read_bytes(),
        PREFIX + rkey: (FIXTURES / V2_RAW["file"]).read_bytes(),
        PREFIX + bad_key: bytes(bad),
    })  # fmt: skip
    store = kit.open()
    host = kit.host(8, seed=1)
    assert store.longest_prefix([tkey, rkey, bad_key]) == 3
    got = kit.done(store.get([tkey], V2_TOKENS["tokens"][None], host, kit.ids(0), b"tenant-a"))
    assert got == 1 and np.array_equal(host.as_bytes()[0], _kv(V2_TOKENS))
    assert kit.done(store.get([rkey], None, host, kit.ids(1))) == 1
    assert np.array_equal(host.as_bytes()[1], _kv(V2_RAW))
    assert kit.done(store.get([bad_key], V2_TOKENS["tokens"][None], host, kit.ids(2))) == 0
    kit.barrier(store)
    assert store.stats().corrupt == 1 and store.longest_prefix([bad_key]) == 0
    metas = {m.key: m for m in store.scan()}
    assert metas[tkey].block_id == V2_TOKENS["block_id"] and metas[rkey].raw
    # new pages go in as v3 beside them; forget_namespace finds the v2 page
    new = kit.keys(2, salt=b"new")
    assert kit.done(store.put(new, kit.tokens(2), host, kit.ids(3, 4), b"tenant-a")) == 2
    assert kit.done(store.get(new, kit.tokens(2), host, kit.ids(5, 6), b"tenant-a")) == 2
    assert kit.done(store.forget_namespace(b"tenant-a")) == 3
    assert store.longest_prefix([tkey]) == 0 and store.longest_prefix([rkey]) == 1
    store.check_integrity()


def test_a_pool_holding_v2_records_serves_them(pool_kit: PoolKit) -> None:
    """On one server (KV bytes received into the host page, verified there)
    and on a cluster (copied from the replies)."""
    pool = pool_kit.pool()
    config = pool_kit.config()
    client: Any = (
        redis.cluster.RedisCluster(host=config.host, port=config.port)
        if config.cluster
        else redis.Redis(host=config.host, port=config.port, db=config.db)
    )
    prefix = pool_kit.config().key_prefix + PREFIX
    tkey = _page_key(pool_kit, V2_TOKENS)
    rkey = _page_key(pool_kit, V2_RAW)
    bad_key = pool_kit.keys(1, salt=b"bad")[0]
    bad = bytearray(_v2_value(pool_kit, V2_TOKENS)[1])
    bad[-3] ^= 4
    client.set(prefix + tkey, (FIXTURES / V2_TOKENS["file"]).read_bytes())
    client.set(prefix + rkey, (FIXTURES / V2_RAW["file"]).read_bytes())
    client.set(prefix + bad_key, bytes(bad))
    host = pool_kit.host(8, seed=1)
    toks = V2_TOKENS["tokens"][None]
    got = pool_kit.done(pool.get([tkey], toks, host, pool_kit.ids(0), b"tenant-a"))
    assert got == 1 and np.array_equal(host.as_bytes()[0], _kv(V2_TOKENS))
    assert pool_kit.done(pool.get([rkey], None, host, pool_kit.ids(1))) == 1
    assert np.array_equal(host.as_bytes()[1], _kv(V2_RAW))
    assert pool_kit.done(pool.get([bad_key], toks, host, pool_kit.ids(2))) == 0
    pool_kit.done(pool.delete([]))  # after the queued deletion of the corrupt record
    assert pool.stats().corrupt == 1 and client.exists(prefix + bad_key) == 0

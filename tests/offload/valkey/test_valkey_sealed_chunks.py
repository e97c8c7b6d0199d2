"""Sealed records inside values of several pages (``chunk_pages`` with
``key_file``): each record of a chunk is sealed and verified on its own, the
chunk framing stays in the clear. Real servers: the session's single server
and its 3-node cluster; the chunk cutting itself without a server."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from radixcache.offload import ModelFingerprint
from radixcache.offload.storage import chunk, record
from radixcache.offload.storage.crypt.codec import SEAL_BYTES
from radixcache.offload.storage.crypt.keys import KeyRing
from radixcache.offload.storage.crypt.sealed import SealedRecords
from radixcache.offload.valkey.layout import Cuts
from tests.offload.conftest import SPEC

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit

N = 4  # pages per value on average
K1, K2 = bytes(range(32)), bytes(range(100, 132))
ALICE, BOB = b"sS\0\0\0\x05alice", b"sS\0\0\0\x03bob"


def _key_file(tmp: Path, key: bytes, name: str = "rx.key") -> str:
    path = tmp / name
    path.write_text(key.hex() + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def servers(pool_kit: PoolKit, request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(
        "valkey_server" if "single" in request.node.callspec.id else "valkey_cluster"
    )


def _multi(pool: Any, keys: list[bytes]) -> tuple[int, int]:
    """(start, end) of the first value of two pages or more that does not start the put."""
    runs = Cuts(N).runs(pool.record_keys(keys), raw=False)
    return next((s, e) for s, e in runs if e - s >= 2 and s > 0)


def test_a_chunk_of_sealed_records_is_cut_by_their_own_lengths() -> None:
    """``split_value`` / ``record_span`` on sealed records: every record of
    a chunk found whole, its head being all but its last KV-size bytes."""
    fp = ModelFingerprint("tiny-model", SPEC.describe(), 0)
    codec = SealedRecords(KeyRing([K1]), fp).framing(ALICE)
    rng = np.random.default_rng(1)
    pages = rng.integers(0, 256, (3, SPEC.page_bytes), dtype=np.uint8)
    tag = record.namespace_tag(fp.digest(), b"ns")
    recs = []
    for i in range(3):
        key = fp.digest() + bytes([i]) * 16
        tokens = np.arange(4 * i, 4 * i + 4, dtype=np.int32)
        head, body = codec.encode_parts(key=key, ns_tag=tag, tokens=tokens, kv=pages[i], seq=i)
        recs.append((key, tokens, bytes(head) + bytes(body)))
    value = chunk.chunk_head(3) + b"".join(r for _k, _t, r in recs)
    parts = chunk.split_value(value)
    assert [bytes(p) for p in parts] == [r for _k, _t, r in recs]
    for (key, tokens, rec_bytes), i in zip(recs, range(3)):
        span = chunk.record_span(rec_bytes[: record.HEADER.size])
        assert span == (len(rec_bytes) - SPEC.page_bytes, SPEC.page_bytes)
        assert span[0] == record.head_size(len(key), 0, 4) + SEAL_BYTES
        dst = np.frombuffer(rec_bytes[span[0] :], dtype=np.uint8).copy()  # as a reader receives it
        assert codec.verify_parts(rec_bytes[: span[0]], dst, key=key, ns_tag=tag, tokens=tokens)
        assert np.array_equal(dst, pages[i])


def test_sealed_records_round_trip_in_values_of_several_pages(
    pool_kit: PoolKit, servers: Any, tmp_path: Path
) -> None:
    kf = _key_file(tmp_path, K1)
    pool = pool_kit.pool(chunk_pages=N, key_file=kf)
    n = 40
    keys, tokens, host = pool_kit.keys(n), pool_kit.tokens(n), pool_kit.host(n, seed=1)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(pool.put(keys, tokens, host, ids, b"ns", tenant=ALICE)) == n
    start, end = _multi(pool, keys)
    with servers.client() as c:
        value = c.get(pool.pool_keys([keys[end - 1]])[0])
    assert chunk.value_count(value[: chunk.PREFIX_BYTES]) == end - start  # the framing in the clear
    parts = chunk.split_value(value)
    assert len(parts) == end - start
    for part in parts:  # each record sealed on its own, of a sealed record's size
        flags = record.parse_header(part)[2]  # type: ignore[index]
        assert flags & record.FLAG_SEALED and len(part) == pool_kit.record_bytes + SEAL_BYTES
    assert host.as_bytes()[start, :64].tobytes() not in value
    assert pool.longest_prefix(keys) == n
    dst = pool_kit.host(n, seed=2)
    assert pool_kit.done(pool.get(keys, tokens, dst, ids[::-1].copy(), b"ns", tenant=ALICE)) == n
    assert np.array_equal(dst.as_bytes()[::-1], host.as_bytes())
    # another engine with the key, reading from inside a value
    other = pool_kit.pool(chunk_pages=N, key_file=kf)
    dst = pool_kit.host(n, seed=3)
    got = pool_kit.done(other.get(keys[5:], tokens[5:], dst, ids[5:], b"ns", tenant=ALICE))
    assert got == n - 5 and np.array_equal(dst.as_bytes()[5:], host.as_bytes()[5:])
    assert (other.stats().hits, other.stats().decrypt_failures) == (n - 5, 0)
    # another tenant, another key, no key: a miss each, counted, nothing deleted
    assert pool_kit.done(other.get(keys, tokens, pool_kit.host(n), ids, b"ns", tenant=BOB)) == 0
    wrong = pool_kit.pool(chunk_pages=N, key_file=_key_file(tmp_path, K2, "k2.key"))
    clear = pool_kit.pool(chunk_pages=N)
    for reader in (wrong, clear):
        assert pool_kit.done(reader.get(keys, tokens, pool_kit.host(n), ids, b"ns", tenant=ALICE)) == 0
        pool_kit.done(reader.delete([]))
        assert (reader.stats().decrypt_failures, reader.stats().corrupt) == (1, 0)
    assert other.stats().decrypt_failures == 1
    assert pool.longest_prefix(keys) == n  # every value still there


def test_a_tampered_sealed_record_inside_a_value_is_a_miss_kept(
    pool_kit: PoolKit, servers: Any, tmp_path: Path
) -> None:
    pool = pool_kit.pool(chunk_pages=N, key_file=_key_file(tmp_path, K1))
    n = 24
    keys, tokens, host = pool_kit.keys(n, b"dmg"), pool_kit.tokens(n), pool_kit.host(n, seed=4)
    ids = np.arange(n, dtype=np.int32)
    assert pool_kit.done(pool.put(keys, tokens, host, ids, b"ns", tenant=ALICE)) == n
    start, end = _multi(pool, keys)
    target = start + 1  # the second record of a value of several pages
    vkey = pool.pool_keys([keys[end - 1]])[0]
    sealed = pool_kit.record_bytes + SEAL_BYTES
    with servers.client() as c:  # routes by key on a cluster
        damaged = bytearray(c.get(vkey))
        damaged[chunk.PREFIX_BYTES + sealed + sealed - 40] ^= 1  # a KV ciphertext byte of it
        c.set(vkey, bytes(damaged))
    dst = pool_kit.host(n, seed=5)
    assert pool_kit.done(pool.get(keys, tokens, dst, ids, b"ns", tenant=ALICE)) == target
    assert np.array_equal(dst.as_bytes()[:target], host.as_bytes()[:target])
    pool_kit.done(pool.delete([]))
    stats = pool.stats()
    assert (stats.decrypt_failures, stats.corrupt) == (1, 0)
    with servers.client() as c:
        assert c.get(vkey) == bytes(damaged)  # kept: in a shared pool it may be another's
    assert pool.take_removed() == []

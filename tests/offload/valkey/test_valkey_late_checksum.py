"""Clear records go to the pool summed late: the writer builds each record's
head with its KV checksum still to take (``record.late_head``), and the
connection takes it right before it sends the host page itself
(``LateChecksum.finish``, from ``PageConnection.send_packed_command``), so the
page is read from memory once. What lands in the pool is byte for byte the
record ``encode_into`` writes, whichever way redis-py sends the command."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis

from radixcache.offload.storage import record
from radixcache.offload.storage.kv_checksum import LateChecksum
from radixcache.offload.valkey.nodes import PageConnection, Scattered
from tests.offload.valkey.valkey_servers import ValkeyServer

TOKENS = np.arange(16, dtype=np.int32)


def _fields(kv: np.ndarray) -> dict[str, Any]:
    return dict(key=b"k" * 48, ns_tag=b"n" * 16, tokens=TOKENS, kv=kv, seq=5, block_id=7,
                parent_block_id=3, depth=2, info=b"")  # fmt: skip


def _kv(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _whole(fields: dict[str, Any]) -> bytes:
    out = bytearray(record.record_size(len(fields["key"]), 0, TOKENS.size, fields["kv"].size))
    record.encode_into(out, **fields)
    return bytes(out)


@pytest.mark.parametrize("kv_bytes", [100, 4096, 5 * 4096 + 8, 65536])
def test_a_late_head_finishes_as_the_head_encode_head_writes(kv_bytes: int) -> None:
    fields = _fields(_kv(kv_bytes, kv_bytes))
    expect = bytearray(record.head_size(48, 0, TOKENS.size))
    record.encode_head(expect, **fields)
    late = record.late_head(**fields)
    assert len(late) == len(expect)
    assert bytes(late.buf[8:12]) == bytes(4)  # the checksum field: not taken yet
    assert bytes(late.buf[:8]) + bytes(late.buf[12:]) == bytes(expect[:8]) + bytes(expect[12:])
    prefixed = late.after(b"CHUNKHD!")
    assert late.finish() is late.buf
    assert bytes(late.buf) == bytes(expect)
    assert bytes(late.finish()) == bytes(expect)  # taken once; the same bytes after
    assert bytes(prefixed.finish()) == b"CHUNKHD!" + bytes(expect)
    assert bytes(late.buf) + fields["kv"].tobytes() == _whole(fields)
    with pytest.raises(RuntimeError, match="already written"):
        late.after(b"too late")


def test_a_late_head_needs_a_buffer_of_its_own() -> None:
    fields = _fields(_kv(4096))
    view = memoryview(bytearray(record.head_size(48, 0, TOKENS.size)))
    with pytest.raises(TypeError, match="bytearray"):
        record.encode_head(view, late=True, **fields)
    assert not any(view)  # refused before a byte was written


def test_a_late_head_sums_the_page_as_it_is_when_finished() -> None:
    """The contract the writer keeps: the page must not change until sent.
    Finishing after a change sums the changed page (so the test can fail)."""
    kv = _kv(8192, 1)
    fields = _fields(kv)
    late = record.late_head(**fields)
    kv[0] ^= 0xFF
    assert bytes(late.finish()) + kv.tobytes() == _whole(_fields(kv))


@pytest.fixture
def client(valkey_server: ValkeyServer) -> Any:
    valkey_server.flush()
    pool = redis.ConnectionPool(
        connection_class=PageConnection, host="127.0.0.1", port=valkey_server.port,
        password=valkey_server.password,
    )  # fmt: skip
    c = redis.Redis(connection_pool=pool)
    yield c
    c.close()


def test_packing_keeps_a_late_head_apart_and_sending_finishes_it(client: Any) -> None:
    kv = _kv(3 * 4096 + 5, 2)
    fields = _fields(kv)
    late = record.late_head(**fields)
    conn = client.connection_pool.get_connection()
    try:
        packed = conn.pack_commands(
            [("SET", b"small", b"x"), ("SET", b"rec", Scattered(late, kv.data)), ("GET", b"small")]
        )
        assert sum(part is late for part in packed) == 1  # its own buffer, not joined
        assert all(isinstance(p, (bytes, memoryview, LateChecksum)) for p in packed)
        assert bytes(late.buf[8:12]) == bytes(4)  # packing takes no checksum
        conn.send_packed_command(packed)
        replies = [conn.read_response() for _ in range(3)]
    finally:
        client.connection_pool.release(conn)
    assert replies == [b"OK", b"OK", b"x"]  # (raw replies: no response callbacks here)
    assert client.get(b"rec") == _whole(fields)


@pytest.mark.parametrize("how", ["pipeline", "command"])
def test_a_late_head_lands_as_the_whole_record(client: Any, how: str) -> None:
    records = {}
    if how == "pipeline":
        pipe = client.pipeline(transaction=False)
    for i, n in enumerate([100, 4096, 2 * 4096 + 8]):
        kv = _kv(n, 10 + i)
        fields = _fields(kv)
        value = Scattered(record.late_head(**fields), kv.data)
        records[b"r%d" % i] = (_whole(fields), kv)
        if how == "pipeline":
            pipe.set(b"r%d" % i, value)
        else:
            assert client.set(b"r%d" % i, value)
    if how == "pipeline":
        assert pipe.execute() == [True] * 3
    for name, (whole, kv) in records.items():
        got = client.get(name)
        assert got == whole
        dst = np.zeros(kv.size, np.uint8)
        assert record.read_into(got, key=b"k" * 48, ns_tag=b"n" * 16, tokens=TOKENS, dst=dst)
        assert dst.tobytes() == kv.tobytes()

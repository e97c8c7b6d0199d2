"""The wire format, read back by plain zmq + msgpack (not our codec), the way
a vLLM, SGLang or Dynamo consumer reads it."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq
from tests.events.events_testkit import BS, PROBE_HASH, MakePublisher, replay, stored, sync_raw

from radixcache.events import AllBlocksCleared, BlockRemoved, BlockStored

STORED_KEYS = [
    "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    "cache_salt", "extra_keys",
]
REQUIRED = {  # every key without a default in vLLM's and SGLang's decoders
    "BlockStored": set(STORED_KEYS[:8]),
    "BlockRemoved": {"type", "block_hashes", "medium"},
    "AllBlocksCleared": {"type"},
}


def check_payload(data: bytes) -> list[dict[str, Any]]:
    """Assert the payload's shape with plain msgpack; return its events."""
    raw = msgpack.unpackb(data, raw=False)
    assert isinstance(raw, list) and len(raw) == 3, "payload must be an array of exactly 3"
    ts, events, dp_rank = raw
    assert isinstance(ts, float)
    assert dp_rank is None or isinstance(dp_rank, int)
    assert isinstance(events, list) and events, "a batch is never empty"
    for event in events:
        assert isinstance(event, dict)
        keys = list(event)
        assert keys[0] == "type", f"first key is {keys[0]!r}"
        assert REQUIRED[event["type"]] <= set(keys), f"missing keys in {keys}"
        for h in event.get("block_hashes", []):
            assert type(h) is int and 0 <= h < 1 << 63
        if event["type"] == "BlockStored":
            assert keys == [k for k in STORED_KEYS if k in keys], "keys out of wire order"
            assert all(type(t) is int for t in event["token_ids"])
            assert len(event["token_ids"]) == len(event["block_hashes"]) * event["block_size"]
        if event["type"] == "BlockRemoved":
            assert event["medium"] in ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")
    return events


def test_live_frames_follow_the_wire_format(make_publisher: MakePublisher, zctx: zmq.Context[Any]) -> None:
    pub = make_publisher(topic="kv", dp_rank=3)
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    seq0 = sync_raw(pub, sub)
    pub.publish([
        stored([11, 12], list(range(2 * BS)), parent=10, lora_id=7, lora_name="ad"),
        BlockRemoved([11], "GPU"),
    ])
    pub.publish([AllBlocksCleared()])
    pub.publish([])  # never on the wire, takes no sequence number
    pub.publish([stored([13], [1, 2, 3, 4], medium="DISK")])
    frames = [sub.recv_multipart() for _ in range(3)]
    for i, msg in enumerate(frames, start=1):
        assert len(msg) == 3, "three frames: topic, seq, payload"
        topic, seq, data = msg
        assert topic == b"kv"
        assert len(seq) == 8
        assert int.from_bytes(seq, "big", signed=True) == seq0 + i
        assert msgpack.unpackb(data)[2] == 3  # dp_rank
    events = [check_payload(msg[2]) for msg in frames]
    assert events[0][0] == {
        "type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": 10,
        "token_ids": list(range(2 * BS)), "block_size": BS, "lora_id": 7, "medium": "GPU", "lora_name": "ad",
    }
    assert events[0][1] == {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}
    assert events[1] == [{"type": "AllBlocksCleared"}]
    assert events[2][0]["parent_block_hash"] is None and events[2][0]["lora_id"] is None
    assert events[2][0]["medium"] == "DISK"
    assert not sub.poll(50), "publish([]) must not put anything on the wire"


def test_replay_answers_in_the_wire_format(make_publisher: MakePublisher, zctx: zmq.Context[Any]) -> None:
    pub = make_publisher(topic="t")
    for i in range(4):
        pub.publish([BlockRemoved([100 + i], "GPU")])
    answer = replay(zctx, pub.replay_endpoint or "", 0)
    # batches 0..4 (batch 0 is the publisher's [AllBlocksCleared]), then the end marker
    assert len(answer) == 6
    for seq, msg in enumerate(answer[:-1], start=pub.first_seq):
        assert len(msg) == 4 and msg[0] == b"" and msg[1] == b"t"
        assert int.from_bytes(msg[2], "big", signed=True) == seq
        check_payload(msg[3])
    assert msgpack.unpackb(answer[0][3])[1] == [{"type": "AllBlocksCleared"}], "restart fence first"
    assert msgpack.unpackb(answer[4][3])[1][0]["block_hashes"] == [103]
    assert answer[-1] == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]

    f = pub.first_seq
    tail = replay(zctx, pub.replay_endpoint or "", f + 3)
    assert [int.from_bytes(m[2], "big", signed=True) for m in tail] == [f + 3, f + 4, -1]
    assert replay(zctx, pub.replay_endpoint or "", f + 99) == [[b"", b"", (-1).to_bytes(8, "big", signed=True), b""]]
    assert pub.stats().replay_requests == 3


def test_first_batch_is_the_restart_fence(make_publisher: MakePublisher, zctx: zmq.Context[Any]) -> None:
    pub = make_publisher()
    answer = replay(zctx, pub.replay_endpoint or "", 0)
    assert len(answer) == 2
    assert int.from_bytes(answer[0][2], "big", signed=True) == pub.first_seq
    assert check_payload(answer[0][3]) == [{"type": "AllBlocksCleared"}]
    assert pub.stats().published == 1


def test_probe_hash_is_legal_on_the_wire(make_publisher: MakePublisher, zctx: zmq.Context[Any]) -> None:
    pub = make_publisher()
    pub.publish([BlockRemoved([PROBE_HASH], "CPU_PINNED"), BlockStored([0], None, [0] * BS, BS, medium=None)])
    answer = replay(zctx, pub.replay_endpoint or "", pub.first_seq + 1)
    events = check_payload(answer[0][3])
    assert events[0]["block_hashes"] == [PROBE_HASH] and events[0]["medium"] == "CPU_PINNED"
    assert events[1]["medium"] == "GPU", "an unnamed medium goes out as GPU"


def test_back_to_back_full_replays_on_one_socket_arrive_whole(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    # ZMQ credits a pipe back in batches; answers sized like the whole buffer
    # must not push the next answer over the socket's high-water mark.
    pub = make_publisher(replay_buffer_size=8)
    for i in range(20):
        pub.publish([BlockRemoved([i], "GPU")])
    dealer = zctx.socket(zmq.DEALER)
    dealer.connect(pub.replay_endpoint or "")
    for _ in range(6):
        dealer.send_multipart([b"", (0).to_bytes(8, "big", signed=True)])
        seqs: list[int] = []
        while True:
            assert dealer.poll(3000), f"answer cut short after {seqs}"
            seq = int.from_bytes(dealer.recv_multipart()[2], "big", signed=True)
            if seq == -1:
                break
            seqs.append(seq)
        assert seqs == list(range(pub.first_seq + 13, pub.first_seq + 21))

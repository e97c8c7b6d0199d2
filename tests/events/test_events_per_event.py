"""One event that cannot be encoded costs only itself, never its batch.

Issue 21 (4): a ``BlockStored`` whose ``lora_id`` is beyond msgpack's range
(``2**64``) passes ``publish``'s record checks (it is an int) but cannot be
encoded; the publisher used to drop the whole batch with it, so the other
tenants' stores of that step never reached routers, live or on replay. Now
it is dropped alone and counted; the rest goes out, live and on replay, and
decodes with vLLM's and SGLang's own structs."""

from __future__ import annotations

from typing import Any

import zmq
from tests.events.events_testkit import BS, MakePublisher, replay, stored, sync_raw, wait_until
from tests.events.peer_structs import SGLANG, VLLM

from radixcache.events import BlockRemoved, BlockStored, decode_batch


def _batch() -> list[Any]:
    return [
        stored([11], list(range(BS)), lora_id=3),
        stored([12], list(range(BS, 2 * BS)), lora_id=2**64),  # cannot be encoded
        BlockRemoved([13], "GPU"),
        stored([14], list(range(2 * BS, 3 * BS)), lora_id=None),
    ]


def test_an_unencodable_event_is_dropped_alone_live_and_on_replay(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    pub = make_publisher()
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    sync_raw(pub, sub)
    pub.publish(_batch())
    seq = pub.next_seq - 1
    while True:  # a probe may come again first: the newest batch is resent to a joining subscriber
        assert sub.poll(3000), "the batch never went out live"
        topic, frame, payload = sub.recv_multipart()
        got = int.from_bytes(frame, "big", signed=True)
        if got != seq:
            assert got < seq, (got, seq)
            continue
        break
    for payload_bytes in (payload, replay(zctx, pub.replay_endpoint or "", seq)[0][3]):
        batch = decode_batch(payload_bytes)
        hashes = [e.block_hashes[0] for e in batch.events]  # type: ignore[union-attr]
        assert hashes == [11, 13, 14], "only the unencodable event is missing"
        assert [e.block_hashes for e in VLLM.decode(payload_bytes).events] == [[11], [13], [14]]
        assert [e.block_hashes for e in SGLANG.decode(payload_bytes).events] == [[11], [13], [14]]
    assert wait_until(lambda: pub.stats().encode_errors == 1)


def test_a_batch_of_only_unencodable_events_is_a_counted_gap(make_publisher: MakePublisher) -> None:
    pub = make_publisher()
    bad = BlockStored([5], None, list(range(BS)), BS, 2**64, "GPU", None)
    pub.publish([bad, bad])
    pub.publish([BlockRemoved([6], "GPU")])
    assert wait_until(lambda: (s := pub.stats()).sent == 2 and s.encode_errors == 2)

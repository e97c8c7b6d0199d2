"""An idle restart reaches every consumer: also one that asks for replay only
on a gap in the live sequence (tests/events/gap_consumer.py models Dynamo
1.6.1's indexer), without the engine publishing anything new.

A restarted publisher's first batches go out before any subscriber has
reconnected; when a subscriber joins, the publisher sends its newest batch
again (events/resync.py), whose number shows the gap.
"""

from __future__ import annotations

import time
from typing import Any

import zmq
from tests.events.events_testkit import (
    BS,
    PROBE_HASH,
    MakePublisher,
    replay,
    stored,
    sync,
    wait_until,
    worker_of,
)
from tests.events.gap_consumer import GapConsumer

from radixcache.events import (
    BlockRemoved,
    EventSubscriber,
    IndexConfig,
    KvIndex,
    SubscriberConfig,
    ZmqEventPublisher,
)


def _follow(pub: ZmqEventPublisher, consumer: GapConsumer) -> None:
    """Probe until ``consumer`` receives ``pub`` live, then let it apply all it has."""
    deadline = time.monotonic() + 5.0
    while consumer.live == 0:
        assert time.monotonic() < deadline, "the consumer never connected"
        pub.publish([BlockRemoved([PROBE_HASH], "GPU")])
        consumer.poll(20)
    assert consumer.run_until(lambda: consumer.last == pub.next_seq - 1, 5.0)


def test_an_idle_restart_reaches_a_gap_driven_consumer_within_a_second(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    first = make_publisher()
    index = KvIndex(IndexConfig(block_size=BS))
    consumer = GapConsumer(zctx, index, "w0", first.endpoint, first.replay_endpoint)
    try:
        _follow(first, consumer)
        for h in range(1, 30):
            first.publish([stored([h], [h] * BS)])
        first.publish([stored([900], [9] * BS, medium="DISK")])
        assert consumer.run_until(lambda: consumer.last == first.next_seq - 1, 5.0)
        assert index.resident("w0", "GPU") == set(range(1, 30))
        first.close()
        consumer.poll(50)  # the connection drops
        # The new incarnation: its AllBlocksCleared and what its storage holds,
        # published before the consumer is back, then nothing more.
        second = make_publisher(endpoint=first.endpoint, replay_endpoint=first.replay_endpoint)
        second.publish([stored([900], [9] * BS, medium="DISK")])
        published = second.next_seq
        started = time.monotonic()
        resynced = consumer.run_until(
            lambda: not index.resident("w0", "GPU") and index.resident("w0", "DISK") == {900}, 3.0
        )
        elapsed = time.monotonic() - started
        assert resynced, (consumer.last, consumer.gaps, second.stats())
        assert elapsed < 1.0, elapsed
        assert second.next_seq == published  # nothing new was published to get there
        assert consumer.gaps == 1 and consumer.recovered >= 1  # the AllBlocksCleared, from replay
        assert second.stats().resent >= 1
    finally:
        consumer.close()


def test_a_subscriber_joining_an_idle_publisher_receives_its_newest_batch(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    pub = make_publisher()
    for h in (1, 2, 3):
        pub.publish([stored([h], [h] * BS)])
    newest = pub.next_seq - 1
    assert wait_until(lambda: pub.stats().sent == pub.stats().published)  # idle: all went out live
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    assert sub.poll(5_000), "nothing arrived"
    topic, seq, payload = sub.recv_multipart()
    assert (topic, int.from_bytes(seq, "big", signed=True)) == (b"", newest)
    (again,) = [m for m in replay(zctx, pub.replay_endpoint, newest) if m[2] == seq]
    assert again[3] == payload  # byte for byte the batch it was
    assert pub.next_seq == newest + 1 and pub.stats().resent >= 1
    sub.close(0)


def test_consumers_in_step_take_the_repeat_as_a_duplicate(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    pub = make_publisher()
    ours_index = KvIndex(IndexConfig(block_size=BS))
    ours = EventSubscriber(ours_index, [worker_of(pub)], SubscriberConfig(replay_timeout_ms=1_000))
    gap_index = KvIndex(IndexConfig(block_size=BS))
    gap = GapConsumer(zctx, gap_index, "w0", pub.endpoint, pub.replay_endpoint)
    late = zctx.socket(zmq.SUB)
    try:
        sync(pub, ours)
        _follow(pub, gap)
        for h in range(10, 20):
            pub.publish([stored([h], [h] * BS)])
        sync(pub, ours)
        assert gap.run_until(lambda: gap.last == pub.next_seq - 1, 5.0)
        before_ours, before_gap = ours.stats(), (gap.gaps, gap.duplicates)
        state = ours_index.resident("w0", "GPU")
        resent = pub.stats().resent
        late.setsockopt(zmq.SUBSCRIBE, b"")
        late.connect(pub.endpoint)  # joins: the newest batch goes to everyone again
        assert wait_until(lambda: pub.stats().resent > resent)
        assert gap.run_until(lambda: gap.duplicates > before_gap[1], 5.0)
        assert ours.run_until(lambda: ours.stats().duplicates > before_ours.duplicates, 5.0)
        after = ours.stats()
        assert (after.restarts, after.gaps, after.unrepaired) == (
            before_ours.restarts, before_ours.gaps, before_ours.unrepaired)
        assert gap.gaps == before_gap[0]
        assert ours_index.resident("w0", "GPU") == gap_index.resident("w0", "GPU") == state
    finally:
        late.close(0)
        gap.close()
        ours.close()

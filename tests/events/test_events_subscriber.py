"""EventSubscriber over real loopback sockets: repair, restarts, bad input."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

import msgpack
import pytest
import zmq
from tests.events.events_testkit import (
    applied_upto,
    BS,
    PROBE_HASH,
    MakePublisher,
    holdings,
    random_batches,
    reference,
    stored,
    sync,
    wait_until,
    worker_of,
)

from radixcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    EventSubscriber,
    KvEvent,
    KvIndex,
    SubscriberStats,
    TierOverlap,
    WorkerEndpoint,
    encode_batch,
)
from radixcache.events.types import EventBatch

MakeSubscriber = Callable[..., EventSubscriber]


def publish_all(pub: Any, batches: Sequence[Sequence[KvEvent]]) -> None:
    for batch in batches:
        pub.publish(batch)


def delta(sub: EventSubscriber, before: SubscriberStats) -> SubscriberStats:
    """Counters since ``before`` (the join itself may count as a repaired gap)."""
    now = sub.stats()
    return SubscriberStats(*(getattr(now, f.name) - getattr(before, f.name) for f in fields(now)))


def caught_up(sub: EventSubscriber, pub: Any, worker: str = "w0") -> Callable[[], bool]:
    return lambda: applied_upto(sub, worker) >= pub.next_seq


def test_live_stream_builds_the_published_state(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    pub = make_publisher()
    sub = make_subscriber(worker_of(pub))
    sync(pub, sub)
    before = sub.stats()
    batches = random_batches(seed=1, count=120)
    publish_all(pub, batches)
    assert sub.run_until(caught_up(sub, pub), 10)
    assert holdings(index, "w0") == reference(batches)
    index.check_integrity()
    stats = delta(sub, before)
    assert stats.applied == stats.received == len(batches)
    assert stats.malformed == stats.gaps == stats.rejected == 0


def test_forced_drops_are_repaired_by_replay(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    pub = make_publisher()
    sub = make_subscriber(worker_of(pub))
    sync(pub, sub)
    before = sub.stats()
    batches = random_batches(seed=2, count=60)
    publish_all(pub, batches[:20])
    pub.simulate_full_queue(15)  # 20..34 never go out live
    publish_all(pub, batches[20:])
    assert pub.stats().dropped == 15
    assert sub.run_until(caught_up(sub, pub), 10)
    assert holdings(index, "w0") == reference(batches)
    index.check_integrity()
    stats = delta(sub, before)
    assert stats.gaps == 1 and stats.repaired == 1 and stats.unrepaired == 0
    assert stats.replayed >= 15


def test_late_subscriber_starts_from_the_replay_buffer(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    pub = make_publisher()
    batches = random_batches(seed=3, count=40)
    publish_all(pub, batches)  # nobody listens yet
    assert wait_until(lambda: pub.stats().sent == pub.stats().published)  # ... and they are gone
    sub = make_subscriber(worker_of(pub))
    sync(pub, sub)  # the first live batch: replay fills everything before it
    assert holdings(index, "w0") == reference(batches)
    assert sub.stats().replayed >= len(batches) + 1 and sub.stats().unrepaired == 0


def test_unrepairable_gap_drops_the_state_and_resyncs(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    pub = make_publisher(replay_buffer_size=8)
    sub = make_subscriber(worker_of(pub))
    sync(pub, sub)
    old = stored([1, 2], list(range(2 * BS)))
    pub.publish([old])
    assert sub.run_until(caught_up(sub, pub), 5)
    assert index.resident("w0", "GPU") == {1, 2}
    before = sub.stats()
    pub.simulate_full_queue(20)  # more than the replay buffer holds
    for h in range(100, 120):
        pub.publish([stored([h], [h] * BS)])
    pub.publish([stored([500], [5] * BS)])  # live: reveals the gap
    assert sub.run_until(caught_up(sub, pub), 5)
    stats = delta(sub, before)
    assert stats.unrepaired == 1 and stats.repaired == 0, stats
    # The old blocks are gone; what follows the hole (the replay buffer's
    # contiguous tail, 7 batches, and the live one) is applied.
    assert index.resident("w0", "GPU") == set(range(113, 120)) | {500}, stats
    index.check_integrity()


def test_gap_without_replay_resumes_from_the_live_batch(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    pub = make_publisher(replay_endpoint=None)
    sub = make_subscriber(worker_of(pub))
    sync(pub, sub)
    before = sub.stats()
    pub.publish([stored([1], [1] * BS)])
    pub.simulate_full_queue(1)
    pub.publish([BlockRemoved([1], "GPU")])  # lost: the index would hold a stale block
    pub.publish([stored([2], [2] * BS)])
    assert sub.run_until(caught_up(sub, pub), 5)
    assert index.resident("w0", "GPU") == {2}, "state dropped rather than kept stale"
    assert delta(sub, before).unrepaired == 1


def test_publisher_restart_drops_the_old_state(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    first = make_publisher()
    spec = worker_of(first)
    sub = make_subscriber(spec)
    sync(first, sub)
    publish_all(first, [[stored([h], [h] * BS)] for h in range(1, 40)])
    assert sub.run_until(caught_up(sub, first), 5)
    assert len(index.resident("w0", "GPU")) == 39
    first.close()

    second = make_publisher(endpoint=spec.endpoint, replay_endpoint=spec.replay_endpoint)
    sync(second, sub)
    second.publish([stored([900], [9] * BS)])
    assert sub.run_until(caught_up(sub, second), 5)
    assert index.resident("w0", "GPU") == {900}
    assert sub.stats().restarts == 1
    index.check_integrity()


def raw_pub(zctx: zmq.Context[Any]) -> tuple[zmq.Socket[bytes], str]:
    """An XPUB socket: it hears subscriptions, so the test knows when to send."""
    sock = zctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    return sock, sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def good(*events: KvEvent) -> bytes:
    return encode_batch(EventBatch(1.0, list(events)))


def test_malformed_messages_are_counted_and_skipped(
    zctx: zmq.Context[Any], make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    sock, endpoint = raw_pub(zctx)
    sub = make_subscriber(WorkerEndpoint("w0", endpoint))
    while not sock.poll(10):  # the subscription message: the SUB is connected
        sub.poll(10)
    sock.recv()
    store = good(stored([1, 2], list(range(2 * BS))))
    messages: list[list[bytes]] = [
        [b"", frame(0), good(AllBlocksCleared())],
        [b"", frame(1), store],
        [b"", frame(2)],  # two frames
        [b"", b"\x00\x01", store],  # short sequence frame
        [b"", frame(-4), store],  # negative sequence number
        [b"", frame(2), b"\xc1"],  # not msgpack
        [b"", frame(3), store[:-3]],  # truncated
        [b"", frame(4), msgpack.packb([1.0, [{"type": "BlockMoved"}], None])],  # unknown type
        [b"", frame(5), msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [-1], "medium": "GPU"}], None])],
        [b"", frame(6), msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": ["x"], "medium": "GPU"}], None])],
        [b"", frame(7), msgpack.packb([1.0, [], None, 4])],  # wrong shape
        [b"", frame(8), msgpack.packb([1.0, [{"block_hashes": [1], "type": "BlockRemoved"}], None])],
        [b"", frame(9), msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1]}], None])],  # no medium
        [b"other", frame(10), store],  # another topic
        [b"", frame(10), good(stored([3], [7] * BS, parent=2))],
    ]
    for msg in messages:
        sock.send_multipart(msg)
    assert sub.run_until(lambda: sub.next_seq("w0") == 11, 5)
    stats = sub.stats()
    assert stats.received == len(messages)
    assert stats.malformed == 12
    assert stats.applied == 3
    assert stats.gaps == stats.restarts == 0
    assert index.resident("w0", "GPU") == {1, 2, 3}
    assert index.overlap(list(range(2 * BS)) + [7] * BS)["w0"].gpu == 3


def test_background_thread_mode(make_publisher: MakePublisher, index: KvIndex) -> None:
    pub = make_publisher()
    with EventSubscriber(index, [worker_of(pub)]) as sub:
        sub.start()
        with pytest.raises(RuntimeError, match="background thread"):
            sub.poll(0)
        batches = random_batches(seed=4, count=30)
        publish_all(pub, batches)
        # Batches sent before the connection is up are missed; the first one
        # seen is a gap that replay repairs. Probes make sure one is seen.
        def done() -> bool:
            with sub.lock:
                return holdings(index, "w0") == reference(batches)

        for _ in range(250):
            if done():
                break
            pub.publish([BlockRemoved([PROBE_HASH], "GPU")])
            time.sleep(0.02)
        assert done()
    assert sub.stats().malformed == 0


def test_several_workers_are_kept_apart(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    pubs = [make_publisher() for _ in range(3)]
    sub = make_subscriber(*(worker_of(p, f"w{i}") for i, p in enumerate(pubs)))
    batches = [random_batches(seed=10 + i, count=25) for i in range(3)]
    for i, p in enumerate(pubs):
        sync(p, sub, f"w{i}")
        publish_all(p, batches[i])
    assert sub.run_until(lambda: all(applied_upto(sub, f"w{i}") >= p.next_seq for i, p in enumerate(pubs)), 10)
    for i in range(3):
        assert holdings(index, f"w{i}") == reference(batches[i])
    sub.remove_worker("w1")
    assert holdings(index, "w1") == reference([])
    index.check_integrity()


def test_router_picks_the_worker_that_holds_the_prompt(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    prompt = list(range(1000, 1000 + 6 * BS))
    on_gpu, on_host = make_publisher(), make_publisher()
    sub = make_subscriber(worker_of(on_gpu, "a"), worker_of(on_host, "b"))
    sync(on_gpu, sub, "a")
    sync(on_host, sub, "b")
    # "a" computed the prompt and keeps 4 of its 6 blocks on the GPU;
    # "b" computed it, then offloaded all 6 blocks to host memory.
    on_gpu.publish([stored(list(range(1, 7)), prompt)])
    on_gpu.publish([BlockRemoved([5, 6], "GPU")])
    on_host.publish([stored(list(range(71, 77)), prompt)])
    on_host.publish([stored(list(range(71, 77)), prompt, medium="CPU_PINNED"), BlockRemoved(list(range(71, 77)), "GPU")])
    assert sub.run_until(lambda: applied_upto(sub, "a") >= on_gpu.next_seq
                         and applied_upto(sub, "b") >= on_host.next_seq, 5)
    decision = index.choose(prompt + [1, 2], {"a": 0.0, "b": 0.0, "c": 0.0})
    assert decision.overlaps == {"a": TierOverlap(4, 4, 4), "b": TierOverlap(0, 6, 6), "c": TierOverlap(0, 0, 0)}
    # a: 6 - 4 = 2.0; b: 6 - 0.75 * 6 = 1.5; c: 6.0
    assert decision.worker == "b" and decision.costs == {"a": 2.0, "b": 1.5, "c": 6.0}
    assert index.choose(prompt, {"a": 0.0, "b": 1.0}).worker == "a"


def test_restart_that_overtakes_the_old_sequence_is_still_caught(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    # The old incarnation stops at a small sequence number; the new one gets
    # past it before the subscriber reconnects, so numbers never go back.
    first = make_publisher()
    spec = worker_of(first)
    sub = make_subscriber(spec)
    sync(first, sub)
    first.publish([stored([1], [1] * BS)])
    assert sub.run_until(caught_up(sub, first), 5)
    old_last = first.next_seq - 1
    first.close()
    second = make_publisher(endpoint=spec.endpoint, replay_endpoint=spec.replay_endpoint)
    assert second.first_seq > old_last, "sequence numbers never go back across a restart"
    batches = [[stored([900 + i], [i] * BS)] for i in range(30)]
    publish_all(second, batches)
    sync(second, sub)
    assert index.resident("w0", "GPU") == {900 + i for i in range(30)}
    assert sub.stats().restarts == 1


def test_idle_restart_is_seen_within_a_second(
    make_publisher: MakePublisher, make_subscriber: MakeSubscriber, index: KvIndex
) -> None:
    # The new incarnation publishes nothing after its AllBlocksCleared (which
    # no subscriber can receive live: it is sent before anyone reconnects).
    first = make_publisher()
    spec = worker_of(first)
    sub = make_subscriber(spec)
    sync(first, sub)
    publish_all(first, [[stored([h], [h] * BS, medium="DISK")] for h in range(1, 30)])
    assert sub.run_until(caught_up(sub, first), 5)
    assert len(index.resident("w0", "DISK")) == 29
    first.close()
    sub.poll(50)  # the subscriber sees the connection drop
    second = make_publisher(endpoint=spec.endpoint, replay_endpoint=spec.replay_endpoint)
    started = time.monotonic()
    assert sub.run_until(lambda: not index.resident("w0", "DISK"), 3.0)
    assert time.monotonic() - started < 1.0
    assert applied_upto(sub, "w0") == second.next_seq  # its AllBlocksCleared, from replay
    assert second.first_seq > first.next_seq
    index.check_integrity()

"""ZmqEventPublisher: binding, sequence numbers, drops, flushing, shutdown."""

from __future__ import annotations

import time
from typing import Any

import pytest
import zmq
from tests.events.events_testkit import BS, MakePublisher, replay, stored, sync_raw, wait_until

from radixcache.events import (
    BindError,
    BlockRemoved,
    NullEventPublisher,
    PublisherConfig,
    PublisherStats,
    ZmqEventPublisher,
)


def seqs(answer: list[list[bytes]]) -> list[int]:
    return [int.from_bytes(m[2], "big", signed=True) for m in answer[:-1]]


def test_endpoint_in_use_is_a_clear_error(zctx: zmq.Context[Any]) -> None:
    squatter = zctx.socket(zmq.PUB)
    squatter.bind("tcp://127.0.0.1:*")
    taken = squatter.getsockopt(zmq.LAST_ENDPOINT).decode()
    with pytest.raises(BindError) as err:
        ZmqEventPublisher(PublisherConfig(endpoint=taken, replay_endpoint=None))
    assert taken in str(err.value) and "in use" in str(err.value)
    with pytest.raises(BindError, match=taken.replace(".", r"\.")):
        ZmqEventPublisher(PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint=taken))


def test_a_second_publisher_on_the_same_endpoint_fails(make_publisher: MakePublisher) -> None:
    first = make_publisher()
    with pytest.raises(BindError, match="cannot bind event endpoint"):
        make_publisher(endpoint=first.endpoint)
    first.publish([BlockRemoved([1], "GPU")])  # the first one is unharmed
    assert wait_until(lambda: first.stats().sent == 2)


def test_defaults_are_loopback_and_validated() -> None:
    cfg = PublisherConfig()
    assert cfg.endpoint == "tcp://127.0.0.1:5557"
    assert cfg.replay_endpoint == "tcp://127.0.0.1:5558"
    assert cfg.replay_buffer_size == 10_000 and cfg.topic == ""
    with pytest.raises(ValueError, match="queue_size"):
        PublisherConfig(queue_size=0)
    with pytest.raises(ValueError, match="must differ"):
        PublisherConfig(endpoint="tcp://127.0.0.1:6000", replay_endpoint="tcp://127.0.0.1:6000")
    with pytest.raises(ValueError, match="dp_rank"):
        PublisherConfig(dp_rank=-1)


def test_sequence_numbers_and_empty_batches(make_publisher: MakePublisher, zctx: zmq.Context[Any]) -> None:
    pub = make_publisher()
    pub.publish([])
    pub.publish([BlockRemoved([1], "GPU")])
    pub.publish([])
    pub.publish([BlockRemoved([2], "GPU")])
    assert pub.stats().published == 3  # the fence, then two
    f = pub.first_seq
    assert seqs(replay(zctx, pub.replay_endpoint or "", 0)) == [f, f + 1, f + 2]


def test_bad_records_are_refused_before_taking_a_number(make_publisher: MakePublisher) -> None:
    pub = make_publisher()
    with pytest.raises(ValueError, match=r"event 1 .*\[0, 2\*\*63\)"):
        pub.publish([BlockRemoved([1], "GPU"), BlockRemoved([-5], "GPU")])
    with pytest.raises(ValueError, match="expected 1 blocks"):
        pub.publish([stored([1], [1, 2])])
    assert pub.stats().published == 1


def test_forced_drops_are_counted_and_stay_replayable(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    pub = make_publisher()
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    last = sync_raw(pub, sub)
    pub.simulate_full_queue(3)
    for h in range(5):
        pub.publish([BlockRemoved([h], "GPU")])
    stats = pub.stats()
    assert (pub.next_seq - last - 1, stats.dropped) == (5, 3)
    live = []
    while sub.poll(300):
        live.append(int.from_bytes(sub.recv_multipart()[1], "big", signed=True))
    assert live == [last + 4, last + 5], "only the two batches after the drops go out live"
    assert seqs(replay(zctx, pub.replay_endpoint or "", last + 1)) == list(range(last + 1, last + 6))
    assert pub.stats().sent == stats.published - 3


def test_full_queue_drops_without_blocking_and_counts_right(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    pub = make_publisher(queue_size=1, replay_buffer_size=4_000)
    n = 3_000
    t0 = time.monotonic()
    for h in range(n):
        pub.publish([BlockRemoved([h], "GPU")])
    assert time.monotonic() - t0 < 10, "publish() must not wait for the thread"
    assert wait_until(lambda: (s := pub.stats()).sent + s.dropped == s.published)
    stats = pub.stats()
    assert stats.published == n + 1
    assert stats.sent + stats.dropped == n + 1
    assert stats.dropped > 0, "a one-batch queue cannot keep up with a tight loop"
    assert stats.encode_errors == 0
    # Dropped or not, every batch is replayable.
    assert seqs(replay(zctx, pub.replay_endpoint or "", 0)) == list(range(pub.first_seq, pub.first_seq + n + 1))


def test_slow_subscriber_never_blocks_the_publisher(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    pub = make_publisher(send_hwm=2, replay_endpoint=None)
    stuck = zctx.socket(zmq.SUB)  # connects and never reads
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.connect(pub.endpoint)
    big = [stored(list(range(i * 64, i * 64 + 64)), list(range(64 * BS))) for i in range(4)]
    t0 = time.monotonic()
    for _ in range(2_000):
        pub.publish(big)
    assert time.monotonic() - t0 < 10
    # The thread is not stuck behind the full peer: it keeps handing batches to ZMQ.
    assert wait_until(lambda: (s := pub.stats()).sent + s.dropped == s.published, 10)
    t0 = time.monotonic()
    pub.close()
    assert time.monotonic() - t0 < 0.2 + 5, "close waits for the linger at most"


def test_close_flushes_what_is_queued(make_publisher: MakePublisher, zctx: zmq.Context[Any]) -> None:
    pub = make_publisher(close_linger_ms=2_000)
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    last = sync_raw(pub, sub)
    for h in range(200):
        pub.publish([BlockRemoved([h], "GPU")])
    pub.close()
    got = []
    while sub.poll(500):
        got.append(int.from_bytes(sub.recv_multipart()[1], "big", signed=True))
    assert got == list(range(last + 1, last + 201))
    assert pub.stats().sent == pub.stats().published
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish([BlockRemoved([1], "GPU")])
    pub.close()  # idempotent


def test_endpoint_is_free_again_after_close(make_publisher: MakePublisher) -> None:
    pub = make_publisher()
    endpoint, replay_endpoint = pub.endpoint, pub.replay_endpoint
    pub.close()
    again = make_publisher(endpoint=endpoint, replay_endpoint=replay_endpoint)
    assert again.endpoint == endpoint


def test_null_publisher_does_nothing() -> None:
    null = NullEventPublisher()
    null.publish([BlockRemoved([1], "GPU")])
    assert null.stats() == PublisherStats(0, 0, 0, 0, 0, 0)
    null.close()


def test_sequence_base_is_clock_derived_and_persisted(make_publisher: MakePublisher, tmp_path: Any) -> None:
    before = time.time_ns() // 1000
    pub = make_publisher()
    assert before <= pub.first_seq <= time.time_ns() // 1000
    # With a sequence file, a clock set back cannot make numbers go backwards.
    path = tmp_path / "seq"
    first = make_publisher(seq_base=10**15, seq_file=str(path))
    for h in range(3):
        first.publish([BlockRemoved([h], "GPU")])
    last = first.next_seq - 1
    first.close()
    second = make_publisher(seq_base=5, seq_file=str(path))  # "the clock went back"
    assert second.first_seq > last
    path.write_text("garbage")
    with pytest.raises(ValueError, match="not an integer"):
        make_publisher(seq_file=str(path))


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _live_delays(pub: ZmqEventPublisher, sub: zmq.Socket[bytes], seconds: float, tick: Any) -> list[float]:
    """Publish a small live batch every 2 ms for ``seconds``; per batch, the
    time from publish() to its arrival on ``sub``. ``tick()`` runs every round."""
    sent: dict[int, float] = {}
    delays: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick()
        seq = pub.next_seq
        sent[seq] = time.monotonic()
        pub.publish([BlockRemoved([seq % 1000], "GPU")])
        deadline = time.monotonic() + 0.002
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if not sub.poll(max(left, 0)):
                break
            got = int.from_bytes(sub.recv_multipart()[1], "big", signed=True)
            delays.append(time.monotonic() - sent.pop(got))
            if time.monotonic() >= deadline:
                break
    while sent and sub.poll(1000):  # the tail
        got = int.from_bytes(sub.recv_multipart()[1], "big", signed=True)
        delays.append(time.monotonic() - sent.pop(got))
    assert not sent, f"{len(sent)} live batches never arrived"
    return delays


def test_flooding_replay_clients_delay_the_live_stream_by_a_bounded_amount(
    make_publisher: MakePublisher, zctx: zmq.Context[Any]
) -> None:
    rate = 4 << 20
    pub = make_publisher(
        replay_bytes_per_s=rate, replay_slice_bytes=64 << 10, replay_hwm=64, replay_clients=4, queue_size=4_096,
    )
    big = stored(list(range(64)), list(range(64 * BS)))
    for _ in range(3_000):  # a full replay answer is ~4 MB
        pub.publish([big])
    assert wait_until(lambda: pub.stats().sent == pub.stats().published, 10)
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    sync_raw(pub, sub)
    quiet = _live_delays(pub, sub, 0.5, lambda: None)
    # Eight clients ask for the whole buffer every ~10 ms and never read.
    flooders = []
    for _ in range(8):
        d = zctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(pub.replay_endpoint or "")
        flooders.append(d)
    rounds = [0]

    def flood() -> None:
        rounds[0] += 1
        if rounds[0] % 5 == 0:
            for d in flooders:
                d.send_multipart([b"", (0).to_bytes(8, "big", signed=True)], zmq.NOBLOCK)

    rss0 = _rss_bytes()
    before = pub.stats()
    t0 = time.monotonic()
    flooded = _live_delays(pub, sub, 2.0, flood)
    elapsed = time.monotonic() - t0
    after = pub.stats()
    grown = _rss_bytes() - rss0
    quiet.sort()
    flooded.sort()
    p95 = flooded[int(0.95 * len(flooded))]
    print(  # shown with -s: the figures behind the bound
        f"live delay quiet p50/p95/max {quiet[len(quiet) // 2] * 1e3:.2f}/{quiet[int(0.95 * len(quiet))] * 1e3:.2f}/"
        f"{quiet[-1] * 1e3:.2f} ms; flooded {flooded[len(flooded) // 2] * 1e3:.2f}/{p95 * 1e3:.2f}/"
        f"{flooded[-1] * 1e3:.2f} ms; replay {(after.replay_bytes - before.replay_bytes) / elapsed / 1e6:.2f} MB/s "
        f"for {after.replay_requests - before.replay_requests} requests; RSS +{grown / 1e6:.1f} MB"
    )
    # The bound: a live batch waits at most one replay slice (64 KiB, well
    # under a millisecond to hand to ZMQ) plus the usual scheduling noise of
    # this shared machine; without pacing it waited for whole answers (MBs).
    assert p95 < quiet[int(0.95 * len(quiet))] + 0.05, (p95, quiet[-1])
    assert flooded[-1] < 0.5
    assert after.replay_requests - before.replay_requests >= 8
    assert after.replay_bytes - before.replay_bytes <= rate * elapsed + (64 << 10) + (64 << 10)
    assert after.replays_dropped > 0  # superseded requests and clients beyond the limit
    assert grown < 64 << 20, f"the publisher grew by {grown >> 20} MB under the flood"

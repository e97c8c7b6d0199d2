"""Frame sends that keep the GIL (events.gil_send): same frames on the wire."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pytest
import zmq

from radixcache.events.gil_send import frame_sender, keeps_gil


def test_frames_arrive_unchanged_and_the_gil_is_kept_on_linux(zctx: zmq.Context[Any]) -> None:
    pub = zctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.getsockopt_string(zmq.LAST_ENDPOINT))
    send = frame_sender(pub)
    if sys.platform == "linux":  # pyzmq's libzmq is found in /proc/self/maps
        assert keeps_gil() and send != pub.send
    frames = [b"topic", (7).to_bytes(8, "big"), bytes(range(256)) * 300]
    deadline = time.monotonic() + 10
    while not sub.poll(20):  # a PUB drops what it sends before the SUB is connected
        assert time.monotonic() < deadline, "the SUB never connected"
        send(b"probe", 0)
    while sub.poll(20):
        sub.recv_multipart()
    send(frames[0], zmq.SNDMORE)
    send(frames[1], zmq.SNDMORE)
    send(frames[2], 0)
    assert sub.recv_multipart() == frames
    pub.close(0)
    sub.close(0)


def _burst_seconds(send: Any) -> float:
    """How long a thread takes for 300 sends while this one spins in Python
    (both on one core, as in an engine process pinned to a core)."""
    done: list[float] = []

    def sender() -> None:
        t0 = time.perf_counter()
        for _ in range(300):
            send(b"x" * 1000, 0)
        done.append(time.perf_counter() - t0)

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        thread = threading.Thread(target=sender)
        thread.start()
        while not done:  # the owner thread: busy in Python, never waits
            pass
        thread.join()
    finally:
        os.sched_setaffinity(0, cores)
    return done[0]


def test_a_busy_owner_thread_does_not_slow_the_sends_down(zctx: zmq.Context[Any]) -> None:
    """pyzmq's send hands the GIL to the spinning thread on every frame and
    waits to get it back; the GIL-keeping send does not."""
    if not keeps_gil():
        pytest.skip("this platform sends through pyzmq (the GIL is released)")
    pub = zctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind("tcp://127.0.0.1:*")
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.getsockopt_string(zmq.LAST_ENDPOINT))
    time.sleep(0.1)
    keeping = min(_burst_seconds(frame_sender(pub)) for _ in range(3))
    releasing = min(_burst_seconds(pub.send) for _ in range(3))
    assert keeping * 4 < releasing, f"300 sends: {keeping:.4f} s keeping the GIL, {releasing:.4f} s through pyzmq"
    pub.close(0)
    sub.close(0)


def test_only_pub_sockets(zctx: zmq.Context[Any]) -> None:
    dealer = zctx.socket(zmq.DEALER)
    with pytest.raises(ValueError, match="PUB"):
        frame_sender(dealer)
    dealer.close(0)

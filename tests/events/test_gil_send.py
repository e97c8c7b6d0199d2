"""Frame sends that keep the GIL (events.gil_send): same frames on the wire.
How much faster they go beside a busy owner thread is a benchmark figure
(``radixcache bench events``: ``busy_owner_sends``), not a test."""

from __future__ import annotations

import sys
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


def test_only_pub_sockets(zctx: zmq.Context[Any]) -> None:
    dealer = zctx.socket(zmq.DEALER)
    with pytest.raises(ValueError, match="PUB"):
        frame_sender(dealer)
    dealer.close(0)

"""Replay of buffered batches on the publisher's ROUTER socket.

A client (DEALER) sends ``[b"", start_seq]``; it is answered with every
buffered batch numbered ``start_seq`` or more, as
``[identity, b"", topic, seq, payload]``, and an end marker
``[identity, b"", b"", seq=-1, b""]``. ``ReplayService`` runs on the
publisher thread, which owns the socket; the buffer itself belongs to the
publisher and is read through ``window``.

Under abuse: each client identity has at most one replay in flight (a new
request replaces its previous one); at most ``replay_clients`` run at once
(the oldest is dropped beyond); answers go out in slices of at most
``replay_slice_bytes`` between two looks at the live queue, paced by a token
bucket of ``replay_bytes_per_s``. A client whose pipe is full
(``ROUTER_MANDATORY`` refuses, ``replay_hwm``) pauses, and is dropped after
``replay_stall_s``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import zmq

from radixcache.events.publisher import END_OF_REPLAY, PublisherConfig, seq_frame
from radixcache.events.types import KvEvent

logger = logging.getLogger(__name__)


class BufferedBatch:
    """One published batch: in the replay buffer, and maybe in the live queue."""

    __slots__ = ("events", "frame", "payload", "seq", "ts")

    def __init__(self, seq: int, ts: float, events: list[KvEvent]) -> None:
        self.seq = seq  # sequence number
        self.frame = seq_frame(seq)  # seq as the wire's 8-byte frame
        self.ts = ts  # publish time, fixed so a replay sends the same bytes
        # The publisher's own copy of the list until the thread encodes it;
        # then None, so the replay buffer holds one bytes object per batch
        # (no records for the garbage collector to walk through).
        self.events: list[KvEvent] | None = events
        self.payload: bytes | None = None  # encoded by the thread, then kept


class _Replay:
    """One client's replay in flight."""

    __slots__ = ("cursor", "stalled_since")

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor  # the next sequence number to send
        self.stalled_since: float | None = None  # when its queue filled up, if it is full


# (cursor, count) -> (the buffer's first sequence number, up to count
# batches from cursor on); taken under the publisher's lock.
Window = Callable[[int, int], tuple[int, list[BufferedBatch]]]
Payload = Callable[[BufferedBatch], "bytes | None"]  # the batch's encoded payload


class ReplayService:
    """Replays in flight and their pacing. Publisher thread only; the
    counters are read by ``stats()`` under the publisher's lock (plain ints)."""

    def __init__(self, config: PublisherConfig, topic: bytes) -> None:
        self._config = config
        self._topic = topic
        self._replays: OrderedDict[bytes, _Replay] = OrderedDict()  # identity -> replay in flight
        self._tokens = 0.0  # token bucket (bytes)
        self._tokens_at = time.monotonic()
        self.requests = 0  # replay requests taken
        self.replayed = 0  # batches sent as replay answers
        self.replay_bytes = 0  # their payload bytes
        self.dropped = 0  # replays superseded, crowded out, stalled or whose client left

    def __bool__(self) -> bool:
        """Whether any replay is in flight."""
        return bool(self._replays)

    def take_requests(self, router: zmq.Socket[bytes]) -> None:
        """Read waiting requests ``[id, b"", start_seq]``: at most one replay per identity."""
        cfg, replays = self._config, self._replays
        for _ in range(4 * cfg.replay_clients):  # bounded work per round, even under a flood
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                logger.warning("ignoring malformed replay request (%d frames)", len(frames))
                continue
            identity = frames[0]
            self.requests += 1
            if replays.pop(identity, None) is not None:
                self.dropped += 1  # superseded by this request
            replays[identity] = _Replay(int.from_bytes(frames[2], "big", signed=True))
            while len(replays) > cfg.replay_clients:
                replays.popitem(last=False)
                self.dropped += 1

    def serve_slice(self, router: zmq.Socket[bytes], window: Window, payload_of: Payload) -> None:
        """Send at most one slice of replay answers, round robin over the clients."""
        cfg, replays = self._config, self._replays
        now = time.monotonic()
        self._tokens = min(
            float(cfg.replay_slice_bytes),
            self._tokens + (now - self._tokens_at) * cfg.replay_bytes_per_s,
        )
        self._tokens_at = now
        if self._tokens <= 0:
            return
        budget = self._tokens
        spent = 0
        per_client = max(1, cfg.replay_hwm // 4)  # entries looked at per client per slice
        for identity in list(replays):
            if spent >= budget:
                break
            rep = replays[identity]
            first, entries = window(rep.cursor, per_client)
            rep.cursor = max(rep.cursor, first)  # what left the buffer is gone
            finished = not entries
            try:
                for entry in entries:
                    if spent >= budget:
                        break
                    payload = payload_of(entry)
                    if payload is not None:
                        router.send_multipart((identity, b"", self._topic, entry.frame, payload), zmq.NOBLOCK)
                        self.replayed += 1
                        self.replay_bytes += len(payload)
                        spent += len(payload) + 32
                    rep.cursor = entry.seq + 1
                if finished:
                    router.send_multipart((identity, b"", b"", END_OF_REPLAY, b""), zmq.NOBLOCK)
                    del replays[identity]
                    continue
                rep.stalled_since = None
            except zmq.Again:  # the client does not read: pause its replay
                if rep.stalled_since is None:
                    rep.stalled_since = now
                elif now - rep.stalled_since > cfg.replay_stall_s:
                    del replays[identity]
                    self.dropped += 1
            except zmq.ZMQError:  # the client is gone
                del replays[identity]
                self.dropped += 1
        self._tokens -= spent

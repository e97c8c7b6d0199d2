"""The publisher contract: what the cache's owner thread hands its batches to.

``EventPublisher`` is the protocol; ``ZmqEventPublisher`` (in
``events.zmq_publisher``) puts batches on the wire with replay, and
``NullEventPublisher`` is the disabled feature: same contract, does nothing.
Also here: the publisher's frozen config, its counters and the wire helpers
for sequence frames that the subscriber shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from radixcache.events.types import KvEvent

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)  # seq frame ending a replay


def seq_frame(seq: int) -> bytes:
    """The 8-byte big-endian signed frame that carries ``seq`` on the wire."""
    return seq.to_bytes(8, "big", signed=True)


class BindError(OSError):
    """An endpoint could not be bound (typically: already in use)."""


@dataclass(frozen=True, slots=True)
class PublisherConfig:
    """How a ``ZmqEventPublisher`` binds and buffers (batches, not bytes).

    The defaults bind loopback only; to serve other hosts pass an endpoint
    such as ``tcp://*:5557`` explicitly. A port of ``*`` (``tcp://127.0.0.1:*``)
    binds any free port; the publisher's ``endpoint`` property tells which.

    Sequence numbers never go backwards across restarts of an engine: the
    first batch takes ``max(seq_base or the clock in microseconds since the
    epoch, the number persisted in seq_file)``. See ``events.sequence``.
    Replay is served in slices between live sends, at most
    ``replay_bytes_per_s`` over all clients and one request in flight per
    client identity, so a flooding client delays the live stream by at most
    one slice per round.
    """

    endpoint: str = "tcp://127.0.0.1:5557"  # PUB socket: live batches
    replay_endpoint: str | None = "tcp://127.0.0.1:5558"  # ROUTER; None disables replay
    topic: str = ""  # first frame of every message (UTF-8)
    replay_buffer_size: int = 10_000  # last N batches kept for replay
    queue_size: int = 1_024  # batches waiting for the thread; beyond: dropped
    dp_rank: int | None = None  # data-parallel rank written in every payload
    send_hwm: int = 100_000  # messages ZMQ buffers per subscriber before it drops
    close_linger_ms: int = 1_000  # how long close() may wait to flush the wire
    start_timeout_s: float = 10.0  # how long the constructor waits for the binds
    media: str = "sglang"  # medium names on the wire: "sglang" or "vllm"
    seq_base: int | None = None  # first sequence number; None: clock-derived (see above)
    seq_file: str | None = None  # file persisting reserved numbers (e.g. beside the storage)
    replay_bytes_per_s: int = 64 << 20  # replay bandwidth over all clients
    replay_slice_bytes: int = 256 << 10  # replay bytes sent between two looks at the live queue
    replay_clients: int = 16  # replays in flight at once (the oldest is dropped beyond)
    replay_hwm: int = 1_024  # messages queued per replay client before it is paused
    replay_stall_s: float = 5.0  # a paused (never-reading) replay is dropped after this

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ValueError("endpoint must be a ZMQ endpoint such as tcp://127.0.0.1:5557")
        if self.replay_endpoint == self.endpoint and not self.endpoint.endswith(":*"):
            raise ValueError(f"replay_endpoint {self.replay_endpoint!r} must differ from endpoint")
        if self.media not in ("sglang", "vllm"):
            raise ValueError(f"media must be 'sglang' or 'vllm', got {self.media!r}")
        if self.seq_base is not None and not 0 <= self.seq_base < 1 << 62:
            raise ValueError(f"seq_base must be in [0, 2**62), got {self.seq_base}")
        if self.replay_stall_s <= 0:
            raise ValueError(f"replay_stall_s must be positive, got {self.replay_stall_s}")
        for name in (
            "replay_buffer_size", "queue_size", "send_hwm", "replay_bytes_per_s",
            "replay_slice_bytes", "replay_clients", "replay_hwm",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.close_linger_ms < 0 or self.start_timeout_s <= 0:
            raise ValueError("close_linger_ms must be >= 0 and start_timeout_s > 0")
        if self.dp_rank is not None and self.dp_rank < 0:
            raise ValueError(f"dp_rank must be None or >= 0, got {self.dp_rank}")


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """Counters of one publisher, in batches."""

    published: int  # accepted by publish(); each took a sequence number
    dropped: int  # of those, not sent live because the queue was full
    sent: int  # handed to the PUB socket (ZMQ may still drop for a slow peer)
    replay_requests: int  # replay requests received
    replayed: int  # batches sent in answer to replay requests
    encode_errors: int  # events that failed to encode: each dropped alone, the rest of its batch sent
    replay_bytes: int = 0  # payload bytes sent in answer to replay requests
    replays_dropped: int = 0  # replays abandoned (superseded, stalled or over the client limit)
    resent: int = 0  # newest batches sent again because a subscriber joined (events.resync)


class EventPublisher(Protocol):
    """What the cache needs from a publisher."""

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Publish one batch (one engine step); an empty list is not published.

        Never blocks on I/O. The publisher keeps its own copy of the list.
        """
        ...

    def stats(self) -> PublisherStats:
        """A snapshot of the counters."""
        ...

    def close(self) -> None:
        """Flush what is queued (bounded wait) and release every resource."""
        ...


class NullEventPublisher:
    """The disabled publisher: accepts every batch and sends nothing."""

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Do nothing."""

    def stats(self) -> PublisherStats:
        """All zeros."""
        return PublisherStats(0, 0, 0, 0, 0, 0, 0, 0)

    def close(self) -> None:
        """Do nothing."""

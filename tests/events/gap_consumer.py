"""A consumer that asks for replay only when it sees a gap in the live sequence.

It models NVIDIA Dynamo 1.6.1's KV indexer (``lib/llm/src/kv_router``): the
ZMQ listener turns each live batch into events whose id is the batch's
sequence number, and the router's event loop keeps, per worker and dp rank,
the last event id it saw:

* a worker's first batch is accepted whatever its number;
* a batch numbered above ``last + 1`` is a gap: the missing range
  ``[last + 1, seq - 1]`` is recovered from the worker (here: the
  publisher's replay socket), applied in order, then the batch itself;
* a batch numbered at or below ``last`` is applied anyway (Dynamo: "duplicate
  or out-of-order, apply anyway (idempotent)");
* ``last = max(last, seq)``;
* a (re)connection does nothing by itself: no replay is asked without a gap.

It is not Dynamo (the tests cannot run Dynamo here); it applies batches into a
``KvIndex`` so that tests compare its state with the engine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from radixcache.events import KvIndex, decode_batch
from radixcache.events.publisher import seq_frame


class GapConsumer:
    """Follows one worker's live stream the way Dynamo 1.6.1's indexer does (see above)."""

    def __init__(
        self, ctx: zmq.Context[Any], index: KvIndex, worker: str, endpoint: str, replay_endpoint: str
    ) -> None:
        self.index = index
        self.worker = worker
        self.replay_endpoint = replay_endpoint
        self._ctx = ctx
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.last: int | None = None  # the last sequence number seen
        self.gaps = 0  # gaps seen (each recovered from replay)
        self.recovered = 0  # batches applied from replay
        self.duplicates = 0  # live batches numbered at or below ``last`` (applied again)
        self.live = 0  # live batches received

    def poll(self, timeout_ms: int) -> int:
        """Handle every live batch that arrives within ``timeout_ms``; returns how many."""
        handled = 0
        while self.sub.poll(timeout_ms if handled == 0 else 0):
            _topic, seq_bytes, payload = self.sub.recv_multipart()
            self._on_live(int.from_bytes(seq_bytes, "big", signed=True), payload)
            handled += 1
        return handled

    def run_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                return False
            self.poll(20)
        return True

    def close(self) -> None:
        self.sub.close(0)

    def _on_live(self, seq: int, payload: bytes) -> None:
        self.live += 1
        if self.last is not None and seq > self.last + 1:
            self.gaps += 1
            for missing, missed in self._recover(self.last + 1, seq - 1):
                self.recovered += 1
                self._apply(missing, missed)
        elif self.last is not None and seq <= self.last:
            self.duplicates += 1
        self._apply(seq, payload)
        self.last = seq if self.last is None else max(self.last, seq)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.index.apply_batch(self.worker, decode_batch(payload))

    def _recover(self, first: int, last: int) -> list[tuple[int, bytes]]:
        """The batches numbered ``first`` to ``last`` that the worker still has."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", seq_frame(first)])
            out: list[tuple[int, bytes]] = []
            while dealer.poll(2_000):
                _empty, _topic, seq_bytes, payload = dealer.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == -1:
                    break
                if first <= seq <= last:
                    out.append((seq, payload))
            return out
        finally:
            dealer.close(0)

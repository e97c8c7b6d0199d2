"""The router side of the stream: receive, check, repair and apply batches.

One SUB socket per worker (a shared one could not tell workers apart when
topics are empty) and, per worker with a replay endpoint, one DEALER socket
for repairs. For each worker the subscriber keeps ``next_seq`` (the batch it
must apply next; None before the first) and ``last_live`` (the newest
sequence number seen live)::

    live batch seq s
      first batch, or s > next_seq   catch up: replay from next_seq (0 when
                                     new); apply the answer in order. If it
                                     does not start at next_seq (too old, a
                                     restart, no replay), drop the worker's
                                     state first and apply from the answer's
                                     first batch (a restart's AllBlocksCleared)
      s <  last_live                 the publisher went backwards (a peer that
                                     restarts from 0): drop the state, catch up
      s <  next_seq                  already applied (through a replay, or the
                                     newest batch sent again when a subscriber
                                     joined: events.resync): skip
      s == next_seq                  decode and apply

    connection to a worker's PUB re-established (after a drop)
      catch up at once, without waiting for traffic: a restarted engine's
      numbers are above the old ones (``events.sequence``), so the replay
      answer starts with its AllBlocksCleared and the old state goes within
      about the reconnect interval (100 ms) even when the engine is idle

Malformed messages (wrong frame count, short sequence frame, payloads that
fail ``decode_batch``) are logged, counted and skipped; a malformed batch
still advances ``next_seq``, since a replay would return the same bytes.

Threads: ``poll``/``run_until`` run on the caller's thread. ``start`` hands
every socket to a background thread instead; the sink is then mutated under
``lock``, which readers of the sink must hold too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Protocol

import zmq

from radixcache.events.codec import DecodeError, decode_batch
from radixcache.events.index.kv_index import WorkerId
from radixcache.events.publisher import seq_frame
from zmq.utils.monitor import parse_monitor_message
from radixcache.events.types import EventBatch

logger = logging.getLogger(__name__)


class BatchSink(Protocol):
    """Where checked batches go (``KvIndex`` is one)."""

    def apply_batch(self, worker: WorkerId, batch: EventBatch) -> None:
        """Apply one batch of ``worker``, in stream order."""
        ...

    def clear_worker(self, worker: WorkerId) -> None:
        """Forget everything about ``worker``'s blocks."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerEndpoint:
    """Where one worker publishes."""

    worker_id: WorkerId  # the name the sink knows the worker by
    endpoint: str  # its PUB endpoint
    replay_endpoint: str | None = None  # its ROUTER endpoint; None: gaps are not repaired
    topic: str = ""  # the topic it publishes under


@dataclass(frozen=True, slots=True)
class SubscriberConfig:
    """Socket limits and timeouts of an ``EventSubscriber``."""

    replay_timeout_ms: int = 2_000  # wait for a whole replay answer at most this long
    rcv_hwm: int = 100_000  # live messages ZMQ queues per worker before dropping
    max_batches_per_poll: int = 4_096  # per worker, so one busy worker can't starve others

    def __post_init__(self) -> None:
        if self.replay_timeout_ms <= 0 or self.rcv_hwm < 0 or self.max_batches_per_poll <= 0:
            raise ValueError(f"invalid subscriber config: {self}")


@dataclass(slots=True)
class SubscriberStats:
    """Counters, in batches (a snapshot when returned by ``stats()``)."""

    received: int = 0  # live messages received
    applied: int = 0  # batches handed to the sink (live or replayed)
    duplicates: int = 0  # live batches already applied through a replay
    malformed: int = 0  # messages or payloads that failed checks (skipped)
    rejected: int = 0  # batches the sink raised on (logged, skipped)
    gaps: int = 0  # sequence jumps seen
    repaired: int = 0  # gaps filled entirely from replay
    unrepaired: int = 0  # gaps replay could not fill (worker state dropped)
    restarts: int = 0  # restarts or reconnects seen (worker caught up from replay)
    replayed: int = 0  # batches received in replay answers


class _Worker:
    __slots__ = ("dealer", "last_live", "monitor", "next_seq", "reconnected", "spec", "sub", "topic")

    def __init__(self, spec: WorkerEndpoint, sub: zmq.Socket[bytes], monitor: zmq.Socket[bytes]) -> None:
        self.spec = spec
        self.sub = sub  # SUB socket connected to spec.endpoint
        self.monitor = monitor  # tells when sub's connection drops
        self.dealer: zmq.Socket[bytes] | None = None  # replay socket, made on first need
        self.topic = spec.topic.encode()
        self.next_seq: int | None = None  # the batch to apply next; None: none applied yet
        self.last_live: int | None = None  # newest sequence number seen live
        self.reconnected = False  # the connection dropped and has not come back yet


class EventSubscriber:
    """Subscribes to workers' streams and applies their batches to a sink."""

    def __init__(
        self,
        sink: BatchSink,
        workers: Iterable[WorkerEndpoint] = (),
        config: SubscriberConfig | None = None,
    ) -> None:
        self.sink = sink
        self.config = config or SubscriberConfig()
        self.lock = threading.Lock()  # held while the sink is mutated
        self._ctx = zmq.Context(io_threads=1)
        self._poller = zmq.Poller()
        self._workers: dict[WorkerId, _Worker] = {}
        self._by_socket: dict[zmq.Socket[bytes], _Worker] = {}  # SUB sockets
        self._by_monitor: dict[zmq.Socket[bytes], _Worker] = {}  # their monitors
        self._stats = SubscriberStats()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        for spec in workers:
            self.add_worker(spec)

    def add_worker(self, spec: WorkerEndpoint) -> None:
        """Connect to one more worker (not while the background thread runs)."""
        self._owner_only()
        if spec.worker_id in self._workers:
            raise ValueError(f"worker {spec.worker_id!r} is already subscribed")
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.config.rcv_hwm)
        sub.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sub.connect(spec.endpoint)
        worker = _Worker(spec, sub, monitor)
        self._workers[spec.worker_id] = worker
        self._by_socket[sub] = worker
        self._by_monitor[monitor] = worker
        self._poller.register(sub, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    def remove_worker(self, worker_id: WorkerId) -> None:
        """Disconnect from a worker and clear its state in the sink."""
        self._owner_only()
        worker = self._workers.pop(worker_id)
        self._poller.unregister(worker.sub)
        self._poller.unregister(worker.monitor)
        del self._by_socket[worker.sub]
        del self._by_monitor[worker.monitor]
        self._close_sockets(worker)
        with self.lock:
            self.sink.clear_worker(worker_id)

    def next_seq(self, worker_id: WorkerId) -> int | None:
        """The sequence number of the batch this worker's stream applies next
        (None before its first batch)."""
        return self._workers[worker_id].next_seq

    def stats(self) -> SubscriberStats:
        """A snapshot of the counters."""
        s = self._stats
        return SubscriberStats(*(getattr(s, f.name) for f in fields(s)))

    # ------------------------------------------------------------------ driving

    def poll(self, timeout_ms: int = 0) -> int:
        """Wait up to ``timeout_ms`` for messages, then handle all that wait.

        Returns the number of batches applied. Runs repairs (replay requests)
        inline, so it may take up to ``replay_timeout_ms`` longer.
        """
        self._owner_only()
        return self._poll(timeout_ms)

    def run_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Poll until ``done()`` is true (returns True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll(max(1, min(50, int(left * 1000))))
        return True

    def start(self) -> None:
        """Run ``poll`` on a background thread until ``close``."""
        self._owner_only()
        self._thread = threading.Thread(target=self._run, name="events-subscriber", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (if any) and close every socket. Idempotent."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.config.replay_timeout_ms / 1000 + 5.0)
            self._thread = None
        for worker in self._workers.values():
            self._close_sockets(worker)
        self._ctx.term()
        self._closed = True

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _close_sockets(worker: _Worker) -> None:
        worker.sub.disable_monitor()
        worker.monitor.close(0)
        worker.sub.close(0)
        if worker.dealer is not None:
            worker.dealer.close(0)

    def _owner_only(self) -> None:
        if self._closed:
            raise RuntimeError("the subscriber is closed")
        if self._thread is not None:
            raise RuntimeError("the subscriber's sockets belong to its background thread")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll(100)
            except Exception:
                logger.exception("event subscriber poll failed; continuing")

    def _poll(self, timeout_ms: int) -> int:
        ready = [sock for sock, _ in self._poller.poll(timeout_ms)]
        applied = self._stats.applied
        limit = self.config.max_batches_per_poll
        # Monitors first: a connection that came back is caught up before
        # the batches that arrive over it.
        for sock in ready:
            worker = self._by_monitor.get(sock)
            if worker is not None:
                while sock.poll(0):
                    self._on_monitor(worker, parse_monitor_message(sock.recv_multipart())["event"])
        for sock in ready:
            worker = self._by_socket.get(sock)
            if worker is None:
                continue
            with self.lock:
                for _ in range(limit):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_live(worker, frames)
        return self._stats.applied - applied

    # ------------------------------------------------------------------ the stream logic

    def _on_monitor(self, worker: _Worker, event: int) -> None:
        if event == zmq.EVENT_DISCONNECTED:
            worker.reconnected = True
            if worker.dealer is not None:  # its pipe died with the peer: start afresh
                worker.dealer.close(0)
                worker.dealer = None
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED and worker.reconnected:
            worker.reconnected = False
            self._stats.restarts += 1
            logger.info("worker %r reconnected; catching up from replay", worker.spec.worker_id)
            with self.lock:
                self._catch_up(worker, None)

    def _on_live(self, worker: _Worker, frames: list[bytes]) -> None:
        stats = self._stats
        stats.received += 1
        if len(frames) != 3 or len(frames[1]) != 8 or frames[0] != worker.topic:
            stats.malformed += 1
            logger.warning(
                "worker %r: malformed message skipped (%d frames, want [topic %r, 8-byte seq, payload])",
                worker.spec.worker_id, len(frames), worker.topic,
            )
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq < 0:
            stats.malformed += 1
            logger.warning("worker %r: negative sequence number %d", worker.spec.worker_id, seq)
            return
        if worker.last_live is not None and seq < worker.last_live:
            # Numbers went back: a publisher that restarts its count. Drop
            # what we hold and start over from its replay buffer. (The same
            # number again is a batch sent again for a subscriber that
            # joined, events.resync: a duplicate.)
            stats.restarts += 1
            logger.info("worker %r restarted (seq %d after %d); rebuilding its state",
                        worker.spec.worker_id, seq, worker.last_live)
            self.sink.clear_worker(worker.spec.worker_id)
            worker.next_seq = None
        worker.last_live = seq
        if worker.next_seq is None or seq > worker.next_seq:
            self._catch_up(worker, seq)
        assert worker.next_seq is not None
        if seq < worker.next_seq:
            stats.duplicates += 1
            return
        self._apply(worker, seq, frames[2])

    def _catch_up(self, worker: _Worker, live_seq: int | None) -> None:
        """Apply what replay holds from ``next_seq`` on (up to ``live_seq``, the
        live batch in hand, if any); drop the state first if it does not
        continue ours. Leaves ``next_seq`` set."""
        stats = self._stats
        fresh = worker.next_seq is None
        start = 0 if worker.next_seq is None else worker.next_seq
        if live_seq is not None and not fresh:
            stats.gaps += 1
        replayed = self._fetch(worker, start) or []
        if live_seq is not None:
            replayed = [(s, p) for s, p in replayed if s < live_seq]
        continues = not fresh and (not replayed or replayed[0][0] == start)
        if not continues and not fresh:
            if live_seq is not None:
                stats.unrepaired += 1
            logger.warning(
                "worker %r: batches from %d are not in replay (a restart or a lost gap); dropping its state",
                worker.spec.worker_id, start,
            )
        if not continues:
            self.sink.clear_worker(worker.spec.worker_id)
            worker.next_seq = replayed[0][0] if replayed else live_seq
        for seq, payload in replayed:
            if seq == worker.next_seq:
                self._apply(worker, seq, payload)
        if live_seq is None:
            if worker.next_seq is None:  # no live batch, nothing in replay: wait for one
                return
        elif worker.next_seq is None or worker.next_seq < live_seq:
            # A hole between the replay's end and the live batch: what we
            # built misses batches. Start over from the live one.
            if worker.next_seq is not None:
                stats.unrepaired += 1
                self.sink.clear_worker(worker.spec.worker_id)
            worker.next_seq = live_seq
        elif not fresh and continues:
            stats.repaired += 1

    def _apply(self, worker: _Worker, seq: int, payload: bytes) -> None:
        assert seq == worker.next_seq, f"applying batch {seq}, expected {worker.next_seq}"
        worker.next_seq = seq + 1
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            self._stats.malformed += 1
            logger.warning("worker %r: batch %d skipped: %s", worker.spec.worker_id, seq, exc)
            return
        try:
            self.sink.apply_batch(worker.spec.worker_id, batch)
        except Exception:
            self._stats.rejected += 1
            logger.exception("worker %r: batch %d rejected by the sink", worker.spec.worker_id, seq)
            return
        self._stats.applied += 1

    def _fetch(self, worker: _Worker, start: int) -> list[tuple[int, bytes]] | None:
        """Ask the worker's replay socket for batches ``>= start``; None if it can't."""
        endpoint = worker.spec.replay_endpoint
        if endpoint is None:
            return None
        if worker.dealer is None:
            worker.dealer = self._ctx.socket(zmq.DEALER)
            worker.dealer.setsockopt(zmq.LINGER, 0)
            worker.dealer.setsockopt(zmq.RCVHWM, 0)  # an answer may be the whole buffer
            worker.dealer.connect(endpoint)
        dealer = worker.dealer
        dealer.send_multipart((b"", seq_frame(start)))
        deadline = time.monotonic() + self.config.replay_timeout_ms / 1000
        out: list[tuple[int, bytes]] = []
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not dealer.poll(left_ms, zmq.POLLIN):
                logger.warning("worker %r: replay from %d timed out", worker.spec.worker_id, start)
                dealer.close(0)  # a late answer must not be read as the next one
                worker.dealer = None
                return out
            frames = dealer.recv_multipart()
            if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != 8:
                self._stats.malformed += 1
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == -1:
                return out
            self._stats.replayed += 1
            out.append((seq, frames[3]))

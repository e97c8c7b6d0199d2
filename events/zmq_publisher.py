"""``ZmqEventPublisher``: batches onto a ZMQ PUB socket, with replay.

See ``events.codec`` for the payload and ``events`` for the stream's
guarantees. Who does what::

    owner thread                          publisher thread (owns every socket)
    ------------                          -------------------------------------
    publish(events)
      check records (ValueError)
      seq = next number                   loop:
      replay buffer <- (seq, ts, events)    take every pending batch
      pending queue <- batch, or drop       encode (once; kept for replay)
        when full (counted)                 PUB  <- [topic, seq, payload]
      wake the thread if it sleeps          ROUTER: take replay requests, then
                                              send one bounded slice of answers
                                            PUB (an XPUB): a subscriber joined:
                                              the newest batch again (resync.py)
                                            sleep in poll() until woken

The sequence number and the replay-buffer entry are taken *before* the
bounded queue, so a batch the queue had no room for is still replayable: a
subscriber sees the gap and fetches it. ``publish`` never blocks on I/O; its
only lock is held for a few list operations. Sequence numbers come from
``events.sequence`` (never backwards across restarts). The first batch,
``[AllBlocksCleared]``, is in the replay buffer before either socket is
bound, so a consumer that asks for replay as soon as it (re)connects always
finds it.

Replay requests are served, paced and bounded by ``events.replay``: a
flooding or never-reading client delays a live batch by at most one slice's
send time.

Costs, for a 16-page ``BlockStored``: about 1-2 us of checks in ``publish``
and 1-2 us of encoding on the thread. The thread shares the GIL with the
owner, so encoding costs the process the same CPU wherever it runs; on the
thread it fills the owner's GIL-free waits (device synchronisation, I/O)
instead of lengthening its step. Its frame sends keep the GIL
(``events.gil_send``): a send that released it would hand it to a busy owner
at every frame and wait to get it back. Publish once per step, not once per
request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from itertools import islice

import zmq

from radixcache.events.codec import BatchEncoder, check_events
from radixcache.events.gil_send import FrameSend, frame_sender
from radixcache.events.publisher import BindError, PublisherConfig, PublisherStats
from radixcache.events.replay import BufferedBatch, ReplayService
from radixcache.events.resync import SubscriptionWatch, open_live_socket
from radixcache.events.sequence import SequenceSource
from radixcache.events.types import AllBlocksCleared, KvEvent

logger = logging.getLogger(__name__)


class ZmqEventPublisher:
    """Publishes batches on a ZMQ PUB socket and serves replay on a ROUTER.

    The constructor binds both endpoints (raising ``BindError`` naming the
    endpoint if one is in use) and publishes ``[AllBlocksCleared()]`` as its
    first batch (number ``first_seq``), so a consumer drops what it believed
    about a previous incarnation. In a child forked from the process that
    built it, ``publish`` raises RuntimeError and ``close`` does nothing.
    """

    _LINGER_MS = 1  # how long the thread waits for more work before sleeping
    _BUSY_POLL_S = 0.005  # while sending, how often it looks at replay requests
    _REPLAY_TICK_MS = 2  # with replays in flight, the longest sleep between slices

    def __init__(self, config: PublisherConfig | None = None) -> None:
        self._config = config = config or PublisherConfig()
        self._topic = config.topic.encode()
        self._lock = threading.Lock()  # guards everything below shared with the thread
        self._pending: deque[BufferedBatch] = deque()  # FIFO for the thread; bounded by queue_size
        self._replay: deque[BufferedBatch] = deque(maxlen=config.replay_buffer_size)
        self._seq = SequenceSource(config.seq_base, config.seq_file)
        self._published = 0
        self._dropped = 0
        self._forced_drops = 0  # test hook: next N publishes act as if the queue were full
        self._closing = False
        self._pid = os.getpid()  # the process whose thread sends
        self._forked = False  # set in a forked child: publish refuses, close touches nothing
        _publishers.add(self)
        self._sleeping = False  # the thread waits in poll(); publish() must wake it
        # Written by the thread only:
        self._sent = 0
        self._encode_errors = 0
        self._watch = SubscriptionWatch()  # a subscriber joined: send the newest batch again
        self._replays = ReplayService(config, self._topic)
        self._endpoint = config.endpoint
        self._replay_endpoint = config.replay_endpoint
        self._start_error: BaseException | None = None
        self._ready = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._enqueue([AllBlocksCleared()])  # replayable before anyone can connect
        self._thread = threading.Thread(target=self._run, name="events-publisher", daemon=True)
        self._thread.start()
        if not self._ready.wait(config.start_timeout_s):
            self._start_error = TimeoutError(f"event publisher did not start in {config.start_timeout_s} s")
        if self._start_error is not None:
            self.close()
            raise self._start_error

    # ------------------------------------------------------------------ owner side

    @property
    def endpoint(self) -> str:
        """The bound PUB endpoint (with the actual port if ``*`` was asked)."""
        return self._endpoint

    @property
    def replay_endpoint(self) -> str | None:
        """The bound ROUTER endpoint, or None when replay is disabled."""
        return self._replay_endpoint

    @property
    def first_seq(self) -> int:
        """The sequence number of this incarnation's first batch (its AllBlocksCleared)."""
        return self._seq.first

    @property
    def next_seq(self) -> int:
        """The sequence number the next published batch takes."""
        with self._lock:
            return self._seq.next

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Publish one batch; ``[]`` is a no-op.

        Raises ValueError for a record that cannot go on the wire and
        RuntimeError after ``close`` or in a forked child. Never blocks: when
        the queue is full the batch is dropped from the live stream (counted)
        but stays replayable.
        """
        if self._forked:
            raise RuntimeError(
                f"this event publisher was created in process {self._pid}; process "
                f"{os.getpid()} is a child forked from it, where its thread and sockets do "
                f"not exist: create a new publisher here"
            )
        if not events:
            return
        check_events(events)
        self._enqueue(list(events))

    def _enqueue(self, batch: list[KvEvent]) -> None:
        with self._lock:
            if self._closing:
                raise RuntimeError("publish() on a closed ZmqEventPublisher")
            entry = BufferedBatch(self._seq.take(), time.time(), batch)
            self._replay.append(entry)
            self._published += 1
            if self._forced_drops:
                self._forced_drops -= 1
                self._dropped += 1
                return
            if len(self._pending) >= self._config.queue_size:
                self._dropped += 1
                return
            self._pending.append(entry)
            if self._sleeping:
                self._sleeping = False
                self._wake()

    def simulate_full_queue(self, batches: int) -> None:
        """Test hook: the next ``batches`` publishes behave as if the queue were full.

        They get sequence numbers and enter the replay buffer, but are never
        sent live, exactly like a real drop.
        """
        if batches < 0:
            raise ValueError(f"batches must be >= 0, got {batches}")
        with self._lock:
            self._forced_drops = batches

    def stats(self) -> PublisherStats:
        """A snapshot of the counters."""
        with self._lock:
            replays = self._replays
            return PublisherStats(
                self._published, self._dropped, self._sent,
                replays.requests, replays.replayed, self._encode_errors,
                replays.replay_bytes, replays.dropped, self._watch.resent,
            )

    def close(self) -> None:
        """Send what is queued, wait up to ``close_linger_ms`` for the wire, stop.

        Idempotent. Later publishes raise RuntimeError. In a forked child it
        does nothing (the thread and the sockets are the parent's).
        """
        if self._forked:
            return
        with self._lock:
            already = self._closing
            self._closing = True
        if not already:
            self._wake()
        if self._thread.is_alive():
            self._thread.join(self._config.close_linger_ms / 1000 + 5.0)
        if not self._thread.is_alive() and self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    # ------------------------------------------------------------------ thread side

    def _bind(self, sock: zmq.Socket[bytes], endpoint: str) -> str:
        host = endpoint.split("://", 1)[-1]
        if host.startswith(("*", "0.0.0.0", "[::]")):
            logger.info("event endpoint %s listens on all interfaces", endpoint)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise BindError(
                f"cannot bind event endpoint {endpoint!r}: {exc.strerror}"
                " (is another publisher using it? tcp://127.0.0.1:* picks a free port)"
            ) from None
        bound = sock.getsockopt(zmq.LAST_ENDPOINT)
        return bound.decode() if isinstance(bound, bytes) else endpoint

    def _run(self) -> None:
        cfg = self._config
        ctx = zmq.Context(io_threads=1)
        pub = open_live_socket(ctx)  # an XPUB: it hears subscribers join (events.resync)
        router: zmq.Socket[bytes] | None = None
        try:
            pub.setsockopt(zmq.SNDHWM, cfg.send_hwm)
            pub.setsockopt(zmq.LINGER, cfg.close_linger_ms)
            self._endpoint = self._bind(pub, cfg.endpoint)
            if cfg.replay_endpoint is not None:
                router = ctx.socket(zmq.ROUTER)
                # A full pipe refuses (EAGAIN) instead of dropping: the
                # client's replay pauses where it was, nothing is lost.
                router.setsockopt(zmq.ROUTER_MANDATORY, 1)
                router.setsockopt(zmq.SNDHWM, cfg.replay_hwm)
                router.setsockopt(zmq.LINGER, 0)
                self._replay_endpoint = self._bind(router, cfg.replay_endpoint)
        except Exception as exc:  # handed to the constructor, which raises it
            self._start_error = exc
            pub.close(0)
            if router is not None:
                router.close(0)
            ctx.term()
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(pub, router)
        except Exception:
            logger.exception("event publisher thread failed; no more batches are sent")
        finally:
            pub.close(cfg.close_linger_ms)
            if router is not None:
                router.close(0)
            ctx.term()  # waits for the PUB's linger at most

    def _loop(self, pub: zmq.Socket[bytes], router: zmq.Socket[bytes] | None) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(pub, zmq.POLLIN)  # subscriptions
        if router is not None:
            poller.register(router, zmq.POLLIN)
        encoder = BatchEncoder(self._config.media)
        send = frame_sender(pub)  # keeps the GIL: see events.gil_send
        topic = self._topic
        more = zmq.SNDMORE
        replays = self._replays
        dry = False  # the last round found nothing to send
        next_poll = 0.0  # while busy, look at the replay socket only this often
        while True:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
                closing = self._closing
                asleep = dry and not batch and not closing and not replays
                if asleep:
                    self._sleeping = True
            for entry in batch:
                payload = self._payload(entry, encoder)
                if payload is not None:
                    send(topic, more)
                    send(entry.frame, more)
                    send(payload, 0)
                    self._sent += 1
            if closing and not batch:
                return
            if self._watch.due:
                self._resend_newest(send, encoder)
            if router is not None and replays:
                replays.serve_slice(router, self._window, lambda entry: self._payload(entry, encoder))
            # Busy: go on, looking at replay requests every few ms. Just ran
            # dry: wait a moment without asking to be woken, so a steady
            # publisher does not pay a wake-up (a syscall and a thread switch)
            # per batch. Dry twice: sleep until publish() or a request wakes
            # us (or, with replays in flight, until the next slice is due).
            timeout: int | None
            if batch:
                dry = False
                now = time.monotonic()
                if now < next_poll:
                    continue
                next_poll = now + self._BUSY_POLL_S
                timeout = 0
            elif not dry:
                dry = True
                timeout = self._LINGER_MS
            else:  # only once publish() knows to wake us may we sleep for good
                timeout = None if asleep else self._REPLAY_TICK_MS
            ready = dict(poller.poll(timeout))
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            if router is not None and router in ready:
                replays.take_requests(router)
            if pub in ready:
                self._watch.hear(pub)

    def _resend_newest(self, send: FrameSend, encoder: BatchEncoder) -> None:
        """A subscriber joined: send the newest batch again, unless batches are
        still queued (they go out first, and are news to it anyway). See events.resync."""
        with self._lock:
            if self._pending:
                return
            entry = self._replay[-1] if self._replay else None
        self._watch.due = False
        payload = None if entry is None else self._payload(entry, encoder)
        if entry is not None and payload is not None:
            send(self._topic, zmq.SNDMORE)
            send(entry.frame, zmq.SNDMORE)
            send(payload, 0)
            self._watch.resent += 1

    def _payload(self, entry: BufferedBatch, encoder: BatchEncoder) -> bytes | None:
        """The batch's payload, encoded once (live and replay send the same
        bytes). An event that cannot be encoded costs only itself: the
        batch is encoded again without it (the cost falls on the failing
        batch alone)."""
        if entry.payload is None and entry.events is not None:
            try:
                entry.payload = encoder.encode(entry.events, entry.ts, self._config.dp_rank)
            except Exception:
                entry.payload = self._encode_each(entry, encoder)
            entry.events = None
        return entry.payload

    def _encode_each(self, entry: BufferedBatch, encoder: BatchEncoder) -> bytes | None:
        """The payload of ``entry``'s events less those that cannot be
        encoded, each dropped and counted (``encode_errors``) alone; None if
        none is left (the batch's sequence number is then a gap, as a
        batch may never be empty)."""
        assert entry.events is not None
        dp_rank = self._config.dp_rank
        kept: list[KvEvent] = []
        for i, event in enumerate(entry.events):
            try:
                encoder.encode([event], entry.ts, dp_rank)
            except Exception as exc:
                self._encode_errors += 1
                logger.error(
                    "event %d of batch %d (%s) cannot be encoded, dropped alone: %r",
                    i, entry.seq, type(event).__name__, exc,
                )
            else:
                kept.append(event)
        return encoder.encode(kept, entry.ts, dp_rank) if kept else None

    def _window(self, cursor: int, count: int) -> tuple[int, list[BufferedBatch]]:
        """The replay buffer's first sequence number, and up to ``count``
        buffered batches from ``cursor`` on (what left the buffer is gone)."""
        with self._lock:
            first = self._replay[0].seq if self._replay else self._seq.next
            start = max(cursor, first) - first
            return first, list(islice(self._replay, start, start + count))


_publishers: weakref.WeakSet[ZmqEventPublisher] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has no publisher thread: its publishers refuse to
    publish, close without touching the parent's sockets, and get a fresh
    lock (the parent's thread may have held the old one at the fork)."""
    for publisher in list(_publishers):
        publisher._lock = threading.Lock()
        publisher._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)

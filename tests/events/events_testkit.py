"""Helpers for the event tests: record factories, a reference model, waits."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from radixcache.events import (
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventSubscriber,
    KvEvent,
    KvIndex,
    Medium,
    WorkerEndpoint,
    ZmqEventPublisher,
)

BS = 4  # block size used throughout these tests

MakePublisher = Callable[..., ZmqEventPublisher]  # the make_publisher fixture


def stored(
    hashes: list[int],
    tokens: list[int],
    *,
    parent: int | None = None,
    medium: Medium = "GPU",
    lora_id: int | None = None,
    lora_name: str | None = None,
) -> BlockStored:
    """A BlockStored of ``len(hashes)`` blocks of ``BS`` tokens."""
    return BlockStored(hashes, parent, tokens, BS, lora_id, medium, lora_name)


def chain(first_hash: int, tokens: list[int], medium: Medium = "GPU", parent: int | None = None) -> BlockStored:
    """Store ``tokens`` (a multiple of BS) as consecutive hashes from ``first_hash``."""
    n = len(tokens) // BS
    return stored(list(range(first_hash, first_hash + n)), tokens, parent=parent, medium=medium)


def random_batches(seed: int, count: int) -> list[list[KvEvent]]:
    """A plausible stream: chains stored on GPU (some extending others),
    copied to host or disk (store on the new medium first, then maybe removed
    from the GPU), evicted from a medium."""
    rng = random.Random(seed)
    chains: list[tuple[list[int], list[int], int | None]] = []  # hashes, tokens, parent
    where: dict[int, set[Medium]] = {}
    next_hash = 1_000 + seed * 1_000_000
    batches: list[list[KvEvent]] = []
    for _ in range(count):
        batch: list[KvEvent] = []
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.5 or not chains:
                n = rng.randint(1, 4)
                hashes = list(range(next_hash, next_hash + n))
                next_hash += n
                tokens = [rng.randrange(50_000) for _ in range(n * BS)]
                parent = rng.choice(chains)[0][-1] if chains and rng.random() < 0.5 else None
                if parent is not None and not where.get(parent):
                    parent = None
                chains.append((hashes, tokens, parent))
                batch.append(stored(hashes, tokens, parent=parent))
                for h in hashes:
                    where[h] = {"GPU"}
                continue
            hashes, tokens, parent = rng.choice(chains)
            if roll < 0.75 and all(where[h] for h in hashes):  # copies come from somewhere
                medium: Medium = rng.choice(["CPU_PINNED", "DISK"])
                batch.append(stored(hashes, tokens, parent=parent, medium=medium))
                for h in hashes:
                    where[h].add(medium)
                on_gpu = [h for h in hashes if "GPU" in where[h]]
                if on_gpu and rng.random() < 0.5:
                    batch.append(BlockRemoved(on_gpu, "GPU"))
                    for h in on_gpu:
                        where[h].discard("GPU")
            elif roll >= 0.75:
                medium = rng.choice(list(MEDIA))
                victims = [h for h in hashes if medium in where[h]]
                if victims:
                    batch.append(BlockRemoved(victims, medium))
                    for h in victims:
                        where[h].discard(medium)
        if batch:
            batches.append(batch)
    return batches


def reference(batches: Iterable[list[KvEvent]]) -> dict[Medium, set[int]]:
    """What a consumer applying ``batches`` in order must hold, per medium."""
    held: dict[Medium, set[int]] = {m: set() for m in MEDIA}
    for batch in batches:
        for event in batch:
            if isinstance(event, BlockStored):
                held[event.medium or "GPU"].update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held[event.medium or "GPU"].difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                for m in MEDIA:
                    held[m].clear()
    return held


def holdings(index: KvIndex, worker: object) -> dict[Medium, set[int]]:
    """The index's view of ``worker``, in the reference's shape."""
    return {m: index.resident(worker, m) for m in MEDIA}


def wait_until(done: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Sleep-poll until ``done()``; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


PROBE_HASH = (1 << 63) - 1  # removals of this hash are harmless probes


def worker_of(pub: ZmqEventPublisher, name: str = "w0") -> WorkerEndpoint:
    """The WorkerEndpoint a subscriber uses to follow ``pub``."""
    return WorkerEndpoint(name, pub.endpoint, pub.replay_endpoint)


def sync(pub: ZmqEventPublisher, sub: EventSubscriber, worker: object = "w0", timeout_s: float = 5.0) -> None:
    """Publish harmless probes until ``sub`` follows ``pub`` live, then let it
    catch up with everything ``pub`` published so far."""
    deadline = time.monotonic() + timeout_s
    start = sub.next_seq(worker)
    while sub.next_seq(worker) == start:  # moves once a live batch of this worker arrives
        assert time.monotonic() < deadline, "subscriber never connected"
        pub.publish([BlockRemoved([PROBE_HASH], "GPU")])
        sub.poll(20)
    published = pub.next_seq
    assert sub.run_until(lambda: applied_upto(sub, worker) >= published, timeout_s), "subscriber did not catch up"


def applied_upto(sub: EventSubscriber, worker: object) -> int:
    """The next batch ``sub`` applies for ``worker`` (-1 before the first)."""
    n = sub.next_seq(worker)
    return -1 if n is None else n


def sync_raw(pub: ZmqEventPublisher, sock: zmq.Socket[bytes], timeout_s: float = 5.0) -> int:
    """Probe until the raw SUB ``sock`` receives, then drain every probe still
    on its way; returns the sequence number of the last one."""
    deadline = time.monotonic() + timeout_s
    while not sock.poll(20):
        assert time.monotonic() < deadline, "raw subscriber never connected"
        pub.publish([BlockRemoved([PROBE_HASH], "GPU")])
    last = pub.next_seq - 1
    while True:
        assert sock.poll(int(timeout_s * 1000)), "probes stopped arriving"
        seq = int.from_bytes(sock.recv_multipart()[1], "big", signed=True)
        if seq == last:
            return seq


def replay(zctx: zmq.Context[Any], endpoint: str, start: int) -> list[list[bytes]]:
    """One raw replay request from a DEALER; every answer message, end marker included."""
    dealer = zctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
    out = []
    while True:
        assert dealer.poll(3000), "replay answer timed out"
        msg = dealer.recv_multipart()
        out.append(msg)
        if msg[2] == (-1).to_bytes(8, "big", signed=True):
            return out

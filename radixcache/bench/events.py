"""Event stream benchmark: ``python -m radixcache.bench events [--quick]``.

Prints one JSON object. Stores come as 16-page ``BlockStored`` events
(random 63-bit hashes, token ids below a 128k vocabulary), ``--events-per-batch``
of them per batch (one engine step).

(a) ``baseline``: a plain msgpack loop in one thread -- build each event's map,
    ``msgpack.packb`` the batch, ``msgpack.unpackb`` it -- no sockets, no checks.
(b) ``end_to_end``: an engine process publishes through ``ZmqEventPublisher``
    (checks, sequence numbers, replay buffer, encode on its thread, PUB over
    loopback TCP); this process receives with ``EventSubscriber`` (SUB, frame
    and sequence checks, strict decode) into a sink that counts pages. The
    figure is pages over the time from the first publish to the last decode.
    ``publisher_pages_per_s`` is pages over the time the publisher needed to
    hand everything to its socket; ``subscriber_pages_per_s`` is pages over
    the subscriber's own CPU time (its capacity). ``subscriber_keeps_up`` says
    whether the subscriber's capacity is at least the publisher's rate.
(c) ``index_apply``: the same batches decoded and applied to a ``KvIndex``
    (rehash of every block, refcounts), in one thread: what a router adds on
    top of decoding.

The end-to-end run is repeated (``--repeat``) and the best one reported, as
other processes on a shared machine only ever slow a run down.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any

if __name__ in ("__main__", "__mp_main__"):
    # Run as a script, this file's folder heads sys.path and its own name
    # would shadow the ``events`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import msgpack  # noqa: E402

from events import (  # noqa: E402
    GPU,
    BatchEncoder,
    BlockStored,
    EventBatch,
    EventSubscriber,
    KvIndex,
    PublisherConfig,
    SubscriberConfig,
    WorkerEndpoint,
    ZmqEventPublisher,
    decode_batch,
)

PAGES = 16  # pages (blocks) per BlockStored event
PAGE = 16  # tokens per page
VOCAB = 128_000


def make_batches(count: int, per_batch: int, seed: int = 0) -> list[list[BlockStored]]:
    """``count`` distinct batches of ``per_batch`` chained 16-page stores."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        batch = []
        for _ in range(per_batch):
            hashes = [rng.getrandbits(63) for _ in range(PAGES)]
            tokens = [rng.randrange(VOCAB) for _ in range(PAGES * PAGE)]
            batch.append(BlockStored(hashes, rng.getrandbits(63), tokens, PAGE, None, GPU, None))
        out.append(batch)
    return out


def bench_baseline(batches: list[list[BlockStored]], rounds: int) -> dict[str, Any]:
    """Plain msgpack loop: maps built inline, packb + unpackb, one thread."""
    pages = 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        for batch in batches:
            maps = [
                {
                    "type": "BlockStored",
                    "block_hashes": e.block_hashes,
                    "parent_block_hash": e.parent_block_hash,
                    "token_ids": e.token_ids,
                    "block_size": e.block_size,
                    "medium": e.medium,
                }
                for e in batch
            ]
            raw = msgpack.unpackb(msgpack.packb([time.time(), maps, None]))
            pages += sum(len(m["block_hashes"]) for m in raw[1])
    dt = time.perf_counter() - t0
    return {"pages": pages, "seconds": round(dt, 4), "pages_per_s": round(pages / dt)}


def bench_codec(batches: list[list[BlockStored]], rounds: int) -> dict[str, Any]:
    """Our encoder and strict decoder alone, one thread, no sockets."""
    encoder = BatchEncoder()
    payloads = [encoder.encode(b, time.time()) for b in batches]
    pages = rounds * sum(len(e.block_hashes) for b in batches for e in b)
    t0 = time.perf_counter()
    for _ in range(rounds):
        for batch in batches:
            encoder.encode(batch, 0.0)
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(rounds):
        for payload in payloads:
            decode_batch(payload)
    t_dec = time.perf_counter() - t0
    return {
        "encode_pages_per_s": round(pages / t_enc),
        "decode_pages_per_s": round(pages / t_dec),
        "serial_pages_per_s": round(pages / (t_enc + t_dec)),
    }


def bench_index(batches: list[list[BlockStored]]) -> dict[str, Any]:
    """Decode + apply to a KvIndex, one thread."""
    payloads = [BatchEncoder().encode(b, time.time()) for b in batches]
    index = KvIndex()
    pages = sum(len(e.block_hashes) for b in batches for e in b)
    t0 = time.perf_counter()
    for payload in payloads:
        index.apply_batch("w0", decode_batch(payload))
    dt = time.perf_counter() - t0
    return {"pages": pages, "pages_per_s": round(pages / dt)}


class _CountingSink:
    """Counts pages and batches; keeps nothing."""

    def __init__(self) -> None:
        self.pages = 0
        self.batches = 0
        self.last = 0.0

    def apply_batch(self, worker: object, batch: EventBatch) -> None:
        for event in batch.events:
            if type(event) is BlockStored:
                self.pages += len(event.block_hashes)
        self.batches += 1
        self.last = time.perf_counter()

    def clear_worker(self, worker: object) -> None:
        pass


def _engine(conn: Any, distinct: int, per_batch: int, total: int) -> None:
    """The publishing process: waits for "go", publishes ``total`` batches."""
    batches = make_batches(distinct, per_batch, seed=1)
    config = PublisherConfig(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        queue_size=total + 8,
        replay_buffer_size=total + 8,
        send_hwm=total + 8,
    )
    with ZmqEventPublisher(config) as pub:
        conn.send(pub.endpoint)
        conn.recv()  # the subscriber holds batch 0: it is connected
        t0 = time.perf_counter()
        for i in range(total):
            pub.publish(batches[i % distinct])
        while pub.stats().sent < total + 1:
            time.sleep(0.0002)
        conn.send((t0, time.perf_counter() - t0, pub.stats().dropped))
        conn.recv()  # the subscriber is done; close (flush) after that


def bench_end_to_end(distinct: int, per_batch: int, total: int, timeout_s: float) -> dict[str, Any]:
    """One engine process -> this process over loopback PUB/SUB."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_engine, args=(child, distinct, per_batch, total), daemon=True)
    proc.start()
    sink = _CountingSink()
    try:
        if not parent.poll(30):
            raise RuntimeError("the publishing process did not start")
        endpoint = parent.recv()
        config = SubscriberConfig(rcv_hwm=0)
        with EventSubscriber(sink, [WorkerEndpoint("engine", endpoint)], config) as sub:
            # Give the connection time to come up. Should it not be up yet, the
            # first batch seen is a gap and replay fetches what came before.
            time.sleep(0.3)
            parent.send("go")
            cpu0 = time.thread_time()
            done = sub.run_until(lambda: sink.pages >= total * per_batch * PAGES, timeout_s)
            cpu = time.thread_time() - cpu0
            stats = sub.stats()
        t0, pub_seconds, dropped = parent.recv()
        parent.send("done")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    pages = sink.pages
    wall = sink.last - t0  # perf_counter is system-wide on Linux (CLOCK_MONOTONIC)
    pub_rate = total * per_batch * PAGES / pub_seconds
    sub_rate = pages / cpu if cpu > 0 else 0.0
    return {
        "complete": done,
        "pages": pages,
        "batches": total,
        "seconds": round(wall, 4),
        "pages_per_s": round(pages / wall) if wall > 0 else 0,
        "publisher_pages_per_s": round(pub_rate),
        "subscriber_pages_per_s": round(sub_rate),
        "subscriber_keeps_up": sub_rate >= pub_rate,
        "publisher_dropped": dropped,
        "subscriber_gaps": stats.gaps,
        "subscriber_malformed": stats.malformed,
    }


def run(quick: bool, per_batch: int, repeat: int) -> dict[str, Any]:
    distinct = 64 if quick else 256
    total = 1_000 if quick else 5_000
    batches = make_batches(distinct, per_batch)
    baseline = bench_baseline(batches, rounds=2 if quick else 8)
    codec = bench_codec(batches, rounds=2 if quick else 8)
    runs = [bench_end_to_end(distinct, per_batch, total, timeout_s=60) for _ in range(repeat)]
    best = max(runs, key=lambda r: r["pages_per_s"])
    return {
        "pages_per_event": PAGES,
        "events_per_batch": per_batch,
        "baseline_plain_msgpack": baseline,
        "codec_one_thread": codec,
        "end_to_end": best,
        "end_to_end_all_runs_pages_per_s": [r["pages_per_s"] for r in runs],
        "index_apply": bench_index(batches),
        "ratio_end_to_end_vs_baseline": round(best["pages_per_s"] / baseline["pages_per_s"], 2),
        "target_pages_per_s": 2_000_000,
        "meets_target": best["pages_per_s"] >= 2_000_000 and best["subscriber_keeps_up"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixcache.bench events", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    parser.add_argument("--events-per-batch", type=int, default=8, help="BlockStored events per batch")
    parser.add_argument("--repeat", type=int, default=3, help="end-to-end runs; the best is reported")
    args = parser.parse_args(argv)
    result = run(args.quick, args.events_per_batch, max(1, args.repeat))
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

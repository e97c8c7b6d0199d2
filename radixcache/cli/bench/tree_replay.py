"""The tree benchmark's mixed multi-turn replay: chats sharing a system
prompt, turns interleaved at random; each request matches + locks, makes
room, unlocks and inserts, at tree level (``RadixTree`` + ``PageAllocator``),
next to the naive cache, and with events recorded and published.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from radixcache.cli.bench.naive import NaiveCache
from radixcache.namespace import DEFAULT_NAMESPACE as NS
from radixcache.recorder import EventRecorder
from radixcache.transfer import PageAllocator
from radixcache.tree.policies import make_eviction_policy
from radixcache.tree.radix_tree import RadixTree

P = 16  # tokens per page
SYSTEM = 1024  # tokens of the shared system prompt
VOCAB = 32000
STEP = 16  # requests per engine step in the replay (one event batch per step)


def _ratio(naive: float, ours: float) -> float:
    return round(naive / ours, 1) if ours else float("inf")


def _replay_ours(
    seqs: list[np.ndarray], capacity: int, events: Any
) -> tuple[float, int, int]:
    """The tree's side of the mixed replay; with ``events`` (a publisher), page
    events are recorded and published, one batch per step of STEP requests."""
    tree = RadixTree(P, make_eviction_policy("lru"))
    recorder = EventRecorder(tree)
    if events is not None:
        tree.recorder = recorder
    pool = PageAllocator(capacity)
    hit = 0
    total = 0
    total_req = 0
    t0 = time.perf_counter()
    for seq in seqs:
        m = tree.match(NS, seq)
        node = m.last_device_node
        if node is not None:
            tree.lock(node)
        hit += m.device_len
        total += seq.size
        need = seq.size // P - m.device_pages.size
        if need > pool.free_count:
            pool.free(tree.evict(need - pool.free_count).device_pages)
        pages = pool.allocate(need)
        assert pages is not None
        if node is not None:  # as RadixCache.commit: unlock, then insert
            tree.unlock(node)
        res = tree.insert(NS, seq[: seq.size - seq.size % P], np.concatenate([m.device_pages, pages]))
        if res.existing_pages > m.device_pages.size:
            pool.free(pages[: res.existing_pages - m.device_pages.size])
        if events is not None and (total_req := total_req + 1) % STEP == 0:
            events.publish(recorder.take())
    if events is not None:
        events.publish(recorder.take())
    return time.perf_counter() - t0, hit, total


def replay_requests(conversations: int, turns: int, seed: int = 1) -> list[np.ndarray]:
    """Multi-turn chats sharing a system prompt, turns interleaved at random:
    each request's whole token sequence (each turn adds 256 tokens)."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, SYSTEM, dtype=np.int32)
    convs = [system.copy() for _ in range(conversations)]
    schedule = [c for _ in range(turns) for c in rng.permutation(conversations).tolist()]
    seqs = []  # built before timing
    for c in schedule:
        convs[c] = np.concatenate([convs[c], rng.integers(0, VOCAB, 256, dtype=np.int32)])
        seqs.append(convs[c])
    return seqs


def mixed_replay(conversations: int, turns: int, capacity: int, seed: int = 1) -> dict[str, Any]:
    """Multi-turn chats: each request matches + locks, makes room, unlocks and
    inserts (unlocking just before the insert, as ``RadixCache.commit`` does,
    lets a chat's leaf grow in place)."""
    seqs = replay_requests(conversations, turns, seed)
    schedule = seqs

    _replay_ours(seqs, capacity, events=None)  # warm-up: first-touch page faults
    _, hit, total = _replay_ours(seqs, capacity, events=None)

    naive = NaiveCache(P)
    free = capacity
    next_page = 0
    t0 = time.perf_counter()
    for seq in seqs:
        length, mpages, nnode = naive.match(seq)
        naive.lock(nnode)
        need = seq.size // P - len(mpages)
        if need > free:
            free += len(naive.evict(need - free))
        new = list(range(next_page, next_page + need))
        next_page += need
        existing, _ = naive.insert(seq[: seq.size - seq.size % P], mpages + new)
        free -= need - max(0, existing - len(mpages))
        naive.unlock(nnode)
    base = time.perf_counter() - t0
    n = len(schedule)
    with_events = _events_overhead(seqs, capacity)
    ours = with_events.pop("_plain_s")
    return {
        "requests": n,
        "capacity_pages": capacity,
        "token_hit_ratio": round(hit / total, 3),
        "ours_req_per_s": round(n / ours),
        "naive_req_per_s": round(n / base),
        "speedup": _ratio(base, ours),
        **with_events,
    }


def _events_overhead(seqs: list[np.ndarray], capacity: int) -> dict[str, Any]:
    """The replay without events, with recording only, and with recording and
    publishing over ZMQ on loopback, interleaved 3 times; medians."""
    from radixcache.events import PublisherConfig, ZmqEventPublisher

    class Drain:
        def publish(self, events: list[Any]) -> None:
            pass

    pub = ZmqEventPublisher(
        PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    )
    try:
        plain, rec, full = [], [], []
        for _ in range(3):
            plain.append(_replay_ours(seqs, capacity, None)[0])
            rec.append(_replay_ours(seqs, capacity, Drain())[0])
            full.append(_replay_ours(seqs, capacity, pub)[0])
        stats = pub.stats()
    finally:
        pub.close()
    base, r, f = statistics.median(plain), statistics.median(rec), statistics.median(full)
    n = len(seqs)
    return {
        "_plain_s": base,
        "requests_per_event_batch": STEP,
        "events_record_req_per_s": round(n / r),
        "events_record_and_publish_req_per_s": round(n / f),
        "events_record_overhead": round(r / base - 1, 3),
        "events_record_and_publish_overhead": round(f / base - 1, 3),
        "events_batches_published": stats.published,
        "events_batches_dropped": stats.dropped,
    }

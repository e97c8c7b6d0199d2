"""The ``pool`` benchmark's Valkey part: ValkeyStorage against redis-py on the same bytes.

What each figure is: radixcache/cli/bench/pool.py. Besides the clear pools
(one page per value, then ``--chunk-pages``), a pool whose records are
sealed with AES-256-GCM (``key_file``; its own key prefix) gives
``sealed_put`` / ``sealed_get``, and ``sealed_ratios`` divides them by the
clear one-page pool's (target: >= 0.85 both ways).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import redis
import torch

from radixcache.cli.bench import rate, timed
from radixcache.cli.bench.pools.pages import Pages
from radixcache.offload import ModelFingerprint, ValkeyConfig, ValkeyStorage
from radixcache.offload.storage import record as rec
from radixcache.offload.valkey.nodes import PageConnection, PageSSLConnection, Scattered
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec

LOOKUP_SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.float16, page_size=16)
TARGETS = {"put_vs_raw_set": 0.9, "get_vs_raw_get": 1.0}
SEALED_TARGET = 0.85  # sealed (encrypted) pool rate / clear pool rate, both ways
LOOKUP_ROUND_TRIPS_TARGET = 2


class _PagePool(redis.ConnectionPool):
    """redis-py's pool with the backend's packer (large values sent as they are)."""

    def __init__(self, **kwargs: Any) -> None:
        tls = issubclass(kwargs.get("connection_class", redis.Connection), redis.SSLConnection)
        kwargs["connection_class"] = PageSSLConnection if tls else PageConnection
        super().__init__(**kwargs)


def _raw_client(url: str, tuned: bool) -> Any:
    """A plain redis-py client of the pool at ``url`` (the baseline): ``tuned``
    sends large values as the backend does, otherwise with redis-py's defaults."""
    cfg = ValkeyConfig.from_url(url)
    auth: dict[str, Any] = {"username": cfg.username, "password": cfg.password}
    if cfg.cluster:
        extra: dict[str, Any] = {"connection_pool_class": _PagePool} if tuned else {}
        scheme = "rediss" if cfg.tls else "redis"  # a node URL: every node's pool is built by extra
        return redis.cluster.RedisCluster(url=f"{scheme}://{cfg.host}:{cfg.port}", **auth, **extra)
    kind = (PageSSLConnection if cfg.tls else PageConnection) if tuned else (
        redis.SSLConnection if cfg.tls else redis.Connection
    )
    pool = redis.ConnectionPool(connection_class=kind, host=cfg.host, port=cfg.port, db=cfg.db, **auth)
    return redis.Redis(connection_pool=pool)


def _raw(pages: Pages, batch: int) -> tuple[Callable[[Any, bool], None], Callable[[Any, int], None]]:
    """The raw client's put and get of ``pages`` (see the module docstring)."""
    digest = pages.fingerprint.digest()
    heads = []
    for i in range(pages.n):
        head = bytearray(rec.head_size(len(digest) + 16, 0, pages.spec.page_size))
        rec.encode_head(head, key=digest + pages.keys[i], ns_tag=bytes(16), tokens=pages.tokens[i],
                        kv=pages.src[i], seq=i)
        heads.append(bytes(head))
    keys = [b"raw:" + key for key in pages.keys]
    dst = pages.dst.as_bytes()
    kv_at = len(heads[0])

    def put(client: Any, tuned: bool = True) -> None:
        for s in range(0, pages.n, batch):
            pipe = client.pipeline(transaction=False)
            for i in range(s, min(s + batch, pages.n)):
                if tuned:  # the head, then the page itself: no copy
                    pipe.set(keys[i], Scattered(heads[i], pages.src[i].data))
                else:  # redis-py's defaults take bytes: the value is copied together
                    pipe.set(keys[i], heads[i] + pages.src[i].tobytes())
            pipe.execute()

    def get(client: Any, threads: int) -> None:
        def part(starts: list[int]) -> None:
            for s in starts:
                pipe = client.pipeline(transaction=False)
                for i in range(s, min(s + batch, pages.n)):
                    pipe.get(keys[i])
                for i, value in zip(range(s, pages.n), pipe.execute()):
                    dst[i] = np.frombuffer(value, dtype=np.uint8, offset=kv_at)  # into the page

        starts = list(range(0, pages.n, batch))
        with ThreadPoolExecutor(threads) as workers:  # one connection each, at once
            list(workers.map(part, [starts[k::threads] for k in range(threads)]))

    return put, get


def bench_spec(
    url: str, spec: KVSpec, total_mib: int, request_pages: int, batch: int, repeat: int,
    chunk_pages: list[int], key_file: str,
) -> dict[str, Any]:  # fmt: skip
    """The figures of one page size (see radixcache/cli/bench/pool.py)."""
    pages = Pages(spec, total_mib, request_pages)
    configs = {n: ValkeyConfig.from_url(url, batch_pages=batch, chunk_pages=n) for n in [1, *chunk_pages]}
    pools = {str(n): ValkeyStorage(config, spec, pages.fingerprint) for n, config in configs.items()}
    pools["sealed"] = ValkeyStorage(
        ValkeyConfig.from_url(url, batch_pages=batch, chunk_pages=1, key_prefix=b"rxenc:", key_file=key_file),
        spec, pages.fingerprint,
    )  # fmt: skip: records sealed with AES-256-GCM, under their own key prefix
    client, plain = _raw_client(url, tuned=True), _raw_client(url, tuned=False)
    raw_put, raw_get = _raw(pages, batch)
    threads = configs[1].num_readers  # connections the pool's gets use at once (see below)
    runs: dict[str, list[float]] = {}
    try:
        for round_ in range(repeat + 1):  # round 0 warms up
            client.flushall()
            times = {
                "raw_set_default": timed(lambda: raw_put(plain, False)),
                "raw_set": timed(lambda: raw_put(client, True)),
                "raw_get_default": timed(lambda: raw_get(plain, threads)),
                "raw_get": timed(lambda: raw_get(client, threads)),
            }
            # clear and sealed take turns going first (the server's memory
            # grows with each: the later one may meet more page faults there)
            clear = [n for n in pools if n != "sealed"]
            for n in ["sealed", *clear] if round_ % 2 else [*clear, "sealed"]:
                pool = pools[n]
                client.flushall()
                times[f"pool_put_{n}"] = timed(lambda: pages.put(pool))
                pages.dst.as_bytes()[:] = 0
                times[f"pool_get_{n}"] = timed(lambda: pages.get(pool))
                assert pages.exact(), f"pool pages ({n}) differ from what was put"
            for name, t in times.items():
                runs.setdefault(name, []).extend([t] if round_ else [])
        stats = pools["1"].stats()
        connections = {n: pool.pool_stats().connects for n, pool in pools.items()}
    finally:
        for pool in pools.values():
            pool.close()
        client.flushall()
        client.close()
        plain.close()
    nbytes = pages.n * spec.page_bytes
    fig = {name: rate(nbytes, pages.n, t) for name, t in runs.items()}

    def ratios(put: str, get: str) -> dict[str, Any]:
        return {
            "put_vs_raw_set": round(fig[put]["gb_per_s"] / fig["raw_set"]["gb_per_s"], 3),
            "get_vs_raw_get": round(fig[get]["gb_per_s"] / fig["raw_get"]["gb_per_s"], 3),
            "targets": TARGETS,
        }

    return {
        "spec": spec.describe(),
        "page_bytes": spec.page_bytes,
        "pages": pages.n,
        "request_pages": request_pages,
        "batch_pages": batch,
        "raw_get_connections": threads,
        "pool_connections_opened": connections,
        **{name: fig[name] for name in ("raw_set", "raw_set_default", "raw_get", "raw_get_default")},
        "pool_put": fig["pool_put_1"],
        "pool_get": fig["pool_get_1"],
        "ratios": ratios("pool_put_1", "pool_get_1"),
        "sealed_put": fig["pool_put_sealed"],
        "sealed_get": fig["pool_get_sealed"],
        "sealed_ratios": {
            "sealed_put_vs_put": round(fig["pool_put_sealed"]["gb_per_s"] / fig["pool_put_1"]["gb_per_s"], 3),
            "sealed_get_vs_get": round(fig["pool_get_sealed"]["gb_per_s"] / fig["pool_get_1"]["gb_per_s"], 3),
            "target": SEALED_TARGET,
        },
        "chunked": {
            str(n): {"pool_put": fig[f"pool_put_{n}"], "pool_get": fig[f"pool_get_{n}"],
                     "ratios": ratios(f"pool_put_{n}", f"pool_get_{n}")}
            for n in chunk_pages
        },  # fmt: skip
        "pool_counters": {"hits": stats.hits, "corrupt": stats.corrupt, "failed_ops": stats.failed_ops},
    }


def bench_lookup(url: str, pages: int, repeat: int) -> dict[str, Any]:
    spec = LOOKUP_SPEC
    fingerprint = ModelFingerprint("bench-model", spec.describe(), 0)
    host = HostKVBuffer(spec, pages)
    tokens = np.arange(pages * spec.page_size, dtype=np.int32).reshape(pages, spec.page_size)
    keys = [b"L" + i.to_bytes(4, "little") * 3 + b"xyz" for i in range(pages)]
    pool = ValkeyStorage(ValkeyConfig.from_url(url), spec, fingerprint)
    try:
        ticket = pool.put(keys, tokens, host, np.arange(pages, dtype=np.int32), b"bench")
        assert ticket.wait(600) and ticket.result() == pages
        times, trips = [], []
        for _ in range(max(5, repeat * 5)):
            start = time.perf_counter()
            found = pool.longest_prefix(keys)
            times.append(time.perf_counter() - start)
            trips.append(pool.pool_stats().lookup_round_trips)
            assert found == pages, f"lookup found {found} of {pages} pages"
        half = pages // 2
        missing = [*keys[:half], b"absent-key-0000", *keys[half + 1 :]]
        assert pool.longest_prefix(missing) == half
        partial_trips = pool.pool_stats().lookup_round_trips
    finally:
        pool.close()
    return {
        "pages": pages,
        "round_trips": max(trips),
        "round_trips_with_a_miss_half_way": partial_trips,
        "median_ms": round(statistics.median(times) * 1e3, 3),
        "target_round_trips": LOOKUP_ROUND_TRIPS_TARGET,
    }

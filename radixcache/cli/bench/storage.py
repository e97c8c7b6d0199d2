"""Storage-tier benchmark: LMDB page writes and reads against plain files.

Every figure is measured in the same run, on the same bytes, in one temporary
directory on the same disk, so the ratios hold even where absolute rates
drift from run to run::

    seq_fsync       one file: write() every page in order, one fsync at the end
    file_per_page   one file per page: open, write, fsync, close;
                    read: open, readinto the host page
    lmdb            LmdbStorage.put of --request-pages pages per request, all
                    queued at once ("safe": a synced commit per write batch);
                    LmdbStorage.get of the same requests into host pages, with
                    the records in the OS page cache (checksums verified), on
                    the store's two reader threads (the default) and, as
                    ``lmdb_1_reader``, on one (like the plain file loop);
                    the bench waits on each ticket without a timeout, as an
                    engine's blocking get does, so its thread reads queued
                    requests too (``PageReader.helping``);
                    the default config: the KV bytes of these pages (64 KiB
                    and more) in the slot file (offload/lmdb/slots.py)

Writes run in interleaved rounds (seq, file-per-page, LMDB safe, LMDB fast,
then again), after one untimed warm-up round, so that the disk's drift weighs
on all alike; each figure is the median round, and ``ratios_fastest_runs``
compares the fastest rounds (on a shared machine interference only adds time).

Reads of pages in the OS page cache run ``READ_ROUNDS`` interleaved rounds
per ``--repeat``: a read round of 64 MiB lasts a few tens of milliseconds,
so three rounds gave a median that one disturbance could move. They also
time ``file_per_page_checksum`` (the file read plus the KV checksum a record
v3's read verifies, offload/storage/kv_checksum.py), ``checksum_only`` (that
checksum over pages already in memory) and ``crc32_only`` (zlib's crc32 over
them: what a record v2's read verified).

Encrypted at rest: ``lmdb_sealed`` writes and reads the same pages as
``lmdb_safe`` with a key file (records sealed with AES-256-GCM, one GCM
pass instead of the copy and the KV checksum); ``gcm_only`` times that GCM
pass alone over pages in memory. ``ratios`` give sealed / clear;
``sealing_cpu`` gives the same comparison for the record codec alone in CPU
time (radixcache/cli/bench/sealing.py), which a loaded machine disturbs less.

Targets (docs: "Figures that count as fast"): LMDB writes >= 80% of the
fsync'd sequential write rate; reads of cached pages into host pages at
least as fast as the one-file-per-page store; sealed writes and reads >= 85%
of clear ones. Each spec's ``targets`` lists every ratio beside its target
and its verdict (marked indicative on a --quick or loaded run).

    radixcache bench storage [--quick] [--total-mib 64] [--repeat 3]
                                       [--specs small,realistic] [--dir PARENT]

About seven seconds with the defaults on a 2-core machine; ``--quick`` about three.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixcache.cli.bench import rate, run_note, timed, verdict, with_note
from radixcache.cli.options import positive_int
from radixcache.cli.parser import CliParser
from radixcache.native import hand_to_storage
from radixcache.offload.storage import kv_checksum
from radixcache.offload import LmdbStorage, ModelFingerprint, StorageConfig
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
WRITE_TARGET = 0.8  # LMDB write rate / fsync'd sequential write rate
READ_TARGET = 1.0  # LMDB reads of cached pages into host pages / one file per page
hand_to_storage()  # the stores measured copy and sum records as the engine's do
SEALED_TARGET = 0.85  # sealed (encrypted) / clear LMDB throughput, writes and reads
READ_ROUNDS = 5  # read rounds per --repeat (a read round is short: see the docstring)
# The sealed figures need the encryption extra; without it they are reported
# as skipped and the clear ones still run.
try:
    import cryptography  # noqa: F401  (the package alone: its ciphers load when used)

    SEALING = True
except ImportError:
    SEALING = False
NO_SEALING = "skipped: cryptography is not installed (pip install 'radixcache[encryption]')"


def _fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _bench_spec(
    name: str, spec: KVSpec, root: Path, total: int, request: int, repeat: int, note: str | None
) -> dict[str, Any]:
    n = max(request, total // spec.page_bytes // request * request)
    nbytes = n * spec.page_bytes
    src = HostKVBuffer(spec, n)
    raw = src.as_bytes()
    raw[:] = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8).reshape(
        raw.shape
    )
    dst = HostKVBuffer(spec, n)
    out = dst.as_bytes()
    if SEALING:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        aead = AESGCM(os.urandom(32))  # gcm_only: the cipher sealed records use
    nonce = os.urandom(12)
    sealed_out = bytearray(spec.page_bytes + 16)
    keys = [hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest() for i in range(n)]
    tokens = np.arange(n * spec.page_size, dtype=np.int32).reshape(n, spec.page_size)
    pages = np.arange(n, dtype=np.int32)
    fingerprint = ModelFingerprint("bench", spec.describe(), 0)
    seq_dir, fpp_dir = root / f"{name}-seq", root / f"{name}-files"
    stores: dict[str, LmdbStorage] = {}
    key_file = root / "bench.key"  # a fresh random key: the sealed store's
    key_file.write_text(os.urandom(32).hex() + "\n")
    key_file.chmod(0o600)

    def seq_write() -> None:
        with open(seq_dir / "pages.bin", "wb", buffering=0) as f:
            for i in range(n):
                f.write(raw[i].data)
            os.fsync(f.fileno())

    def fpp_write() -> None:
        for i in range(n):
            fd = os.open(fpp_dir / f"{i}.page", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, raw[i].data)
                os.fsync(fd)
            finally:
                os.close(fd)

    def fpp_read() -> None:
        for i in range(n):
            with open(fpp_dir / f"{i}.page", "rb", buffering=0) as f:
                f.readinto(out[i].data)

    def fpp_read_checksum() -> None:
        for i in range(n):
            with open(fpp_dir / f"{i}.page", "rb", buffering=0) as f:
                f.readinto(out[i].data)
            kv_checksum(out[i])

    def checksum_only() -> None:
        for i in range(n):
            kv_checksum(raw[i])

    def crc_only() -> None:
        for i in range(n):
            zlib.crc32(raw[i].data)

    def gcm_only() -> None:  # the sealed records' GCM pass alone, pages in memory
        for i in range(n):
            aead.encrypt_into(nonce, raw[i], None, sealed_out)

    def lmdb_open(durability: str, which: str, readers: int = 2) -> Callable[[], None]:
        """Opens a fresh store named ``which`` (a key of ``stores``; sealed
        with the key file when it starts with "sealed")."""

        def setup() -> None:
            if which in stores:
                stores.pop(which).close()
            path = root / f"{name}-lmdb-{which}"
            _fresh(path)
            config = StorageConfig(
                path=path, capacity_bytes=2 * nbytes + (64 << 20), durability=durability,
                num_readers=readers, key_file=str(key_file) if which.startswith("sealed") else None,
            )  # fmt: skip
            stores[which] = LmdbStorage(config, spec, fingerprint)

        return setup

    def lmdb_write(which: str) -> Callable[[], None]:
        def run() -> None:
            store = stores[which]
            tickets = [
                store.put(
                    keys[j : j + request], tokens[j : j + request], src, pages[j : j + request], b""
                )
                for j in range(0, n, request)
            ]
            for t in tickets:
                t.wait()
                assert t.result() == request, t.error

        return run

    def lmdb_read(which: str) -> Callable[[], None]:
        def run() -> None:
            store = stores[which]
            tickets = [
                store.get(
                    keys[j : j + request], tokens[j : j + request], dst, pages[j : j + request]
                )
                for j in range(0, n, request)
            ]
            for t in tickets:
                t.wait()
                assert t.result() == request, t.error

        return run

    # Writes: the methods take turns within each round, so that the disk's
    # drift over the run weighs on all of them alike.
    writes: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "seq_fsync": (seq_write, lambda: _fresh(seq_dir)),
        "file_per_page": (fpp_write, lambda: _fresh(fpp_dir)),
        "lmdb_safe": (lmdb_write("safe"), lmdb_open("safe", "safe")),
        "lmdb_fast": (lmdb_write("fast"), lmdb_open("fast", "fast")),
        "lmdb_sealed": (lmdb_write("sealed"), lmdb_open("safe", "sealed")),
    }
    if not SEALING:
        del writes["lmdb_sealed"]
    write_s: dict[str, list[float]] = {k: [] for k in writes}
    for round_ in range(repeat + 1):  # round 0 warms up (its first LMDB runs are slow here)
        for method, (run, setup) in writes.items():
            seconds = timed(run, setup)
            if round_:
                write_s[method].append(seconds)
    # Reads of pages in the OS page cache (each warmed and checked first).
    # ``file_per_page_checksum`` adds to the plain file read the KV checksum a
    # record's read verifies; ``checksum_only`` and ``crc32_only`` time the
    # record v3 and v2 checksums alone over pages already in memory. One more
    # store, written once untimed, reads on one reader thread.
    lmdb_open("fast", "1_reader", readers=1)()
    lmdb_write("1_reader")()
    reads = {
        "file_per_page": fpp_read,
        "file_per_page_checksum": fpp_read_checksum,
        "checksum_only": checksum_only,
        "crc32_only": crc_only,
        "lmdb_safe": lmdb_read("safe"),
        "lmdb_fast": lmdb_read("fast"),
        "lmdb_1_reader": lmdb_read("1_reader"),
        "lmdb_sealed": lmdb_read("sealed"),
        "gcm_only": gcm_only,
    }
    if not SEALING:
        del reads["lmdb_sealed"], reads["gcm_only"]
    read_s: dict[str, list[float]] = {k: [] for k in reads}
    for method, run in reads.items():
        out[:] = 0
        run()
        if not method.endswith("_only"):  # (the *_only figures read into nothing)
            assert np.array_equal(out, raw), f"{method} read back wrong bytes"
    for _ in range(READ_ROUNDS * repeat):  # interleaved rounds, as for writes
        for method, run in reads.items():
            read_s[method].append(timed(run))
    if SEALING:
        from radixcache.cli.bench.sealing import codec_cpu

        sealing_cpu: dict[str, Any] = codec_cpu(
            fingerprint, raw[: max(1, (32 << 20) // spec.page_bytes)], tokens, repeat)
    else:
        sealing_cpu = {"skipped": NO_SEALING}
    txns = {d: stores[d].stats().write_txns for d in stores}
    for store in stores.values():
        store.close()

    w = {k: rate(nbytes, n, v) for k, v in write_s.items()}
    r = {k: rate(nbytes, n, v) for k, v in read_s.items()}
    write_ratio = w["lmdb_safe"]["gb_per_s"] / w["seq_fsync"]["gb_per_s"]
    read_ratio = r["lmdb_safe"]["gb_per_s"] / r["file_per_page"]["gb_per_s"]
    sealed_write = w["lmdb_sealed"]["gb_per_s"] / w["lmdb_safe"]["gb_per_s"] if SEALING else None
    sealed_read = r["lmdb_sealed"]["gb_per_s"] / r["lmdb_safe"]["gb_per_s"] if SEALING else None
    best = {k: min(v) for k, v in write_s.items()}
    return {
        "page_bytes": spec.page_bytes,
        "spec": spec.describe(),
        "pages": n,
        "bytes": nbytes,
        "request_pages": request,
        "read_rounds": READ_ROUNDS * repeat,
        "write": w,
        "read": r,
        "lmdb_write_txns_last_run": txns,
        "sealing_cpu": sealing_cpu,
        "ratios": {
            "lmdb_write_vs_seq_fsync": round(write_ratio, 3),
            "lmdb_fast_write_vs_seq_fsync": round(
                w["lmdb_fast"]["gb_per_s"] / w["seq_fsync"]["gb_per_s"], 3
            ),
            "lmdb_write_vs_file_per_page": round(
                w["lmdb_safe"]["gb_per_s"] / w["file_per_page"]["gb_per_s"], 3
            ),
            "lmdb_read_vs_file_per_page": round(read_ratio, 3),
            "lmdb_1_reader_read_vs_file_per_page": round(
                r["lmdb_1_reader"]["gb_per_s"] / r["file_per_page"]["gb_per_s"], 3
            ),
            "lmdb_read_vs_file_per_page_checksum": round(
                r["lmdb_safe"]["gb_per_s"] / r["file_per_page_checksum"]["gb_per_s"], 3
            ),
            "sealed_write_vs_clear": _r(sealed_write),
            "sealed_read_vs_clear": _r(sealed_read),
        },
        "ratios_fastest_runs": {
            "lmdb_write_vs_seq_fsync": round(best["seq_fsync"] / best["lmdb_safe"], 3),
            "lmdb_fast_write_vs_seq_fsync": round(best["seq_fsync"] / best["lmdb_fast"], 3),
            "sealed_write_vs_clear": _r(best["lmdb_safe"] / best["lmdb_sealed"]) if SEALING else None,
            "sealed_read_vs_clear": _r(min(read_s["lmdb_safe"]) / min(read_s["lmdb_sealed"]))
            if SEALING else None,
        },
        "targets": _rows([
            ("LMDB write (safe) / fsync'd sequential write", write_ratio, WRITE_TARGET),
            ("LMDB cached read / one file per page", read_ratio, READ_TARGET),
            ("sealed write / clear write (LMDB)", sealed_write, SEALED_TARGET),
            ("sealed read / clear read (LMDB)", sealed_read, SEALED_TARGET),
        ], note),
    }


def _rows(ratios: list[tuple[str, float | None, float]], note: str | None) -> list[dict[str, Any]]:
    """Each ratio beside its target and its verdict (None: not measured)."""
    return [
        {"figure": figure, "ratio": None if got is None else round(got, 3), "target": f">= {want:g}x",
         "result": "skipped (not measured)" if got is None else verdict(got >= want, note)}
        for figure, got, want in ratios
    ]


def run(
    specs: Sequence[str] = ("small", "realistic"),
    total_mib: int = 64,
    request_pages: int = 16,
    repeat: int = 3,
    parent_dir: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """Measure every figure for each named spec; returns the report."""
    unknown = [s for s in specs if s not in SPECS]
    if unknown or not specs:
        raise ValueError(f"unknown spec(s) {unknown}; choose from {sorted(SPECS)}")
    if total_mib <= 0 or request_pages <= 0 or repeat <= 0:
        raise ValueError("total_mib, request_pages and repeat must be positive")
    report: dict[str, Any] = {
        "benchmark": "storage",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "repeat": repeat,
        "targets": {
            "lmdb_write_vs_seq_fsync": WRITE_TARGET,
            "lmdb_read_vs_file_per_page": READ_TARGET,
            "sealed_vs_clear": SEALED_TARGET,
        },
        "specs": {},
    }
    with tempfile.TemporaryDirectory(prefix="radixcache-bench-", dir=parent_dir) as tmp:
        for name in specs:
            report["specs"][name] = _bench_spec(
                name, SPECS[name], Path(tmp), total_mib << 20, request_pages, repeat, note
            )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = CliParser(prog="radixcache bench storage", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="16 MiB, one run (smoke test)")
    parser.add_argument("--total-mib", type=positive_int, default=64,
                        help="MiB of pages per figure")
    parser.add_argument("--request-pages", type=positive_int, default=16, help="pages per put/get")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per figure (median)")
    parser.add_argument("--specs", default="small,realistic",
                        help=f"comma-separated KV geometries, of {', '.join(sorted(SPECS))}")
    parser.add_argument("--dir", default=None,
                        help="parent of the temporary directory (default: the system's)")
    args = parser.parse_args(argv)
    note = run_note(args.quick)  # before the run adds its own load
    try:
        report = run(
            specs=[s for s in args.specs.split(",") if s],
            total_mib=16 if args.quick else args.total_mib,
            request_pages=args.request_pages,
            repeat=1 if args.quick else args.repeat,
            parent_dir=args.dir,
            note=note,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(with_note(report, note), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _r(ratio: float | None) -> float | None:
    """A ratio rounded for the JSON, None (not measured) kept."""
    return None if ratio is None else round(ratio, 3)

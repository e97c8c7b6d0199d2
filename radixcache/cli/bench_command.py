"""``radixcache bench NAME [options]``: run one benchmark (one JSON object on
stdout); ``radixcache bench NAME -h`` lists its options."""

from __future__ import annotations

import argparse
import importlib

from radixcache.cli.parser import one_line_usage_errors

BENCHMARKS = {
    "tree": "the engine against a naive cache (match, insert, evict, replay, memory)",
    "copy": "the copy engine against a plain copy of the same bytes",
    "storage": "the LMDB tier against plain files, in the clear and sealed (encrypted)",
    "events": "the event stream: encode, send over loopback, decode",
    "pool": "the Valkey pool backend against the raw client (the valkey extra)",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` to the ``radixcache`` command line."""
    p = subparsers.add_parser("bench", help="run a benchmark (JSON on stdout)",
                              description=__doc__)
    p.add_argument("name", choices=list(BENCHMARKS), metavar="NAME",
                   help="; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))
    p.add_argument("options", nargs=argparse.REMAINDER,
                   help="the benchmark's options (radixcache bench NAME -h)")
    p.set_defaults(entry="radixcache.cli.bench_command:run")


def run(args: argparse.Namespace) -> int:
    """The benchmark's own ``main``; its parser's errors come out on one line."""
    module = importlib.import_module(f"radixcache.cli.bench.{args.name}")
    try:
        with one_line_usage_errors():
            code: int = module.main(args.options)
    except SystemExit as done:  # -h, or a usage error already reported
        return done.code if isinstance(done.code, int) else 2
    return code

"""The ``radixcache replay`` subcommand: its options (this module), the
replaying (``radixcache.cli.replay``), reports, sweeps and plots
(``radixcache.cli.replay_plot``)."""

from __future__ import annotations

import argparse

from radixcache.cli.replay import BLOCK_SIZE
from radixcache.cli.replay import __doc__ as REPLAY_DOC
from radixcache.cli.replay_plot import run_command
from radixcache.eviction import eviction_policy_names


# ---------------------------------------------------------------------- command line
def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``replay`` to the ``radixcache`` command line."""
    p = subparsers.add_parser(
        "replay", help="replay a Mooncake trace through the cache (hit ratios per tier)",
        description=REPLAY_DOC, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="Mooncake JSONL trace (timestamp, input_length, "
                   "output_length, hash_ids per line)")
    p.add_argument("--page-size", type=int, default=512,
                   help="tokens per page, a power of two (default 512: one trace block)")
    p.add_argument("--device-pages", type=int, default=None,
                   help="device pool in pages (default: 2**20 tokens' worth, 2048 pages of 512)")
    host = p.add_mutually_exclusive_group()
    host.add_argument("--host-pages", type=int, default=0, help="host pool in pages (0: none)")
    host.add_argument("--host-ratio", type=float, default=None,
                      help="host pool as a multiple of the device pool (scales in a device sweep)")
    p.add_argument("--storage-pages", type=int, default=0,
                   help="LMDB storage capacity in pages (0: none; needs a host tier)")
    p.add_argument("--storage-path", default=None,
                   help="LMDB directory (default: a temporary one; an existing store is reused)")
    p.add_argument("--write-policy", default="write_through",
                   choices=["write_through", "write_through_selective", "write_back"])
    p.add_argument("--write-threshold", type=int, default=2,
                   help="hits before write_through_selective copies a node to host")
    p.add_argument("--eviction-policy", default="lru", choices=eviction_policy_names())
    p.add_argument("--block-size", type=int, default=BLOCK_SIZE,
                   help="tokens per trace hash block (Mooncake: 512)")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="leading fraction of requests that fill the cache but are not counted")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--decode", action="store_true",
                   help="also generate output_length tokens per request (off by default: the "
                   "trace's outputs cannot be hit, they only take room)")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the report as JSON ('-': stdout)")
    p.add_argument("--sweep", default=None, metavar="[TIER=]N,N,...",
                   help="replay once per capacity; TIER is device (default), host or storage")
    p.add_argument("--out", default="replay-sweep", metavar="PREFIX",
                   help="sweep output: PREFIX.csv, PREFIX.json, PREFIX.png")
    p.add_argument("--no-plot", action="store_true", help="sweep without the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_command(args)

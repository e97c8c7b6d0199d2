"""The ``radixcache replay`` subcommand: its options (this module), the
replaying (``radixcache.cli.replay.run``), reports, sweeps and plots
(``radixcache.cli.replay.plot``)."""

from __future__ import annotations

import argparse

from radixcache.cli.config_option import add_config_option
from radixcache.cli.hicache_options import add_host_pool_options, add_policy_options
from radixcache.cli.options import fraction, non_negative_int, positive_int, power_of_two
from radixcache.cli.quota_option import add_quotas_option
from radixcache.cli.replay.trace import BLOCK_SIZE
from radixcache.cli.replay.run import __doc__ as REPLAY_DOC
from radixcache.cli.replay.capacity import DEFAULT_MODEL, MODEL_PRESETS
from radixcache.cli.replay.plot import run_command
from radixcache.tree.policies import eviction_policy_names


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``replay`` to the ``radixcache`` command line."""
    p = subparsers.add_parser(
        "replay", help="replay a Mooncake trace through the cache (hit ratios per tier)",
        description=REPLAY_DOC,
    )
    add_config_option(p)
    p.add_argument("trace", help="Mooncake JSONL trace (timestamp, input_length, "
                   "output_length, hash_ids per line)")
    p.add_argument("--page-size", type=power_of_two, default=512,
                   help="tokens per page, a power of two (512: one trace block)")
    p.add_argument("--device-pages", type=positive_int, default=None,
                   help="device pool in pages (None: 2**20 tokens' worth, 2048 pages of 512)")
    add_host_pool_options(p, 0, "host pool in pages (0: none)",
                          ratio_flags=("--host-ratio", "--hicache-ratio"))
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv-bytes-per-token", type=positive_int, default=None,
                    help="the modelled KV size per token: sweeps show capacity in GB with it, "
                    "and --hicache-size is turned into pages with it (None: --model's)")
    kv.add_argument("--model", default=None, choices=sorted(MODEL_PRESETS),
                    help=f"a model preset for the KV size per token, fp16 (None: {DEFAULT_MODEL}, "
                    f"{MODEL_PRESETS[DEFAULT_MODEL]:,} B)")
    p.add_argument("--storage-pages", type=non_negative_int, default=0,
                   help="LMDB storage capacity in pages (0: none; needs a host tier)")
    p.add_argument("--storage-path", default=None,
                   help="LMDB directory (None: a temporary one; an existing store is reused)")
    add_policy_options(p, "write_through", "wait_complete",
                       prefetch_help="prefetch policy of the tiers; the replay applies every "
                       "load before a request goes on, so all give the same figures")
    p.add_argument("--write-threshold", type=positive_int, default=2,
                   help="hits before write_through_selective copies a node to host")
    p.add_argument("--eviction-policy", default="lru", choices=eviction_policy_names(),
                   help="device eviction order")
    add_quotas_option(p, "per-tenant quotas of the replayed cache (the trace's requests carry "
                      "no salt: tenant \"(none)\", or \"*\")")
    p.add_argument("--block-size", type=positive_int, default=BLOCK_SIZE,
                   help="tokens per trace hash block (Mooncake: 512)")
    p.add_argument("--warmup", type=fraction, default=0.0,
                   help="leading fraction of requests that fill the cache but are not counted")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="replay only the first N requests (None: all)")
    p.add_argument("--decode", action="store_true",
                   help="also generate output_length tokens per request (off: the trace's "
                   "outputs cannot be hit, they only take room)")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the report as JSON ('-': stdout)")
    p.add_argument("--sweep", default=None, metavar="[TIER=]N,N,...",
                   help="replay once per capacity; TIER is device (default), host or storage")
    p.add_argument("--out", default="replay-sweep", metavar="PREFIX",
                   help="sweep output: PREFIX.csv, PREFIX.json, PREFIX.png")
    p.add_argument("--no-plot", action="store_true", help="sweep without the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar (none when stderr "
                   "is not a terminal either)")
    p.set_defaults(func=run_command)

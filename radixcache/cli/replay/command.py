"""``radixcache replay TRACE.jsonl``: replay a Mooncake trace through the cache.

A Mooncake trace line names a request's prompt by block hashes::

    {"timestamp": 0, "input_length": 1500, "output_length": 6, "hash_ids": [7, 8, 9]}

    block:     7 (512 tokens)  8 (512 tokens)  9 (the rest: 1500 - 2*512 = 476)

Ids are prefix hashes: two requests with the same id at a block share the
whole prefix up to and including that block. The replay turns every id into
a fixed run of pseudo-random tokens (a function of the id and the position in
the block only), so equal ids give equal tokens, and drives the real
``RadixCache`` (same tree, eviction and tier code) one request at a time::

    admit -> settle -> reserve + commit the uncached prompt (prefill)
          -> [decode: extend + reserve + commit, a page at a time] -> release -> settle

"settle" waits for every tier job in flight and only then applies them
(``poll``), until nothing is in flight: the host and storage copies then
finish in the same order at the same point of every run, so the counted
figures never depend on thread timing. A request therefore always gets what
the tiers hold (the ``wait_complete`` prefetch policy, which the replay sets).

The KV spec is tiny (1 layer, 1 KV head, head_dim 1, float16): the tiers
really copy and store bytes, but few of them. Without tiers no KV tensor is
allocated at all (``allocate_kv=False``): the tree and the accounting are the
same either way.

What is counted (after the warmup), per request, from the engine's handle:
``hit_device``, ``hit_host``, ``hit_storage`` (prompt tokens found in each
tier at admission) and ``cached_len`` once the loads settled (prefill tokens
saved; equal to the hits unless a copy failed). Admission always leaves one
token to compute, in whole pages: a fully cached prompt of k full pages hits
k - 1 of them. Requests run one at a time in file order (timestamps are not
used), so none overlap. A prompt needing more pages than the device pool has
is rejected and counted apart. Decode is off by default: the trace does not
say what was generated, so synthesized output tokens are never matched by a
later prompt; with ``--decode`` they only take room, as real outputs would.
"""

from __future__ import annotations

import argparse

from radixcache.cli.config_option import add_config_option
from radixcache.cli.hicache_options import add_host_pool_options, add_policy_options
from radixcache.cli.options import fraction, non_negative_int, positive_int, power_of_two
from radixcache.cli.quota_option import add_quotas_option
from radixcache.cli.replay.presets import BLOCK_SIZE, DEFAULT_MODEL, MODEL_PRESETS
from radixcache.tree.policies import eviction_policy_names


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``replay`` to the ``radixcache`` command line; ``radixcache.cli.replay.plot``
    runs it (reports, sweeps, plots), ``radixcache.cli.replay.run`` replays."""
    p = subparsers.add_parser(
        "replay", help="replay a Mooncake trace through the cache (hit ratios per tier)",
        description=__doc__,
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
    p.set_defaults(entry="radixcache.cli.replay.plot:run_command")

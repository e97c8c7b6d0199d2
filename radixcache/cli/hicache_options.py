"""Tier options shared by ``demo`` and ``replay``, under our names and under
the names SGLang's HiCache users know (``--hicache-ratio``, ``--hicache-size``,
``--hicache-write-policy``, ``--hicache-storage-prefetch-policy``).

The policy choices come from the policy registries, so a policy registered
there is offered here without a change.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from radixcache.cli.options import non_negative_int, positive_float
from radixcache.offload import prefetch_policy_names, write_policy_names

if TYPE_CHECKING:
    from radixcache.offload import HostPoolConfig

GB = 10**9  # HiCache's --hicache-size unit


def add_host_pool_options(
    parser: argparse.ArgumentParser, host_pages: int, host_pages_help: str,
    ratio_flags: tuple[str, ...] = ("--hicache-ratio",),
) -> None:
    """``--host-pages`` | ratio flags (dest ``host_ratio``) | ``--hicache-size``
    (dest ``host_gb``): one of them sizes the host pool."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--host-pages", type=non_negative_int, default=host_pages,
                       help=host_pages_help)
    group.add_argument(*ratio_flags, dest="host_ratio", type=positive_float, default=None,
                       metavar="RATIO",
                       help="host pool as a multiple of the device pool's pages, instead of "
                       "--host-pages (HiCache: --hicache-ratio)")
    group.add_argument("--hicache-size", dest="host_gb", type=positive_float, default=None,
                       metavar="GB",
                       help="host pool in GB (10**9 bytes, whole pages), instead of "
                       "--host-pages (HiCache: --hicache-size)")


def host_pool_config(args: argparse.Namespace) -> HostPoolConfig:
    """The host pool the parsed ``add_host_pool_options`` ask for (ValueError if
    the size is not positive)."""
    from radixcache.offload import HostPoolConfig  # torch: only the run needs it

    if args.host_ratio is not None:
        return HostPoolConfig(ratio=args.host_ratio)
    if args.host_gb is not None:
        return HostPoolConfig(nbytes=int(args.host_gb * GB))
    return HostPoolConfig(pages=args.host_pages)


def add_policy_options(
    parser: argparse.ArgumentParser, write_policy: str, prefetch_policy: str,
    prefetch_help: str = "how long a request waits for pages loading from host or storage",
) -> None:
    """``--write-policy`` / ``--hicache-write-policy`` and ``--prefetch-policy`` /
    ``--hicache-storage-prefetch-policy``, choices from the registries."""
    parser.add_argument("--write-policy", "--hicache-write-policy", dest="write_policy",
                        default=write_policy, choices=write_policy_names(),
                        help="when a device page gets a host copy")
    parser.add_argument("--prefetch-policy", "--hicache-storage-prefetch-policy",
                        dest="prefetch_policy", default=prefetch_policy,
                        choices=prefetch_policy_names(), help=prefetch_help)

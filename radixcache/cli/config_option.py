"""``--config FILE``: a command's settings from a radixcache config file.

The file is the one the library reads (``radixcache.load_config``, tables
``[spec] [cache] [host] [tiers] [storage] [events] [quotas]``), with the
``RADIXCACHE__TABLE__KEY`` environment variables laid over it. Precedence,
lowest first: the command's defaults, the file, the environment, the flags
given on the command line::

    radixcache demo --config radixcache.toml --device-pages 512   # the flag wins

``FLAGS`` says which flags stand for which keys: a key whose flag is given is
dropped; any other key is laid over the config the command builds (``overlay``),
and a key with a converter also sets its flag's value, which the command reads
(sizes, paths, endpoints; ``args.config_dests`` names the dests the file
set, for a mode that has no use for some). ``[quotas]`` is the value of
``--quotas`` (a ``QuotaBook``) unless that flag is given: the flag replaces
the whole table. Mistakes are one line naming the file and the key.

``replay`` models a cache rather than opening one: it takes the keys that
have a flag of its own (page size, device pages, host size, policies, the
LMDB path) and the KV bytes per token of ``[spec]``, and leaves the rest of
the file (endpoints, secrets) alone; a misspelt key is an error all the same.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from radixcache.cli.parser import UsageError

T = TypeVar("T")
GB = 10**9
HOST = ("host_pages", "host_ratio", "host_gb")  # one mutually exclusive group


def _same(value: Any) -> Any:
    return value


# (table, key) -> (the flags' dests that replace the key, converter to the first dest's value)
FLAGS: dict[tuple[str, str], tuple[tuple[str, ...], Callable[[Any], Any] | None]] = {
    ("spec", "num_layers"): (("layers",), _same),
    ("spec", "num_kv_heads"): (("kv_heads",), _same),
    ("spec", "head_dim"): (("head_dim",), _same),
    ("spec", "page_size"): (("page_size",), _same),
    ("spec", "dtype"): (("kv_dtype",), lambda d: str(d).removeprefix("torch.")),
    ("cache", "device_pages"): (("device_pages",), _same),
    ("cache", "device"): (("device",), _same),
    ("cache", "eviction_policy"): (("eviction_policy",), _same),
    ("host", "pages"): (HOST, _same),
    ("host", "ratio"): (("host_ratio", "host_pages", "host_gb"), _same),
    ("host", "nbytes"): (("host_gb", "host_pages", "host_ratio"), lambda n: n / GB),
    ("tiers", "write_policy"): (("write_policy",), _same),
    ("tiers", "prefetch_policy"): (("prefetch_policy",), _same),
    ("tiers", "write_threshold"): (("write_threshold",), _same),
    ("storage", "url"): (("storage", "storage_path"), _same),
    ("storage", "path"): (("storage_path", "storage"), str),
    ("storage", "capacity_bytes"): (("storage_mib",), lambda n: max(1, -(-n // 2**20))),
    ("events", "endpoint"): (("events", "kv_events_config"), _same),
    ("events", "replay_endpoint"): (("events_replay",), lambda e: "none" if e is None else e),
}


def kv_bytes_per_token(spec: dict[str, Any]) -> int:
    """K and V of every layer for one token, for the geometry of a ``[spec]`` table."""
    import torch

    itemsize = torch.empty((), dtype=spec.get("dtype", torch.float16)).element_size()
    return 2 * spec["num_layers"] * spec["num_kv_heads"] * spec["head_dim"] * itemsize


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", default=None,
        help="settings from a radixcache config file (.toml, .json, .yaml: tables spec, cache, "
        "host, tiers, storage, events, quotas) and RADIXCACHE__TABLE__KEY variables; flags "
        "given here win over both")
    parser.set_defaults(config_fields={}, config_dests=set())


def given_dests(build: Callable[[], argparse.ArgumentParser], argv: list[str]) -> set[str]:
    """The dests of the options ``argv`` gives (not left at their defaults):
    ``argv`` parsed again with every default of its command a marker (not a
    str, which argparse would convert by the option's type)."""
    parser = build()
    first, _ = parser.parse_known_args(argv)
    marker = object()
    first.command_parser.set_defaults(**{d: marker for d in vars(first)})
    again, _ = parser.parse_known_args(argv)
    return {d for d, v in vars(again).items() if v is not marker}


def apply_config(args: argparse.Namespace, given: set[str]) -> None:
    """Lay the file ``args.config`` under the flags ``given`` (see the module
    docstring); UsageError for a file that does not decode."""
    from radixcache.config import ConfigError, quotas_target, read_sections

    try:
        sections = read_sections(args.config)  # checks [quotas] values too
    except (ConfigError, OSError) as err:
        raise UsageError(f"--config: {err}") from None
    fields: dict[str, dict[str, Any]] = {}
    from_file: set[str] = set()
    for table, keys in sections.items():
        if table == "quotas":  # tenant -> quota: --quotas's value, unless the flag is given
            if "quotas" not in given and hasattr(args, "quotas"):
                args.quotas = quotas_target(keys, args.config)
            continue
        for key, value in keys.items():
            dests, convert = FLAGS.get((table, key), ((), None))
            if any(d in given for d in dests):
                continue  # the flag wins
            if convert is not None and hasattr(args, dests[0]):  # a flag of this command
                setattr(args, dests[0], convert(value))
                from_file.add(dests[0])
            fields.setdefault(table, {})[key] = value
    args.config_fields = fields
    args.config_dests = from_file
    spec = sections.get("spec", {})
    if (hasattr(args, "kv_bytes_per_token") and not {"kv_bytes_per_token", "model"} & given
            and {"num_layers", "num_kv_heads", "head_dim"} <= set(spec)):
        args.kv_bytes_per_token = kv_bytes_per_token(spec)


def overlay(config: T, args: argparse.Namespace, table: str, skip: tuple[str, ...] = ()) -> T:
    """``config`` with the keys of ``table`` that ``--config`` set (and no flag
    replaced); UsageError naming the file for a value the config rejects."""
    keys = {k: v for k, v in getattr(args, "config_fields", {}).get(table, {}).items()
            if k not in skip}
    if not keys:
        return config
    try:
        return dataclasses.replace(config, **keys)  # type: ignore[type-var]
    except (ValueError, TypeError) as err:
        raise UsageError(f"--config {args.config} [{table}]: {err}") from None

"""The adapters' ``config_file`` key: the store an engine's pages go to, from
the same config file as the rest of radixcache (``radixcache.config``).

The file's ``[storage]`` table names the store (``url``: a pool URL or an
LMDB directory, or ``path``) and its ``capacity_bytes``, ``durability`` and
``num_readers``; ``RADIXCACHE__STORAGE__URL`` and the other variables
override them as everywhere. Keys the tier entry (vLLM) or the extra config
(SGLang) give themselves win over the file's. Other tables of the file are
the engine-side cache's, and are not read here; a ``[storage]`` key a page
store does not use is an error, not silently dropped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from radixcache.config import ConfigError, read_sections

# [storage] key -> the adapters' option
STORE_KEYS = {"url": "path", "path": "path", "capacity_bytes": "capacity_bytes",
              "durability": "durability", "num_readers": "num_readers"}


def store_options(config_file: str | os.PathLike[str], keys: frozenset[str],
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The options among ``keys`` that ``config_file``'s ``[storage]`` table
    (and the environment) set; ``kv_dtype`` from ``[spec] dtype`` when asked.
    ConfigError naming the file and the key for anything else in ``[storage]``."""
    where = os.fspath(config_file)
    sections = read_sections(config_file, environ)
    storage = sections.get("storage")
    if storage is None:
        raise ConfigError(f"{where}: no [storage] table (the store the engine's pages go to)")
    if "url" in storage and "path" in storage:
        raise ConfigError(f"{where}: [storage] gives both `url` and `path`; give one")
    out: dict[str, Any] = {}
    for key, value in storage.items():
        option = STORE_KEYS.get(key)
        if option is None or option not in keys:
            usable = sorted(k for k, o in STORE_KEYS.items() if o in keys)
            raise ConfigError(f"{where}: `{key}` is not used by this engine's page store "
                              f"(it takes {', '.join(usable)}) - at `$.storage`")
        out[option] = value
    dtype = sections.get("spec", {}).get("dtype")
    if dtype is not None and "kv_dtype" in keys:
        out["kv_dtype"] = str(dtype).removeprefix("torch.")
    return out

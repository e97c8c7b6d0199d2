"""Configs from files and the environment, decoded by type (msgspec), strictly.

    decoding.py  a document -> a config dataclass: strict types, unknown keys
                 refused, typed conversions (dtype names, text bytes)
    files.py     JSON/TOML/YAML files; RADIXCACHE__TABLE__KEY variables
    layout.py    one file for the whole cache: [spec] [cache] [host] [tiers]
                 [storage] [events] [quotas] -> ``load_config(path)``

``load_config`` is public as ``radixcache.load_config``; the adapters and the
CLI read the same files.
"""

from radixcache.config.decoding import ConfigError, decode, decode_over, schema
from radixcache.config.files import ENV_PREFIX, environment_document, load, read_document, with_environment
from radixcache.config.layout import (CacheFile, Sections, load_config, quotas_target, read_sections,
                                      storage_target)

__all__ = [
    "CacheFile", "ConfigError", "ENV_PREFIX", "Sections", "decode", "decode_over",
    "environment_document", "load", "load_config", "quotas_target", "read_document",
    "read_sections", "schema",
    "storage_target", "with_environment",
]

"""One config file for the whole cache: a table per config dataclass.

    [spec]      KVSpec          the model's KV geometry (dtype by name: "bfloat16")
    [cache]     CacheConfig     device pool, eviction policy (less spec and tiers)
    [host]      HostPoolConfig  the host tier's size (pages, nbytes or ratio)
    [tiers]     TierConfig      write and prefetch policies (less host and storage)
    [storage]   StorageConfig, ValkeyConfig or MooncakeConfig, chosen by ``url``
                (as ``--storage``: a ``valkey://`` or ``mooncake://`` pool URL or
                an LMDB directory / ``lmdb://`` URL; none: LMDB); the other
                keys are that backend's fields (Mooncake: none, its URL's query)
    [events]    PublisherConfig the ZMQ event stream
    [quotas]    per-tenant quotas (``CacheConfig.quotas``): a table per tenant
                salt (``"*"``: tenants not listed, ``"(none)"``: no salt) of
                ``TenantQuota`` fields; present, even empty, turns quotas on

The tables are flat, not nested as the dataclasses are, so that each is one
dataclass's fields, named after the command-line flags' prefixes
(``--storage``, ``--events``, ``--host-pages``) and reachable by a
two-level variable: ``RADIXCACHE__STORAGE__PASSWORD`` (a quota, three-level:
``RADIXCACHE__QUOTAS__TENANT_A__DEVICE_PAGES``, the salt in lower case). Any
of ``[host]``, ``[tiers]``, ``[storage]`` turns the tiers below the device on.

The whole document is decoded in one pass, so a mistake names its table:
``radixcache.toml: Object contains unknown field `endpont` - at `$.events```.
Values from the environment are text, decoded by the field's type.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from radixcache.cache_config import CacheConfig
from radixcache.config.decoding import (UNSET, ConfigError, construct, convert, init_fields,
                                        require, schema, values)
from radixcache.config.files import environment_document, read_document
from radixcache.events import PublisherConfig
from radixcache.offload import HostPoolConfig, StorageConfig, ValkeyConfig, storage_config
from radixcache.offload.mooncake import MooncakeConfig
from radixcache.tenants import QuotaBook, TenantQuota, parse_quotas
from radixcache.tiers import TierConfig
from radixcache.transfer import KVSpec

# table -> (its dataclass, fields that are other tables)
TABLES: dict[str, tuple[type, tuple[str, ...]]] = {
    "spec": (KVSpec, ()),
    "cache": (CacheConfig, ("spec", "tiers", "quotas")),
    "host": (HostPoolConfig, ()),
    "tiers": (TierConfig, ("host", "storage")),
    "events": (PublisherConfig, ()),
}
BACKENDS: dict[type, str] = {StorageConfig: "an LMDB store", ValkeyConfig: "a Valkey pool"}
# A Mooncake Store pool takes its settings from its URL's query alone
# (``mooncake://HOST:PORT?segment_mib=...``): ``url`` is its only key here.
URL_ONLY: dict[type, str] = {MooncakeConfig: "a Mooncake Store pool (its options go in the url)"}
TIER_TABLES = ("host", "tiers", "storage")
# Backend fields a file does not set: per-tenant byte quotas come from [quotas]
# (storage_bytes, pool_bytes), a clock only from code.
NOT_IN_FILE = ("tenant_quotas", "tenant_quota_default", "clock")
Sections = dict[str, dict[str, Any]]  # table -> the keys it sets, decoded by type


def _storage_schema() -> type[msgspec.Struct]:
    """``[storage]``: ``url`` and the fields of every backend, each optional."""
    fields: dict[str, Any] = {"url": str | msgspec.UnsetType}
    for backend in BACKENDS:
        for f in msgspec.structs.fields(schema(backend, NOT_IN_FILE, partial=True)):
            assert fields.get(f.name, f.type) == f.type, f"{f.name}: two types"
            fields[f.name] = f.type
    return msgspec.defstruct("StorageFields", [(n, t, UNSET) for n, t in fields.items()],
                             kw_only=True, forbid_unknown_fields=True)


STORAGE_FIELDS = _storage_schema()
DOCUMENT = msgspec.defstruct(
    "CacheDocument",
    [(name, schema(cls, exclude, partial=True) | msgspec.UnsetType, UNSET)
     for name, (cls, exclude) in TABLES.items()]
    + [("storage", STORAGE_FIELDS | msgspec.UnsetType, UNSET),
       ("quotas", dict[str, Any] | msgspec.UnsetType, UNSET)],  # tenant -> table: _quota_tables
    kw_only=True, forbid_unknown_fields=True)


def _sections(document: Mapping[str, Any], source: str, strict: bool) -> Sections:
    decoded = convert(document, DOCUMENT, source, strict)
    out: Sections = {}
    for name, (cls, _) in [*TABLES.items(), ("storage", (StorageConfig, ())),
                           ("quotas", (TenantQuota, ()))]:
        table = getattr(decoded, name)
        if table is UNSET:
            continue
        if name == "quotas":
            out[name] = _quota_tables(table, source, strict)
        elif name == "storage":  # fields of either backend: plain values, nothing nested
            out[name] = {}
            for backend in BACKENDS:
                out[name].update(values(backend, _only(table, backend)))
            if table.url is not UNSET:
                out[name]["url"] = table.url
        else:
            out[name] = values(cls, table)
    return out


def _quota_tables(table: Mapping[str, Any], source: str, strict: bool) -> dict[str, dict[str, Any]]:
    """``[quotas]``: each tenant's table decoded by ``TenantQuota``'s field
    types (unknown keys refused), the keys it sets; a mistake names the
    tenant's table (``$.quotas.quiet``, ``$.quotas["tenant-a"]``)."""
    kind = schema(TenantQuota, partial=True)
    out: dict[str, dict[str, Any]] = {}
    for tenant, fields in table.items():
        at = f"$.quotas.{tenant}" if tenant.isidentifier() else f"$.quotas[{json.dumps(tenant)}]"
        try:
            decoded = msgspec.convert(fields, kind, strict=strict)
        except msgspec.ValidationError as err:
            text = str(err)
            text = text.replace("- at `$", f"- at `{at}") if "- at `$" in text else f"{text} - at `{at}`"
            raise ConfigError(f"{source}: {text}") from None
        out[tenant] = values(TenantQuota, decoded)
    return out


def _only(table: msgspec.Struct, backend: type) -> msgspec.Struct:
    """The part of a ``[storage]`` Struct that is ``backend``'s fields."""
    kind = schema(backend, NOT_IN_FILE, partial=True)
    return kind(**{f: getattr(table, f) for f in kind.__struct_fields__})


def read_sections(path: str | os.PathLike[str],
                  environ: Mapping[str, str] | None = None) -> Sections:
    """The keys a config file and the ``RADIXCACHE__TABLE__KEY`` variables
    set, per table, decoded by type (unknown tables and keys, wrong types and
    a storage key of the other backend are ConfigErrors); not yet checked by
    the dataclasses (``load_config`` builds them; the CLI lays its flags over)."""
    where = os.fspath(path)
    sections = _sections(read_document(path), where, strict=True)
    env, names = environment_document("", environ)
    if names:
        source = f"environment ({', '.join(names)})"
        for name, fields in _sections(env, source, strict=False).items():
            if name == "quotas":  # a variable sets one key of one tenant's table
                old = sections.get(name, {})
                fields = {t: {**old.get(t, {}), **fields.get(t, {})} for t in {*old, *fields}}
            sections[name] = {**sections.get(name, {}), **fields}
    if "storage" in sections:
        storage_backend(sections["storage"], where)
    if "quotas" in sections:
        quotas_target(sections["quotas"], where)
    return sections


def quotas_target(fields: Mapping[str, Any], where: str) -> QuotaBook:
    """The ``QuotaBook`` of a ``[quotas]`` table's keys (tenant -> fields);
    ConfigError naming the file for a value ``TenantQuota`` rejects (a floor
    above its limit)."""
    try:
        return parse_quotas(fields, f"{where} [quotas]")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def storage_backend(fields: Mapping[str, Any], where: str) -> type:
    """The backend config class ``[storage]`` names (by ``url``; none: LMDB);
    ConfigError for a key of another backend."""
    url = fields.get("url")
    kind: type = StorageConfig
    if url is not None:
        try:
            kind = type(storage_config(url))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{where}: {err} - at `$.storage.url`") from None
    known = {"url"} if kind in URL_ONLY else {f.name for f in init_fields(kind)} | {"url"}
    for key in fields:
        if key not in known:
            raise ConfigError(f"{where}: `{key}` is not a setting of {(BACKENDS | URL_ONLY)[kind]} "
                              f"(url = {url!r}) - at `$.storage`")
    return kind


def storage_target(fields: Mapping[str, Any],
                   where: str) -> StorageConfig | ValkeyConfig | MooncakeConfig:
    """The storage config of a ``[storage]`` table's keys."""
    rest = {k: v for k, v in fields.items() if k != "url"}
    kind = storage_backend(fields, where)
    base = storage_config(fields["url"]) if "url" in fields else None
    if base is None:
        return construct(kind, rest, f"{where} [storage]")
    return construct(lambda **kw: replace(base, **kw), rest, f"{where} [storage]")


@dataclass(frozen=True, slots=True)
class CacheFile:
    """What a config file describes: the cache, and the event stream if it has an [events] table."""

    cache: CacheConfig  # RadixCache(cache) opens it
    events: PublisherConfig | None  # ZmqEventPublisher(events); None: no [events] table
    sections: Sections  # the keys the file and the environment set, per table


def load_config(path: str | os.PathLike[str],
                environ: Mapping[str, str] | None = None) -> CacheFile:
    """The configs a file (``.json``, ``.toml``, ``.yaml``) describes, with the
    ``RADIXCACHE__TABLE__KEY`` environment variables laid over it (``environ``:
    instead of ``os.environ``). Raises ConfigError naming the file and the key;
    OSError for a file that cannot be read."""
    where = os.fspath(path)
    sections = read_sections(path, environ)
    if "spec" not in sections:
        raise ConfigError(f"{where}: Object missing required field `spec`")

    def build(name: str, **others: Any) -> Any:
        cls, _ = TABLES[name]
        fields = {**sections.get(name, {}), **others}
        require(cls, fields, f"{where} [{name}]")
        return construct(cls, fields, f"{where} [{name}]")

    tiers = None
    if any(name in sections for name in TIER_TABLES):
        host = build("host") if "host" in sections else TierConfig().host
        storage = storage_target(sections["storage"], where) if "storage" in sections else None
        tiers = build("tiers", host=host, storage=storage)
    quotas = quotas_target(sections["quotas"], where) if "quotas" in sections else None
    cache = build("cache", spec=build("spec"), tiers=tiers, quotas=quotas)
    events = build("events") if "events" in sections else None
    return CacheFile(cache, events, sections)




"""Configs from files and the environment, decoded by type (msgspec), strictly.

Every config of radixcache is a frozen dataclass that checks its values in
``__post_init__`` (ranges, relations between fields). What a file or an
environment variable may put into one is decided here, by its type: the
dataclass's fields and their annotations become a msgspec ``Struct`` that
forbids unknown fields, and ``msgspec.convert`` (strict: no "3" for 3, no 1
for true) decodes the document into it before the dataclass is built::

    file (JSON, TOML or YAML) --load--> dict --env overrides--> dict
        --msgspec.convert(strict, unknown fields forbidden)--> typed fields
        --Config(**fields)--> __post_init__ checks the values

A mistake is one ``ConfigError`` (a ValueError) naming the file (or the
variable) and the key: ``radixcache.toml: Object contains unknown field
`endpont` - at `$.events```.

Environment overrides (for secrets and endpoints, which do not belong in a
file under version control): ``RADIXCACHE__EVENTS__ENDPOINT=tcp://*:5557``
sets ``events.endpoint``; a double underscore separates the levels. A value
that parses as JSON (a number, true, null, a list) is taken as that, anything
else as a string; either way it is decoded by type with the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
ENV_PREFIX = "RADIXCACHE__"


class ConfigError(ValueError):
    """A config document that does not decode; the message names where and which key."""


# ---------------------------------------------------------------------- schemas
def _field_type(annotation: Any) -> Any:
    """The decodable type of a field annotation: nested dataclasses become
    their schemas, path-like values strings."""
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return schema(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(
            lambda a, b: a | b, dict.fromkeys(_field_type(a) for a in typing.get_args(annotation))
        )
    if annotation is os.PathLike or origin is os.PathLike:
        return str
    return annotation


@functools.cache
def schema(cls: type) -> type[msgspec.Struct]:
    """The strict Struct that a document for the dataclass ``cls`` must fit:
    its init fields, their types and defaults; unknown fields are errors."""
    hints = typing.get_type_hints(cls)
    fields: list[Any] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind = _field_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            fields.append((f.name, kind, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, kind))
    return msgspec.defstruct(f"{cls.__name__}Document", fields, kw_only=True,
                             forbid_unknown_fields=True)


def _build(cls: type[T], decoded: msgspec.Struct) -> T:
    hints = typing.get_type_hints(cls)
    values = {}
    for name in decoded.__struct_fields__:
        value = getattr(decoded, name)
        kind = hints[name]
        if isinstance(value, msgspec.Struct) and isinstance(kind, type):
            value = _build(kind, value)  # a nested dataclass
        elif isinstance(value, msgspec.Struct):  # a union member that is a dataclass
            member: type = next(a for a in typing.get_args(kind)
                                if isinstance(a, type) and dataclasses.is_dataclass(a)
                                and schema(a) is type(value))
            value = _build(member, value)
        values[name] = value
    return cls(**values)


def decode(cls: type[T], document: Mapping[str, Any], source: str = "config") -> T:
    """The ``cls`` config a document (a mapping, e.g. parsed JSON) describes.

    ConfigError names ``source`` and the key for a wrong type, an unknown or
    a missing key, and prefixes a value the dataclass rejects with ``source``.
    """
    try:
        decoded = msgspec.convert(document, schema(typing.cast(type, cls)), strict=True)
    except msgspec.ValidationError as err:
        raise ConfigError(f"{source}: {err}") from None
    try:
        return _build(cls, decoded)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{source}: {err}") from None


# ---------------------------------------------------------------------- files
def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's contents: ``.json``, ``.toml`` or ``.yaml``/``.yml``
    (YAML needs PyYAML). ConfigError for a file that does not parse or whose
    top level is not a table; OSError for one that cannot be read."""
    where = os.fspath(path)
    text = Path(path).read_text(encoding="utf-8")
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".toml":
            doc: Any = importlib.import_module("tomllib").loads(text)  # Python 3.11+
        elif suffix in (".yaml", ".yml"):
            try:
                yaml = importlib.import_module("yaml")
            except ImportError:
                raise ConfigError(f"{where}: YAML config files need PyYAML "
                                  f"(pip install pyyaml)") from None
            doc = yaml.safe_load(text)
        elif suffix == ".json":
            doc = json.loads(text)
        else:
            raise ConfigError(f"{where}: config files are .json, .toml or .yaml, "
                              f"got {suffix or 'no suffix'!r}")
    except ConfigError:
        raise
    except Exception as err:  # each parser has its own error type
        raise ConfigError(f"{where}: not valid {suffix[1:].upper()}: {err}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: the top level must be a table of keys, "
                          f"got {type(doc).__name__}")
    return doc


def with_environment(document: Mapping[str, Any], section: str = "",
                     environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``document`` with every ``RADIXCACHE__SECTION__KEY[__SUBKEY]`` variable
    applied (module docstring); only the variables of ``section`` when given
    (then ``RADIXCACHE__SECTION__KEY`` sets ``document[key]``)."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = json.loads(json.dumps(document))  # a deep copy of plain data
    head = ENV_PREFIX + (section.upper() + "__" if section else "")
    for name in sorted(env):
        if not name.startswith(head):
            continue
        path = [p.lower() for p in name[len(head):].split("__") if p]
        if not path:
            continue
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: {part!r} is not a table in the config")
            node = child
        raw = env[name]
        try:
            node[path[-1]] = json.loads(raw)
        except ValueError:
            node[path[-1]] = raw
    return out


def load(cls: type[T], path: str | os.PathLike[str], section: str | None = None,
         environ: Mapping[str, str] | None = None) -> T:
    """The ``cls`` config of a file (its ``section`` table when given), with
    the environment's overrides for that section applied."""
    where = os.fspath(path)
    document: Any = read_document(path)
    if section is not None:
        if section not in document:
            raise ConfigError(f"{where}: no [{section}] table")
        document = document[section]
        where = f"{where} [{section}]"
        if not isinstance(document, dict):
            raise ConfigError(f"{where}: must be a table of keys")
    return decode(cls, with_environment(document, section or "", environ), where)

"""Config files (JSON, TOML, YAML) and environment overrides.

A file holds tables of keys; ``read_document`` parses it by its suffix.
Environment variables override keys, for secrets and endpoints, which do not
belong in a file under version control: ``RADIXCACHE__EVENTS__ENDPOINT=tcp://*:5557``
sets ``events.endpoint``; a double underscore separates the levels.
``environment_document`` collects them as text, which is then decoded by the
field's type (``"64"`` for an int field is 64, ``"true"`` for a bool is
true, a password of digits stays text).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from radixcache.config.decoding import ConfigError, construct, convert, require, schema, values

T = TypeVar("T")
ENV_PREFIX = "RADIXCACHE__"


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


def environment_document(section: str = "", environ: Mapping[str, str] | None = None
                         ) -> tuple[dict[str, Any], list[str]]:
    """The keys ``RADIXCACHE__SECTION__KEY[__SUBKEY]`` variables set, as a
    document of text values (only ``section``'s variables when given: then
    ``RADIXCACHE__SECTION__KEY`` sets ``key``), and the variables' names."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    names: list[str] = []
    head = ENV_PREFIX + (section.upper() + "__" if section else "")
    for name in sorted(env):
        path = [p.lower() for p in name[len(head):].split("__") if p]
        if not name.startswith(head) or not path:
            continue
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: {part!r} is set by another variable as a value")
            node = child
        if isinstance(node.get(path[-1]), dict):
            raise ConfigError(f"{name}: {path[-1]!r} is a table, set by other variables")
        node[path[-1]] = env[name]
        names.append(name)
    return out, names


def merge(document: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` with ``overrides`` laid over it, table by table (a copy)."""
    out = copy.deepcopy(dict(document))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_environment(document: Mapping[str, Any], section: str = "",
                     environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``document`` with every ``RADIXCACHE__SECTION__KEY`` variable applied,
    each value parsed as JSON when it is JSON, else kept as text (for a caller
    that decodes the result strictly; ``load`` decodes each value by its
    field's type instead)."""
    env, _ = environment_document(section, environ)

    def parsed(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: parsed(v) for k, v in node.items()}
        try:
            return json.loads(node)
        except ValueError:
            return node

    return merge(document, parsed(env))


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
    kind = typing.cast(type, cls)
    fields = values(kind, convert(document, schema(kind, partial=True), where))
    env, names = environment_document(section or "", environ)
    if names:  # text, decoded by each field's type
        fields.update(values(kind, convert(env, schema(kind, partial=True),
                                          f"environment ({', '.join(names)})", strict=False)))
    require(kind, fields, where)
    return construct(cls, fields, where)

"""Decoding a config document into a frozen config dataclass, by type (msgspec).

Every config of radixcache is a frozen dataclass that checks its values in
``__post_init__`` (ranges, relations between fields). What a document may
put into one is decided here, by its type: the dataclass's fields and their
annotations become a msgspec ``Struct`` that forbids unknown fields, and
``msgspec.convert`` (strict: no "3" for 3, no 1 for true) decodes the
document into it before the dataclass is built::

    dict --msgspec.convert(strict, unknown fields forbidden)--> typed fields
         --Config(**fields)--> __post_init__ checks the values

Field types msgspec cannot decode from JSON-like data have one typed
conversion each (``CONVERSIONS``), applied by msgspec's ``dec_hook`` so that
a bad value is reported at its key like any other:

    torch.dtype   from its name: "bfloat16", "float16", "float32", ...
    bytes         from text, UTF-8 encoded ("rxkv:")
    os.PathLike   as a str

A mistake is one ``ConfigError`` (a ValueError) naming the source (a file,
a variable) and the key: ``radixcache.toml: Object contains unknown field
`endpont` - at `$.events```.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
UNSET = msgspec.UNSET


class ConfigError(ValueError):
    """A config document that does not decode; the message names where and which key."""


# ---------------------------------------------------------------------- conversions
class TextBytes(bytes):
    """A ``bytes`` field's value as a document gives it: text, UTF-8 encoded.
    (msgspec's own ``bytes`` decoding expects base64, which nobody writes by hand.)"""


def _bytes_from_text(value: object) -> TextBytes:
    if not isinstance(value, str):
        raise TypeError(f"Expected `str` (text, UTF-8 encoded), got `{type(value).__name__}`")
    return TextBytes(value.encode())


def _dtype_from_name(value: object) -> Any:
    import torch  # only a document with a dtype field needs it

    if not isinstance(value, str):
        raise TypeError(f"Expected a dtype name (`str`), got `{type(value).__name__}`")
    dtype = getattr(torch, value, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {value!r} (e.g. 'bfloat16', 'float16', 'float32')")
    return dtype


def _dtype_type() -> type:
    import torch

    return torch.dtype


# annotation -> (the type a schema holds, how a document's value becomes it);
# filled lazily for torch.dtype, so that decoding configs without one needs no torch
CONVERSIONS: dict[Any, tuple[type, Callable[[object], object]]] = {
    bytes: (TextBytes, _bytes_from_text),
}


def _conversion(annotation: Any) -> tuple[type, Callable[[object], object]] | None:
    if annotation in CONVERSIONS:
        return CONVERSIONS[annotation]
    if getattr(annotation, "__module__", None) == "torch" and annotation is _dtype_type():
        CONVERSIONS[annotation] = (annotation, _dtype_from_name)
        return CONVERSIONS[annotation]
    return None


def dec_hook(kind: type, value: object) -> object:
    """msgspec's hook for the field types of ``CONVERSIONS``."""
    for target, convert in CONVERSIONS.values():
        if kind is target:
            return value if type(value) is target else convert(value)
    raise NotImplementedError(f"no conversion to {kind!r}")


# ---------------------------------------------------------------------- schemas
def field_type(annotation: Any) -> Any:
    """The decodable type of a field annotation: nested dataclasses become
    their schemas, path-like values strings, ``CONVERSIONS`` their types."""
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return schema(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(
            lambda a, b: a | b, dict.fromkeys(field_type(a) for a in typing.get_args(annotation))
        )
    if annotation is os.PathLike or origin is os.PathLike:
        return str
    conversion = _conversion(annotation)
    return conversion[0] if conversion is not None else annotation


def init_fields(cls: type, exclude: tuple[str, ...] = ()) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in exclude]


@functools.cache
def schema(cls: type, exclude: tuple[str, ...] = (), partial: bool = False) -> type[msgspec.Struct]:
    """The strict Struct that a document for the dataclass ``cls`` must fit:
    its init fields (less ``exclude``), their types and defaults; unknown
    fields are errors. ``partial``: every field optional, UNSET when left out
    (what a document sets, to lay over other values)."""
    hints = typing.get_type_hints(cls)
    fields: list[Any] = []
    for f in init_fields(cls, exclude):
        kind = field_type(hints[f.name])
        if partial:
            fields.append((f.name, kind | msgspec.UnsetType, UNSET))
        elif f.default is not dataclasses.MISSING:
            fields.append((f.name, kind, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, kind))
    name = f"{cls.__name__}{'Fields' if partial else 'Document'}"
    return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True)


def plain(value: Any) -> Any:
    """A decoded value as the dataclass takes it (``TextBytes`` as ``bytes``)."""
    return bytes(value) if isinstance(value, TextBytes) else value


def values(cls: type, decoded: msgspec.Struct) -> dict[str, Any]:
    """The fields of a decoded Struct of ``cls`` as its dataclass takes them
    (nested dataclasses built); a partial Struct's: only those its document set."""
    hints = typing.get_type_hints(cls)
    out = {}
    for name in decoded.__struct_fields__:
        value = plain(getattr(decoded, name))
        if value is UNSET:
            continue
        kind = hints[name]
        if isinstance(value, msgspec.Struct) and isinstance(kind, type):
            value = kind(**values(kind, value))  # a nested dataclass
        elif isinstance(value, msgspec.Struct):  # a union member that is a dataclass
            member: type = next(a for a in typing.get_args(kind)
                                if isinstance(a, type) and dataclasses.is_dataclass(a)
                                and schema(a) is type(value))
            value = member(**values(member, value))
        out[name] = value
    return out


def require(cls: type, fields: Mapping[str, Any], source: str) -> None:
    """ConfigError (msgspec's words) for a field of ``cls`` with no default
    that ``fields`` leaves out."""
    for f in init_fields(cls):
        if (f.name not in fields and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            raise ConfigError(f"{source}: Object missing required field `{f.name}`")


def convert(document: object, kind: type[msgspec.Struct], source: str,
            strict: bool = True) -> Any:
    """``msgspec.convert`` with the conversions; ConfigError naming ``source``.
    ``strict=False`` decodes numbers and booleans from text (environment values)."""
    try:
        return msgspec.convert(document, kind, strict=strict, dec_hook=dec_hook)
    except msgspec.ValidationError as err:
        raise ConfigError(f"{source}: {err}") from None


def construct(cls: Callable[..., T], fields: Mapping[str, Any], source: str) -> T:
    """``cls(**fields)``; a value the dataclass rejects is a ConfigError
    prefixed with ``source``."""
    try:
        return cls(**fields)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{source}: {err}") from None


def decode(cls: type[T], document: Mapping[str, Any], source: str = "config") -> T:
    """The ``cls`` config a document (a mapping, e.g. parsed JSON) describes.

    ConfigError names ``source`` and the key for a wrong type, an unknown or
    a missing key, and prefixes a value the dataclass rejects with ``source``.
    """
    decoded = convert(document, schema(typing.cast(type, cls)), source)
    return construct(lambda: cls(**values(typing.cast(type, cls), decoded)), {}, source)


def decode_over(base: T, document: Mapping[str, Any], source: str = "config") -> T:
    """``base`` (a config dataclass) with the keys ``document`` sets, decoded
    by type like ``decode``: keys left out keep ``base``'s values."""
    kind: type = type(base)
    changes = values(kind, convert(document, schema(kind, partial=True), source))
    return construct(lambda **kw: dataclasses.replace(typing.cast(Any, base), **kw), changes, source)

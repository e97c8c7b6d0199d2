"""Namespaces: the part of a request's identity that is not its tokens.

Two requests share cached pages only if their tokens *and* their namespace are
equal: a tenant's cache salt, a LoRA adapter, and any extra keys (for example
content hashes of multimodal inputs) all partition the cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ExtraKey = str | bytes | int


def _encode_part(tag: bytes, value: object) -> bytes:
    """Length-prefixed, type-tagged encoding: no two values encode alike."""
    if value is None:
        return tag + b"N"
    if isinstance(value, bool):
        raise TypeError(f"namespace values cannot be bool, got {value!r}")
    if isinstance(value, int):
        raw = str(value).encode()
        kind = b"I"
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        kind = b"S"
    elif isinstance(value, bytes):
        raw = value
        kind = b"B"
    else:
        raise TypeError(f"namespace values must be str, bytes or int, got {type(value).__name__}")
    return tag + kind + len(raw).to_bytes(4, "big") + raw


@dataclass(frozen=True, slots=True)
class Namespace:
    """Immutable, hashable identity of a cache partition.

    ``Namespace()`` is the default, shared partition.
    """

    salt: str | bytes | None = None  # tenant cache salt (isolates tenants)
    lora_id: int | None = None  # LoRA adapter id, reported in events
    lora_name: str | None = None  # LoRA adapter name, reported in events
    extra_keys: tuple[ExtraKey, ...] = field(default=())  # e.g. multimodal content hashes

    def __post_init__(self) -> None:
        if self.salt is not None and not isinstance(self.salt, (str, bytes)):
            raise TypeError(f"salt must be str or bytes, got {type(self.salt).__name__}")
        if self.lora_id is not None and (
            not isinstance(self.lora_id, int) or isinstance(self.lora_id, bool) or self.lora_id < 0
        ):
            raise ValueError(f"lora_id must be a non-negative int, got {self.lora_id!r}")
        if self.lora_name is not None and not isinstance(self.lora_name, str):
            raise TypeError(f"lora_name must be str, got {type(self.lora_name).__name__}")
        if not isinstance(self.extra_keys, tuple):
            raise TypeError("extra_keys must be a tuple")
        for key in self.extra_keys:
            _encode_part(b"x", key)  # type check

    def digest(self) -> bytes:
        """16 stable bytes identifying this namespace (same on every machine)."""
        parts = [
            b"radixcache-ns-v1",
            _encode_part(b"s", self.salt),
            _encode_part(b"l", self.lora_id),
            _encode_part(b"n", self.lora_name),
        ]
        parts.extend(_encode_part(b"x", key) for key in self.extra_keys)
        return hashlib.blake2b(b"".join(parts), digest_size=16).digest()

    @property
    def tenant(self) -> bytes | None:
        """The tenant this namespace belongs to, as storage takes it (the key
        its pages are sealed with where storage encrypts at rest): its salt,
        type-tagged (a str and a bytes salt of the same bytes are two
        tenants); None for the default tenant (no salt). LoRA and extra keys
        do not change the tenant."""
        return None if self.salt is None else _encode_part(b"s", self.salt)

    def wire_salt(self) -> str | None:
        """The salt as events carry it (``cache_salt`` is a string on the
        wire): a str salt as it is, a bytes salt as ``"hex:"`` + its hex."""
        if self.salt is None or isinstance(self.salt, str):
            return self.salt
        return "hex:" + self.salt.hex()

    def event_extra(self) -> tuple[ExtraKey, ...] | None:
        """The per-block ``extra_keys`` entry of this namespace's events:
        ``(wire salt, *extra_keys)`` (salt left out when None), or None."""
        salt = self.wire_salt()
        entry = ((salt,) if salt is not None else ()) + self.extra_keys
        return entry or None

    @classmethod
    def from_wire(
        cls,
        lora_id: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        extra_keys: Sequence[ExtraKey] | None = None,
    ) -> Namespace:
        """The namespace of a request as events and routers name it: the salt
        is taken as the string it is on the wire (a bytes salt published as
        ``"hex:..."`` does not map back to itself), ``extra_keys`` are the
        namespace's own extra keys (without the salt)."""
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise TypeError(f"cache_salt must be str, got {type(cache_salt).__name__}")
        return cls(cache_salt, lora_id, lora_name, tuple(extra_keys or ()))

    def to_info(self) -> bytes:
        """Compact bytes that ``from_info`` turns back into this namespace
        (kept in storage records, for events about survivors after a restart)."""
        def enc(v: object) -> object:
            return {"b": v.hex()} if isinstance(v, bytes) else v

        doc = [enc(self.salt), self.lora_id, self.lora_name, [enc(k) for k in self.extra_keys]]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_info(cls, info: bytes) -> Namespace:
        """The namespace ``to_info`` wrote; ValueError for bytes it did not write."""
        def dec(v: Any) -> Any:
            return bytes.fromhex(v["b"]) if isinstance(v, dict) else v

        try:
            salt, lora_id, lora_name, extra = json.loads(info)
            return cls(dec(salt), lora_id, lora_name, tuple(dec(k) for k in extra))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"namespace info {info[:60]!r} is not valid: {exc}") from None


DEFAULT_NAMESPACE = Namespace()

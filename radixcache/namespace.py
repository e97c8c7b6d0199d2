"""Namespaces: the part of a request's identity that is not its tokens.

Two requests share cached pages only if their tokens *and* their namespace are
equal: a tenant's cache salt, a LoRA adapter, and any extra keys (for example
content hashes of multimodal inputs) all partition the cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

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


DEFAULT_NAMESPACE = Namespace()

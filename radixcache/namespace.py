"""Namespaces: the part of a request's identity that is not its tokens.

Two requests share cached pages only if their tokens *and* their namespace are
equal: a tenant's cache salt, a LoRA adapter, and any extra keys (for example
content hashes of multimodal inputs) all partition the cache.

A namespace is checked once, when it is built, for everything later code
does with it (invariant 12): it hashes (``digest()`` cannot fail), it goes
on the event wire (``cache_salt``, ``lora_id``, ``lora_name`` and
``extra_keys`` as vLLM's and SGLang's decoders read them: ints within
int64 and non-negative ids below 2**63, text that is valid UTF-8), and it
fits a storage record (``to_info()`` at most ``MAX_INFO_BYTES``). What it
cannot carry is a ``TypeError`` (a wrong type) or ``ValueError`` (a value
out of range) naming the field, at construction, never later inside a
commit or on the publisher's thread. ``from_wire`` and ``from_info`` build
through the same checks. Types are exact: ``str``, ``bytes`` and ``int``
themselves, not subclasses (whose hashing and encoding may differ) and not
bools.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixcache.native import compiled as native_core  # None on the pure-Python path

ExtraKey = str | bytes | int

MAX_INFO_BYTES = 4096  # to_info() must fit a storage record's info (radixcache.offload.storage.record)
ID_LIMIT = 2**63  # lora_id is in [0, 2**63), like block hashes (u64 and i64 readers agree)
INT64_MIN, INT64_LIMIT = -(2**63), 2**63  # extra-key ints: what msgpack and int64 readers share


def _encode_part(tag: bytes, value: object) -> bytes:
    """Length-prefixed, type-tagged encoding: no two values encode alike.
    Takes only values ``Namespace`` checked (it cannot fail on them)."""
    if value is None:
        return tag + b"N"
    if type(value) is int:
        raw = str(value).encode()
        kind = b"I"
    elif type(value) is str:
        raw = value.encode("utf-8")
        kind = b"S"
    else:
        assert type(value) is bytes, f"unchecked namespace value {value!r}"
        raw = value
        kind = b"B"
    return tag + kind + len(raw).to_bytes(4, "big") + raw


def _check_text(value: str, what: str) -> None:
    """ValueError unless ``value`` encodes as UTF-8 (no lone surrogates)."""
    if value.isascii():  # O(1) in CPython: the common case costs nothing
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} must be valid text: it holds an unpaired surrogate "
            f"{value[exc.start]!r} at index {exc.start}, which UTF-8 cannot encode"
        ) from None


def _check_extra_key(key: object, i: int) -> None:
    what = f"extra_keys[{i}]"
    kind = type(key)
    if kind is str:
        _check_text(key, what)  # type: ignore[arg-type]
    elif kind is int:
        if not INT64_MIN <= key < INT64_LIMIT:  # type: ignore[operator]
            raise ValueError(f"{what} must be an int within int64 [-2**63, 2**63), got {_short(key)}")
    elif kind is not bytes:
        raise TypeError(f"{what} must be str, bytes or int, got {kind.__name__} {_short(key)}")


MAX_TAGS = 16  # tags per namespace
MAX_TAG_CHARS = 128  # characters per tag


def _check_tags(tags: object) -> None:
    """TypeError / ValueError unless ``tags`` is a tuple of at most
    ``MAX_TAGS`` distinct, non-empty, printable ASCII str of at most
    ``MAX_TAG_CHARS`` characters (they become store keys)."""
    if type(tags) is not tuple:
        raise TypeError(f"tags must be a tuple of str, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise ValueError(f"tags: at most {MAX_TAGS} tags, got {len(tags)}")
    for i, tag in enumerate(tags):
        check_tag(tag, f"tags[{i}]")
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags must be distinct, got {_short(tags)}")


def check_tag(tag: object, what: str = "tag") -> str:
    """``tag`` if it is a valid tag (see ``_check_tags``), else TypeError / ValueError."""
    if type(tag) is not str:
        raise TypeError(f"{what} must be a str, got {type(tag).__name__} {_short(tag)}")
    if not 0 < len(tag) <= MAX_TAG_CHARS or not tag.isascii() or not tag.isprintable() or " " in tag:
        raise ValueError(f"{what} must be 1-{MAX_TAG_CHARS} printable ASCII characters "
                         f"without spaces, got {_short(tag)}")
    return tag


def _short(value: object) -> str:
    """``repr(value)``, cut to a readable length (an int may have thousands of digits)."""
    if type(value) is int and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _info_bound(ns: Namespace) -> int:
    """An upper bound of ``len(ns.to_info())``, without building it: JSON
    writes a character as at most 12 bytes (``\\ud83d\\ude00``), a bytes
    value as its hex in ``{"b":"..."}``, an int (< 2**63 in size) in 20."""

    def size(v: object) -> int:
        if v is None:
            return 4
        if type(v) is str:
            return 12 * len(v) + 2
        if type(v) is bytes:
            return 2 * len(v) + 9
        return 21

    parts = (ns.salt, ns.lora_id, ns.lora_name, *ns.extra_keys)
    return 8 + sum(size(v) + 1 for v in parts)


@dataclass(frozen=True, slots=True)
class Namespace:
    """Immutable, hashable identity of a cache partition.

    ``Namespace()`` is the default, shared partition. Construction raises
    TypeError (wrong type) or ValueError (a value the wire, the digest or a
    storage record cannot carry) naming the field; see the module docstring.
    """

    salt: str | bytes | None = None  # tenant cache salt (isolates tenants)
    lora_id: int | None = None  # LoRA adapter id, reported in events; [0, 2**63)
    lora_name: str | None = None  # LoRA adapter name, reported in events
    extra_keys: tuple[ExtraKey, ...] = field(default=())  # e.g. multimodal content hashes
    # labels for RadixCache.invalidate(tag) ("model:v3", "template:v8"); not part
    # of the identity: equality, hashing, digest(), keys and events ignore them
    tags: tuple[str, ...] = field(default=(), compare=False)
    # the hash of the identity, taken once (every admit looks namespaces up in
    # dicts); never pickled: str hashes differ between processes
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        salt = self.salt
        if salt is not None:
            if type(salt) is str:
                _check_text(salt, "salt")
            elif type(salt) is not bytes:
                raise TypeError(f"salt must be str or bytes, got {type(salt).__name__}")
        lora_id = self.lora_id
        if lora_id is not None:
            if type(lora_id) is not int:
                raise TypeError(f"lora_id must be an int, got {type(lora_id).__name__} {_short(lora_id)}")
            if not 0 <= lora_id < ID_LIMIT:
                raise ValueError(f"lora_id must be an int in [0, 2**63), got {_short(lora_id)}")
        if self.lora_name is not None:
            if type(self.lora_name) is not str:
                raise TypeError(f"lora_name must be str, got {type(self.lora_name).__name__}")
            _check_text(self.lora_name, "lora_name")
        if type(self.extra_keys) is not tuple:
            raise TypeError(f"extra_keys must be a tuple, got {type(self.extra_keys).__name__}")
        for i, key in enumerate(self.extra_keys):
            _check_extra_key(key, i)
        _check_tags(self.tags)
        if _info_bound(self) > MAX_INFO_BYTES:
            size = len(self.to_info())
            if size > MAX_INFO_BYTES:
                raise ValueError(
                    f"namespace too large: its storage form (to_info) takes {size} bytes, "
                    f"at most {MAX_INFO_BYTES} fit a record (salt, lora_name, extra_keys)"
                )
        object.__setattr__(self, "_hash", hash((self.salt, self.lora_id, self.lora_name,
                                                self.extra_keys)))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> tuple[object, ...]:
        return (self.salt, self.lora_id, self.lora_name, self.extra_keys, self.tags)

    def __setstate__(self, state: tuple[object, ...]) -> None:
        salt, lora_id, lora_name, extra_keys, tags = state
        for name, value in (("salt", salt), ("lora_id", lora_id), ("lora_name", lora_name),
                            ("extra_keys", extra_keys), ("tags", tags)):
            object.__setattr__(self, name, value)
        self.__post_init__()  # checked again, and hashed in this process

    def digest(self) -> bytes:
        """16 stable bytes identifying this namespace (same on every machine).
        Never raises (every field was checked at construction)."""
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
        namespace's own extra keys (without the salt), a list or tuple.
        Raises TypeError / ValueError as the constructor does."""
        if cache_salt is not None and type(cache_salt) is not str:
            raise TypeError(f"cache_salt must be str, got {type(cache_salt).__name__}")
        if extra_keys is not None and type(extra_keys) not in (list, tuple):
            raise TypeError(f"extra_keys must be a list or tuple, got {type(extra_keys).__name__}")
        return cls(cache_salt, lora_id, lora_name, tuple(extra_keys or ()))

    def to_info(self) -> bytes:
        """Compact bytes that ``from_info`` turns back into this namespace
        (kept in storage records, for events about survivors after a restart);
        at most ``MAX_INFO_BYTES``, ASCII."""
        def enc(v: object) -> object:
            return {"b": v.hex()} if isinstance(v, bytes) else v

        doc = [enc(self.salt), self.lora_id, self.lora_name, [enc(k) for k in self.extra_keys]]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_info(cls, info: bytes) -> Namespace:
        """The namespace ``to_info`` wrote; ValueError for bytes it did not
        write (or that the constructor refuses)."""
        def dec(v: Any) -> Any:
            return bytes.fromhex(v["b"]) if isinstance(v, dict) else v

        try:
            salt, lora_id, lora_name, extra = json.loads(info)
            if type(extra) is not list:
                raise TypeError(f"extra keys are a {type(extra).__name__}")
            return cls(dec(salt), lora_id, lora_name, tuple(dec(k) for k in extra))
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise ValueError(f"namespace info {info[:60]!r} is not valid: {exc}") from None


if native_core is not None:  # the same hash without a Python frame (every dict lookup calls it)
    Namespace.__hash__ = native_core.namespace_hash  # type: ignore[method-assign]

DEFAULT_NAMESPACE = Namespace()

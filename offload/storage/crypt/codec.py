"""How a store frames and verifies its records: in the clear, or sealed.

Every backend writes and reads records through one ``RecordCodec``, chosen
when it opens (``open_codec``, in this package's ``__init__``) from its key
settings (``KeySource``):

* ``PlainRecords`` (no keys: the Null implementation): the record of
  offload/storage/record.py as it always was, checked by its checksum;
* ``SealedRecords`` (offload/storage/crypt/sealed.py): the same header in
  the clear, everything that tells of a prompt sealed with AES-256-GCM.

A codec is store-wide; a ``Framing`` is what one job frames or verifies its
records with: the codec bound to the job's tenant (its KV key). Jobs carry
their framing (offload/storage/jobs.py); the shared reader verifies with it
(offload/storage/reader.py), so a backend never sees a key.

A record a reader cannot authenticate, i.e. sealed under a key it does not
hold, failing its tag (tampered, another tenant's, another key's), or in
the clear where records must be sealed (and, for a reader without keys, a
sealed one), raises ``Unreadable``: the read stops there, a miss, counted
as ``decrypt_failures``, never served and never an error on the ticket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import record
from radixcache.offload.storage.record import RecordMeta

# What sealing adds to a record (sealed.py: key id, nonce, meta tag, KV
# tag): known here, without the ``cryptography`` package, to the transports
# that take records apart by their length fields (offload/storage/chunk.py).
SEAL_BYTES = 8 + 12 + 16 + 16

Bytes = bytes | memoryview  # a record value as a transport hands it over
Body = bytes | memoryview  # the part of a record sent after its head


class KeyLoadError(ValueError):
    """The master keys could not be loaded (offload/storage/crypt/keys.py).
    The message names the source and the problem, never the key text."""


class Unreadable(Exception):
    """A record this reader cannot authenticate (see the module docstring).
    Carries no key material: the message names the reason only."""


class Framing(Protocol):
    """Frames and verifies the records of one job (one tenant). Thread-safe.
    The fields of a record are ``record.encode_into``'s keyword arguments."""

    sealed: bool  # records are sealed (written encrypted, read only when authentic)

    def record_size(self, key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> int:
        """Bytes of one record value."""
        ...

    def encode_into(self, out: bytearray | memoryview, **fields: Any) -> None:
        """Write a whole record (``record.encode_into``'s fields) into ``out``
        (exactly ``record_size`` bytes)."""
        ...

    def encode_parts(self, **fields: Any) -> tuple[bytes, Body]:
        """A record as (head, body): the record is the two joined. Plain:
        body is the KV page itself (no copy); sealed: its ciphertext."""
        ...

    def read_into(
        self, value: Bytes, *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
    ) -> bool:
        """``record.read_into``: verify ``value`` and put its KV bytes in
        ``dst`` (overwritten even when it fails). False: not a record of this
        page (corrupt); raises ``Unreadable``."""
        ...

    def verify_parts(
        self, head: Bytes, kv: npt.NDArray[np.uint8], *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None,
    ) -> bool:
        """A record received in two parts: ``head`` its first bytes, ``kv``
        (a host page) its last ``kv.size`` bytes. True when it verifies and
        ``kv`` then holds the page's KV bytes; raises ``Unreadable``."""
        ...

    def read_split_into(
        self, head: Bytes, tail: memoryview, *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
    ) -> bool:
        """A record kept in two places: ``head`` every byte before its KV
        bytes (sealed: before the KV message), ``tail`` the rest (e.g. a view
        of a mapped file): the KV bytes; sealed, their ciphertext and tag.
        True when it verifies and ``dst`` then holds the page's KV bytes;
        raises ``Unreadable``."""
        ...


class RecordCodec(Framing, Protocol):
    """A store's way of framing records (framing the default tenant's
    itself); ``framing(tenant)`` binds a tenant."""

    def framing(self, tenant: bytes | None) -> Framing:
        """The framing of ``tenant``'s records (None: the default tenant)."""
        ...

    def read_meta(self, value: Bytes, tail: int = 0) -> RecordMeta | None:
        """``record.read_meta`` with the info readable; None for a record this
        codec cannot read (no KV bytes are read). ``tail``: bytes at the end
        of the record that ``value`` lacks (kept apart, e.g. in a slot)."""
        ...

    def read_tokens(self, value: Bytes, tail: int = 0) -> npt.NDArray[np.int32] | None:
        """The token ids of a record (empty for a raw page); None when
        unreadable. ``tail``: as for ``read_meta``."""
        ...

    def describe(self) -> str:
        """For messages and logs (never a key)."""
        ...


def is_sealed(value: Bytes) -> bool:
    """Whether ``value`` is a record with the sealed flag (any version read)."""
    h = record.parse_header(value)
    return h is not None and bool(h[2] & record.FLAG_SEALED)


class PlainRecords:
    """Records in the clear (the codec of a store without keys). A sealed
    record is ``Unreadable`` here: it is not this reader's to judge (and in
    a shared pool, not its to delete)."""

    sealed = False

    def framing(self, tenant: bytes | None) -> PlainRecords:
        return self

    def record_size(self, key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> int:
        return record.record_size(key_len, info_len, num_tokens, kv_bytes)

    def encode_into(self, out: bytearray | memoryview, **fields: Any) -> None:
        record.encode_into(out, **fields)

    def encode_parts(self, **fields: Any) -> tuple[bytes, Body]:
        tokens = fields["tokens"]
        t = 0 if tokens is None else int(tokens.size)
        head = bytearray(record.head_size(len(fields["key"]), len(fields.get("info", b"")), t))
        record.encode_head(head, **fields)
        return bytes(head), fields["kv"].reshape(-1).data

    def read_into(
        self, value: Bytes, *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
    ) -> bool:
        if is_sealed(value):
            raise Unreadable("a sealed record, and this store holds no keys")
        return record.read_into(value, key=key, ns_tag=ns_tag, tokens=tokens, dst=dst)

    def verify_parts(
        self, head: Bytes, kv: npt.NDArray[np.uint8], *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None,
    ) -> bool:
        if is_sealed(head):
            raise Unreadable("a sealed record, and this store holds no keys")
        return record.verify_parts(head, kv, key=key, ns_tag=ns_tag, tokens=tokens)

    def read_split_into(
        self, head: Bytes, tail: memoryview, *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
    ) -> bool:
        if is_sealed(head):
            raise Unreadable("a sealed record, and this store holds no keys")
        return record.read_split_into(head, tail, key=key, ns_tag=ns_tag, tokens=tokens, dst=dst)

    def read_meta(self, value: Bytes, tail: int = 0) -> RecordMeta | None:
        return None if is_sealed(value) else record.read_meta(value)

    def read_tokens(self, value: Bytes, tail: int = 0) -> npt.NDArray[np.int32] | None:
        return None if is_sealed(value) else record.read_tokens(value)

    def describe(self) -> str:
        return "records in the clear"

    def __repr__(self) -> str:
        return "PlainRecords()"


PLAIN = PlainRecords()


@dataclass(frozen=True, slots=True)
class KeySource:
    """Where a store's master keys come from (offload/storage/crypt/keys.py
    says the format): a key file, or an environment variable named here.
    Holds no key; the keys are read when the store opens. Neither set:
    records in the clear."""

    key_file: str | None = None  # path of a key file (chmod 600)
    key_env: str | None = None  # name of an environment variable holding the keys

    def __post_init__(self) -> None:
        for name in ("key_file", "key_env"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")
        if self.key_file is not None and self.key_env is not None:
            raise ValueError("give the storage keys in key_file or key_env, not both")

    @property
    def enabled(self) -> bool:
        return self.key_file is not None or self.key_env is not None


NO_KEYS = KeySource()

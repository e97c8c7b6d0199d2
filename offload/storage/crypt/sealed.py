"""Sealed records: the record of offload/storage/record.py, encrypted with AES-256-GCM.

A sealed record keeps the record's header and key in the clear (what a store
needs without keys: the namespace tag for forgetting, the write sequence for
recency, the lengths) and seals everything that tells of a prompt::

    offset          size   field
    0               72     header (record.py), flags |= FLAG_SEALED, checksum 0
    72              K      the full key the record was written under
    72+K            8      key id: which master key sealed it (keys.py)
    80+K            12     nonce: random, fresh for every record
    92+K   (= C)    I      info, encrypted            \\  the meta message,
    C+I             4T     token ids, encrypted        >  sealed with the
    C+I+4T          16     meta tag                   /   meta key
    C+I+4T+16       KV     KV bytes, encrypted        \\  the KV message, sealed with
    ...             16     KV tag                     /   the tenant's key

    associated data (authenticated, not encrypted):
        meta message: F || bytes 0 .. C   (header, key, key id, nonce)
        KV message:   F || bytes 0 .. C || meta tag
    F: a 32-byte digest of the store's model fingerprint (model, KV layout,
       dtype, page size, rank)

So a record is read only under the key it was written under (key and
namespace tag in the header, both authenticated), for the model it was
written for (F), and with the key of the tenant it was written for (the KV
key is the tenant's): a record copied under another key, another
tenant's record, a flipped bit anywhere (header, key id, nonce, tag,
ciphertext) or a record of another master key fails its tag. The token ids
are compared after decryption, as in the clear.

The KV checksum of clear records is not computed for sealed ones: the GCM
tag authenticates every KV byte, and a GCM pass is already a pass over the
page (one pass, where a clear record takes a copy and a checksum).

The meta key depends on the master key only, so a store announces what it
holds at start (``read_meta``, ``read_tokens``) without knowing its tenants;
reading KV needs the tenant. Nonces are 96 random bits: under one key at
most about 2**32 records should be written (NIST SP 800-38D); rotate keys
well before (2**32 pages of 16 KiB are 64 TiB).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag

from radixcache.offload.storage import record
from radixcache.offload.storage.contract import ModelFingerprint
from radixcache.offload.storage.crypt import codec
from radixcache.offload.storage.crypt.codec import Body, Bytes, Unreadable
from radixcache.offload.storage.crypt.gcm import Gcm
from radixcache.offload.storage.crypt.keys import KEY_ID_BYTES, KeyRing
from radixcache.offload.storage.record import HEADER, RecordMeta

NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_BYTES = KEY_ID_BYTES + NONCE_BYTES + 2 * TAG_BYTES  # what sealing adds to a record
assert SEAL_BYTES == codec.SEAL_BYTES, "codec.py states what sealing adds, for transports"


class _Layout:
    """Where the parts of a sealed record lie (see the module docstring)."""

    __slots__ = ("key_at", "clear_at", "meta_end", "kv_at", "total")

    def __init__(self, key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> None:
        self.key_at = HEADER.size + key_len  # the key id, then the nonce
        self.clear_at = self.key_at + KEY_ID_BYTES + NONCE_BYTES  # end of the clear part
        self.meta_end = self.clear_at + info_len + 4 * num_tokens  # the meta tag starts here
        self.kv_at = self.meta_end + TAG_BYTES  # the KV ciphertext starts here
        self.total = self.kv_at + kv_bytes + TAG_BYTES


def sealed_size(key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> int:
    """Bytes of a sealed record."""
    return record.record_size(key_len, info_len, num_tokens, kv_bytes) + SEAL_BYTES


def _token_bytes(tokens: npt.NDArray[np.int32] | None) -> bytes:
    return b"" if tokens is None else tokens.astype("<i4", copy=False).reshape(-1).tobytes()


class SealedRecords:
    """The codec of a store with keys (offload/storage/crypt/codec.py)."""

    sealed = True

    def __init__(self, ring: KeyRing, fingerprint: ModelFingerprint) -> None:
        self._ring = ring
        self._bind = hashlib.blake2b(
            b"radixcache/storage/v1/fingerprint\0" + fingerprint.describe().encode(),
            digest_size=32,
        ).digest()  # F: binds every record to the model it was written for
        self._default = TenantSeal(self, None)
        self._bodies = _Bodies()  # the ciphertexts encode_parts hands out

    def framing(self, tenant: bytes | None) -> TenantSeal:
        return self._default if tenant is None else TenantSeal(self, tenant)

    # the codec frames the default tenant itself
    def record_size(self, key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> int:
        return sealed_size(key_len, info_len, num_tokens, kv_bytes)

    def encode_into(self, out: bytearray | memoryview, **fields: Any) -> None:
        self._default.encode_into(out, **fields)

    def encode_parts(self, **fields: Any) -> tuple[bytes, Body]:
        return self._default.encode_parts(**fields)

    def read_into(self, value: Bytes, **checks: Any) -> bool:
        return self._default.read_into(value, **checks)

    def verify_parts(self, head: Bytes, kv: npt.NDArray[np.uint8], **checks: Any) -> bool:
        return self._default.verify_parts(head, kv, **checks)

    def read_split_into(self, head: Bytes, tail: memoryview, **checks: Any) -> bool:
        return self._default.read_split_into(head, tail, **checks)

    # -- survivors: the meta message only -----------------------------------------
    def read_meta(self, value: Bytes, tail: int = 0) -> RecordMeta | None:
        opened = self._open_meta(value, tail)
        if opened is None:
            return None
        h, info, _tokens = opened
        _m, _v, flags, _c, count, kv_bytes, seq, tag, bid, pid, depth, klen, _i = h
        return RecordMeta(
            key=bytes(memoryview(value)[HEADER.size : HEADER.size + klen]),
            ns_tag=bytes(tag),
            block_id=None if bid < 0 else bid,
            parent_block_id=None if pid < 0 else pid,
            depth=depth,
            seq=seq,
            info=info,
            num_tokens=count,
            kv_bytes=kv_bytes,
            raw=bool(flags & record.FLAG_RAW),
        )

    def read_tokens(self, value: Bytes, tail: int = 0) -> npt.NDArray[np.int32] | None:
        opened = self._open_meta(value, tail)
        return None if opened is None else opened[2]

    def _open_meta(
        self, value: Bytes, tail: int
    ) -> tuple[tuple[int, ...], bytes, npt.NDArray[np.int32]] | None:
        """(header, info, token ids) of a sealed record (``value``, less its
        last ``tail`` bytes), its meta message authenticated; None for
        anything else."""
        h = record.parse_header(value)
        if h is None or not h[2] & record.FLAG_SEALED:
            return None
        lay = _Layout(h[11], h[12], h[4], h[5])
        if len(value) + tail != lay.total:
            return None
        view = memoryview(value)
        try:
            plain = self._decrypt_meta(view, lay)
        except Unreadable:
            return None
        tokens = np.frombuffer(plain, dtype="<i4", offset=h[12]).astype(np.int32)
        return h, plain[: h[12]], tokens

    # -- shared by the tenants' framings ------------------------------------------
    def _aad(self, head: memoryview, lay: _Layout) -> bytes:
        return self._bind + bytes(head[: lay.clear_at])

    def _decrypt_meta(self, head: memoryview, lay: _Layout) -> bytes:
        """The meta message's plaintext (info, then token ids); raises Unreadable."""
        meta = self._ring.meta_aead(bytes(head[lay.key_at : lay.key_at + KEY_ID_BYTES]))
        if meta is None:
            raise Unreadable("sealed under a key this store does not hold")
        nonce = bytes(head[lay.key_at + KEY_ID_BYTES : lay.clear_at])
        try:
            return meta.decrypt(nonce, head[lay.clear_at : lay.kv_at], self._aad(head, lay))
        except InvalidTag:
            raise Unreadable("the record's info and token ids failed authentication") from None

    def __repr__(self) -> str:
        return f"SealedRecords({self._ring.describe()})"

    def describe(self) -> str:
        return f"records sealed with {self._ring.describe()} ({self._ring.source})"


class TenantSeal:
    """The framing of one tenant's records: ``SealedRecords`` with the
    tenant's KV key. Holds the tenant label, never shown."""

    __slots__ = ("_codec", "_ring", "_tenant")
    sealed = True

    def __init__(self, codec: SealedRecords, tenant: bytes | None) -> None:
        self._codec = codec
        self._ring = codec._ring
        self._tenant = tenant

    def __repr__(self) -> str:
        return "TenantSeal(<tenant>)"

    def record_size(self, key_len: int, info_len: int, num_tokens: int, kv_bytes: int) -> int:
        return sealed_size(key_len, info_len, num_tokens, kv_bytes)

    # -- writing ---------------------------------------------------------------------
    def _seal_head(
        self, head: memoryview, lay: _Layout, *, key: bytes, ns_tag: bytes,
        tokens: npt.NDArray[np.int32] | None, kv: npt.NDArray[np.uint8], seq: int,
        block_id: int | None = None, parent_block_id: int | None = None, depth: int = 0,
        info: bytes = b"",
    ) -> tuple[Gcm, bytes, bytes]:
        """Write everything before the KV ciphertext into ``head``; returns the
        tenant's AEAD, the nonce and the KV message's associated data."""
        kid = self._ring.current_id
        meta = self._ring.meta_aead(kid)
        aead = self._ring.tenant_aead(kid, self._tenant)
        assert meta is not None and aead is not None, "the current key is in its ring"
        flags = record.FLAG_SEALED | (record.FLAG_RAW if tokens is None else 0)
        record.pack_header(
            head, flags=flags, num_tokens=0 if tokens is None else int(tokens.size),
            kv_size=kv.size, seq=seq, ns_tag=ns_tag, block_id=block_id,
            parent_block_id=parent_block_id, depth=depth, key=key, info_len=len(info),
        )  # fmt: skip
        nonce = os.urandom(NONCE_BYTES)
        head[lay.key_at : lay.key_at + KEY_ID_BYTES] = kid
        head[lay.key_at + KEY_ID_BYTES : lay.clear_at] = nonce
        aad = self._codec._aad(head, lay)
        meta.encrypt_into(nonce, info + _token_bytes(tokens), aad, head[lay.clear_at : lay.kv_at])
        return aead, nonce, aad + bytes(head[lay.meta_end : lay.kv_at])

    def encode_into(self, out: bytearray | memoryview, **fields: Any) -> None:
        """Write the sealed record of ``fields`` (``record.encode_into``'s) into
        ``out``: one AES-GCM pass from the page into ``out``."""
        lay = self._layout(fields)
        if len(out) != lay.total:
            raise ValueError(f"record buffer of {len(out)} B for a record of {lay.total} B")
        view = memoryview(out)
        aead, nonce, aad = self._seal_head(view[: lay.kv_at], lay, **fields)
        aead.encrypt_into(nonce, fields["kv"].reshape(-1), aad, view[lay.kv_at :])

    def encode_parts(self, **fields: Any) -> tuple[bytes, Body]:
        """(head, KV ciphertext and tag), for writers that send them without
        joining. The body is a view of a recycled buffer (``_Bodies``): the
        writer drops it once sent."""
        lay = self._layout(fields)
        head = bytearray(lay.kv_at)
        aead, nonce, aad = self._seal_head(memoryview(head), lay, **fields)
        body = self._codec._bodies.take(lay.total - lay.kv_at)
        aead.encrypt_into(nonce, fields["kv"].reshape(-1), aad, body)
        return bytes(head), body

    @staticmethod
    def _layout(fields: dict[str, Any]) -> _Layout:
        tokens = fields["tokens"]
        t = 0 if tokens is None else int(tokens.size)
        return _Layout(len(fields["key"]), len(fields.get("info", b"")), t, fields["kv"].size)

    # -- reading ---------------------------------------------------------------------
    def _checked(
        self, head: memoryview, total: int, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, kv_size: int,
    ) -> _Layout | None:
        """The layout of a sealed record of ``total`` bytes whose first bytes
        are ``head``, if its clear part says it is this page's: the lengths,
        the key, the namespace tag (unless None) and the raw flag. Raises
        Unreadable for a record in the clear."""
        h = record.parse_header(head)
        if h is None:
            return None
        _m, _v, flags, _crc, count, kv_bytes, _seq, tag, _b, _p, _d, klen, ilen = h
        if not flags & record.FLAG_SEALED:
            raise Unreadable("a record in the clear, and this store's records are sealed")
        t = 0 if tokens is None else int(tokens.size)
        if bool(flags & record.FLAG_RAW) != (tokens is None) or count != t or kv_bytes != kv_size:
            return None
        lay = _Layout(klen, ilen, t, kv_size)
        if total != lay.total or len(head) < lay.kv_at or klen != len(key):
            return None  # truncated, padded, or another key's length
        if head[HEADER.size : HEADER.size + klen] != key:
            return None  # stored under another key than it was written for
        if ns_tag is not None and tag != ns_tag:
            return None  # another namespace's page
        return lay

    def _open_head(
        self, head: memoryview, lay: _Layout, tokens: npt.NDArray[np.int32] | None, ilen: int
    ) -> tuple[Gcm, bytes, bytes] | None:
        """Authenticate the meta message and compare the token ids; returns the
        tenant's AEAD, the nonce and the KV message's associated data, or None
        when the record holds other token ids. Raises Unreadable."""
        plain = self._codec._decrypt_meta(head, lay)
        if plain[ilen:] != _token_bytes(tokens):
            return None
        kid = bytes(head[lay.key_at : lay.key_at + KEY_ID_BYTES])
        aead = self._ring.tenant_aead(kid, self._tenant)
        assert aead is not None, "the meta key of this key id was found"
        aad = self._codec._aad(head, lay) + bytes(head[lay.meta_end : lay.kv_at])
        return aead, bytes(head[lay.key_at + KEY_ID_BYTES : lay.clear_at]), aad

    def read_into(
        self, value: Bytes, *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
    ) -> bool:
        view = memoryview(value)
        lay = self._checked(view, len(view), key, ns_tag, tokens, dst.size)
        # one pass: the ciphertext (e.g. in LMDB's map) decrypted into the page
        return lay is not None and self._open_into(view, lay, tokens, view[lay.kv_at :], dst)

    def verify_parts(
        self, head: Bytes, kv: npt.NDArray[np.uint8], *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None,
    ) -> bool:
        """The record is ``head`` + ``kv``, as a pool reader receives it (its
        last ``kv.size`` bytes straight into the host page ``kv``): the KV
        message then starts in ``head`` (its first 16 bytes) and ends in
        ``kv`` (with the tag). It is joined in a scratch buffer of this
        thread and decrypted into ``kv``."""
        view = memoryview(head)
        lay = self._checked(view, len(view) + kv.size, key, ns_tag, tokens, kv.size)
        if lay is None:
            return False
        page = kv.reshape(-1)
        joined = _scratch(page.size + TAG_BYTES)
        lead = len(view) - lay.kv_at  # KV message bytes in the head (its first TAG_BYTES)
        joined[:lead] = np.frombuffer(view[lay.kv_at :], dtype=np.uint8)
        joined[lead:] = page
        return self._open_into(view, lay, tokens, joined.data, kv)

    def read_split_into(
        self, head: Bytes, tail: memoryview, *, key: bytes, ns_tag: bytes | None,
        tokens: npt.NDArray[np.int32] | None, dst: npt.NDArray[np.uint8],
    ) -> bool:
        """The record is ``head`` + ``tail``, the tail being the whole KV
        message (ciphertext and tag, e.g. in a slot of a mapped file):
        decrypted from where it lies into ``dst``, in one pass."""
        view = memoryview(head)
        lay = self._checked(view, len(view) + len(tail), key, ns_tag, tokens, dst.size)
        if lay is None or len(view) != lay.kv_at:
            return False
        return self._open_into(view, lay, tokens, tail, dst)

    def _open_into(
        self, head: memoryview, lay: _Layout, tokens: npt.NDArray[np.int32] | None,
        message: memoryview, dst: npt.NDArray[np.uint8],
    ) -> bool:
        """Authenticate the record's head (``_open_head``) and decrypt its KV
        message (ciphertext and tag, wherever it lies) into ``dst``. False
        when the record holds other token ids; raises Unreadable."""
        opened = self._open_head(head, lay, tokens, HEADER.unpack_from(head)[12])
        if opened is None:
            return False
        aead, nonce, aad = opened
        try:
            aead.decrypt_into(nonce, message, aad, dst.reshape(-1).data)
        except InvalidTag:
            raise Unreadable("the KV bytes failed authentication") from None
        return True


class _Bodies:
    """Buffers for the ciphertexts ``encode_parts`` hands to a writer, reused
    once the writer let go of them. A fresh 2 MiB buffer per record costs
    its page faults, measured here at twice the GCM pass itself; a buffer is
    handed out again only when nothing but this pool refers to it (its
    reference count), so a record still queued or on the wire is never
    overwritten. At most ``MAX_BYTES`` are kept; beyond, buffers are fresh."""

    MAX_BYTES = 64 << 20

    def __init__(self) -> None:
        self._free: list[npt.NDArray[np.uint8]] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """A writable buffer of ``size`` bytes that nobody else holds."""
        with self._lock:
            for buf in self._free:
                # held by: the list, the loop variable and getrefcount's argument
                if buf.size == size and sys.getrefcount(buf) <= 3:
                    return buf.data
            buf = np.empty(size, dtype=np.uint8)
            if (len(self._free) + 1) * size <= self.MAX_BYTES:
                self._free = [b for b in self._free if b.size == size] + [buf]
            return buf.data


_local = threading.local()


def _scratch(size: int) -> npt.NDArray[np.uint8]:
    """A buffer of ``size`` bytes owned by this thread (reused between reads)."""
    buf: npt.NDArray[np.uint8] | None = getattr(_local, "buf", None)
    if buf is None or buf.size != size:
        buf = np.empty(size, dtype=np.uint8)
        _local.buf = buf
    return buf

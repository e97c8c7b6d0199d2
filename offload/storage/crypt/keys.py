"""Master keys for encryption at rest, and the keys derived from them.

An operator supplies 256-bit master keys in a key file or in an environment
variable (never on a command line or in a URL: both are visible to every
user of the machine, e.g. through ``ps``). The text holds the keys one per
line (a file) or separated by white space or commas (a variable), each as 64
hex digits or as the base64 of 32 bytes; blank lines and lines starting with
``#`` are skipped::

    # radixcache storage keys: the first one writes, all of them read
    5f0c0d2b...e1      <- the current key: every record is written under it
    9a44e1f0...07      <- an older key: records written under it still read

Rotation: put the new key first and keep the old ones after it for as long
as records written under them live (a pool's records: its ``ttl_s``;
LMDB's: until they are evicted, or read once: an LMDB record under a key no
longer listed is deleted when it is read); then drop them.

What is derived from each master key, with HKDF-SHA256 (RFC 5869)::

    key id      8 bytes, in the clear in every record written under the key:
                which master key reads it (it tells nothing about the key)
    meta key    the AES-256-GCM key of the records' namespace info and token
                ids (one per master key: survivors are announced at start
                without knowing tenants)
    tenant key  the AES-256-GCM key of one tenant's KV bytes; a tenant is a
                namespace's cache salt (None: the default tenant)

Secrecy: key bytes live only inside ``KeyRing`` (and the AES objects made
from them); ``repr``, messages and exceptions show key ids and counts,
never key bytes or key text, and a ``KeyRing`` refuses to be pickled.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import stat
import threading
from collections.abc import Sequence
from typing import NoReturn

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from radixcache.offload.storage.crypt.codec import KeyLoadError
from radixcache.offload.storage.crypt.gcm import Gcm

log = logging.getLogger(__name__)

KEY_BYTES = 32  # a master key (and every derived AES key): AES-256
KEY_ID_BYTES = 8
MAX_KEYS = 16  # master keys in one ring (the current one and older ones)
_INFO = b"radixcache/storage/v1/"  # HKDF info prefix: every derivation is named
_MAX_TENANT_AEADS = 4096  # tenant keys kept derived (a few microseconds each to redo)
_SPLIT = re.compile(r"[\s,]+")


def _derive(master: bytes, what: bytes, length: int = KEY_BYTES) -> bytes:
    return HKDF(hashes.SHA256(), length, None, _INFO + what).derive(master)


def tenant_label(tenant: bytes | None) -> bytes:
    """The HKDF label of a tenant's key: a digest, so that any salt length
    fits and no two tenants (None included) share a label."""
    if tenant is None:
        return b"kv/default"
    return b"kv/salt/" + hashlib.blake2b(tenant, digest_size=32).digest()


class KeyRing:
    """The master keys in use: ``keys[0]`` writes, every key reads.

    Thread-safe: the readers and the writer of a store derive tenant keys
    concurrently (the cache of derived keys is guarded by a lock).
    """

    __slots__ = ("_masters", "_ids", "_meta", "_tenants", "_lock", "source")

    def __init__(self, keys: Sequence[bytes], source: str = "keys given in code") -> None:
        """``keys``: master keys of 32 bytes each, the current one first;
        ``source``: where they came from, for messages (never the keys)."""
        if not keys:
            raise KeyLoadError(f"{source}: no key (a key ring needs at least one)")
        if len(keys) > MAX_KEYS:
            raise KeyLoadError(f"{source}: {len(keys)} keys; at most {MAX_KEYS}")
        for i, key in enumerate(keys):
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                size = len(key) if isinstance(key, bytes) else type(key).__name__
                raise KeyLoadError(f"{source}: key {i + 1} is {size} bytes, not {KEY_BYTES}")
        self.source = source  # for messages
        self._masters = {_derive(k, b"key-id", KEY_ID_BYTES): k for k in keys}
        if len(self._masters) != len(keys):
            raise KeyLoadError(f"{source}: a key is listed twice")
        self._ids = list(self._masters)  # key ids, the current key's first
        self._meta = {kid: AESGCM(_derive(k, b"meta")) for kid, k in self._masters.items()}
        self._tenants: dict[tuple[bytes, bytes], Gcm] = {}
        self._lock = threading.Lock()

    @property
    def current_id(self) -> bytes:
        """The key id new records are written under."""
        return self._ids[0]

    @property
    def key_ids(self) -> list[bytes]:
        """Every key id this ring reads, the current one first."""
        return list(self._ids)

    def meta_aead(self, key_id: bytes) -> AESGCM | None:
        """The AEAD of records' info and token ids under ``key_id``; None when
        this ring does not hold that key."""
        return self._meta.get(key_id)

    def tenant_aead(self, key_id: bytes, tenant: bytes | None) -> Gcm | None:
        """The AEAD of ``tenant``'s KV bytes under ``key_id`` (derived once,
        then cached); None when this ring does not hold that key."""
        label = tenant_label(tenant)
        found = self._tenants.get((key_id, label))
        if found is not None:
            return found
        master = self._masters.get(key_id)
        if master is None:
            return None
        aead = Gcm(_derive(master, label))
        with self._lock:
            if len(self._tenants) >= _MAX_TENANT_AEADS:
                self._tenants.clear()  # many tenants: derive again as they come
            self._tenants[(key_id, label)] = aead
        return aead

    def describe(self) -> str:
        """For messages: how many keys, the current key's id (never a key)."""
        old = len(self._ids) - 1
        return f"AES-256-GCM, key id {self.current_id.hex()} writes" + (
            f", {old} older key{'s' if old != 1 else ''} read" if old else ""
        )

    def __repr__(self) -> str:
        return f"KeyRing({self.describe()}; from {self.source})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a KeyRing holds secret keys and cannot be pickled")


def parse_keys(text: str, source: str) -> list[bytes]:
    """The master keys in ``text`` (see the module docstring); KeyLoadError
    naming ``source`` and the entry, never its text."""
    entries = [
        word
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for word in _SPLIT.split(line.strip())
        if word
    ]
    if not entries:
        raise KeyLoadError(f"{source} holds no key")
    return [_decode(word, f"{source}: key {i + 1}") for i, word in enumerate(entries)]


def _decode(word: str, where: str) -> bytes:
    if re.fullmatch(r"[0-9a-fA-F]+", word):
        if len(word) != 2 * KEY_BYTES:
            raise KeyLoadError(
                f"{where} has {len(word)} hex digits; a key is {2 * KEY_BYTES} "
                f"({KEY_BYTES} random bytes, e.g. from 'openssl rand -hex {KEY_BYTES}')"
            )
        return bytes.fromhex(word)
    try:
        raw = base64.b64decode(word + "=" * (-len(word) % 4), altchars=b"-_" if "-" in word
                               or "_" in word else None, validate=True)
    except (binascii.Error, ValueError):
        raise KeyLoadError(f"{where} is neither hex nor base64") from None
    if len(raw) != KEY_BYTES:
        raise KeyLoadError(f"{where} decodes to {len(raw)} bytes; a key is {KEY_BYTES}")
    return raw


def load_key_file(path: str) -> KeyRing:
    """The key ring in the file at ``path``; KeyLoadError when it cannot be read
    or holds no valid key. Warns when other users may read the file."""
    source = f"key file {path!r}"
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(1 << 16)
    except OSError as exc:
        raise KeyLoadError(f"{source} cannot be read: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s can be read by other users (mode %o): chmod 600 it", source, mode & 0o777)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyLoadError(f"{source} is not text (keys are hex or base64 lines)") from None
    return KeyRing(parse_keys(text, source), source)


def load_key_env(name: str) -> KeyRing:
    """The key ring in the environment variable ``name``; KeyLoadError when it
    is unset or holds no valid key."""
    source = f"environment variable {name}"
    text = os.environ.get(name)
    if text is None:
        raise KeyLoadError(f"{source} is not set")
    return KeyRing(parse_keys(text, source), source)

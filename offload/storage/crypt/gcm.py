"""AES-256-GCM whose decryption of a page leaves the GIL free.

``cryptography``'s ``AESGCM`` keeps the GIL for its whole pass: here, two
threads opening 256 KiB pages together ran no faster than one alone. A
store's reader threads then took turns on one core for sealed records,
where records in the clear are copied and summed on all of them at once,
the GIL released.

``Gcm(key)`` offers the two calls records make, ``encrypt_into`` and
``decrypt_into``, with ``AESGCM``'s arguments and results. ``decrypt_into``
of a message of at least ``LARGE`` bytes goes through OpenSSL's EVP
interface of the ``libcrypto`` this Python's own ``ssl`` and ``hashlib``
modules loaded, called through ``ctypes``, which releases the GIL for each
call. Everything else goes through ``AESGCM``: smaller messages (a record's
meta message), every message where no such library loads, and encryption,
which runs on a store's one writer thread, where the GIL buys nothing and
``cryptography``'s own OpenSSL ran its pass faster per core than this
machine's libcrypto (sealed LMDB writes 0.78-0.80x of clear through
libcrypto against 0.81-0.82x through ``AESGCM``, the same session). Both
are AES-256-GCM with a 12-byte nonce and the 16-byte tag after the
ciphertext: a message either sealed opens with the other (tested). A
library that does not open ``AESGCM``'s output of a test message when it
loads is not used.

Per thread and key, one EVP context holds the expanded key; a message sets
only its nonce. A failed authentication raises ``InvalidTag``, as
``AESGCM`` does; the destination may then hold unauthenticated bytes (the
caller treats the page as not read). ``RADIXCACHE_GCM=cryptography`` in the
environment keeps every message on ``AESGCM``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

LARGE = 64 << 10  # messages from this size on are opened with the GIL free
TAG_BYTES = 16
NONCE_BYTES = 12
_CHUNK = 1 << 30  # the most bytes one EVP update takes here (its length is an int)
_SET_TAG = 0x11  # EVP_CTRL_GCM_SET_TAG
_P, _I = ctypes.c_void_p, ctypes.c_int


class _Lib:
    """The EVP decryption calls of one libcrypto, typed (every argument an
    address or an int, so ctypes converts nothing)."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self.new = lib.EVP_CIPHER_CTX_new
        self.new.restype, self.new.argtypes = _P, []
        self.free = lib.EVP_CIPHER_CTX_free
        self.free.restype, self.free.argtypes = None, [_P]
        cipher = lib.EVP_aes_256_gcm
        cipher.restype, cipher.argtypes = _P, []
        self.cipher = cipher()
        self.init = lib.EVP_DecryptInit_ex
        self.init.restype, self.init.argtypes = _I, [_P, _P, _P, _P, _P]
        self.update = lib.EVP_DecryptUpdate
        self.update.restype, self.update.argtypes = _I, [_P, _P, _P, _P, _I]
        self.final = lib.EVP_DecryptFinal_ex
        self.final.restype, self.final.argtypes = _I, [_P, _P, _P]
        self.ctrl = lib.EVP_CIPHER_CTX_ctrl
        self.ctrl.restype, self.ctrl.argtypes = _I, [_P, _I, _I, _P]
        if not self.cipher:
            raise OSError("no AES-256-GCM cipher")


def _loaded_path() -> str | None:
    """The libcrypto this process already mapped (through ``ssl`` or
    ``hashlib``), or the one the linker would find; None when there is none."""
    try:
        import _hashlib  # noqa: F401  (maps this Python's libcrypto, where it has one)
    except ImportError:
        pass
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libcrypto.so" in path:
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("crypto")


def _open() -> _Lib | None:
    """The process's libcrypto, checked on a message ``AESGCM`` sealed and
    on the same message flipped; None when it does not load or disagrees."""
    path = _loaded_path()
    if path is None:
        return None
    try:
        lib = _Lib(ctypes.CDLL(path), path)
    except (OSError, AttributeError):
        return None
    key, nonce, aad = bytes(range(32)), bytes(12), b"radixcache"
    data = bytes(i % 251 for i in range(3 * 64 + 5))
    sealed = bytearray(AESGCM(key).encrypt(nonce, data, aad))
    out = bytearray(len(data))
    try:
        ctx = _Ctx(lib, key)
        opened = ctx.open(nonce, memoryview(sealed), aad, memoryview(out)) and bytes(out) == data
        sealed[7] ^= 1
        refused = not ctx.open(nonce, memoryview(sealed), aad, memoryview(out))
    except (RuntimeError, MemoryError):
        return None
    return lib if opened and refused else None


_lib: _Lib | None = None
_opened = False
_lock = threading.Lock()


def libcrypto() -> _Lib | None:
    """The libcrypto large messages are opened with (loaded once), or None:
    every message then goes through ``AESGCM``."""
    global _lib, _opened
    if not _opened:
        with _lock:
            if not _opened:
                _lib = None if os.environ.get("RADIXCACHE_GCM") == "cryptography" else _open()
                _opened = True
    return _lib


def _address(buf: Any, writable: bool) -> tuple[npt.NDArray[np.uint8], int]:
    """A byte view of ``buf`` (kept alive by the caller) and its address."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    if writable and not arr.flags.writeable:
        raise TypeError("the destination buffer is read-only")
    return arr, arr.ctypes.data


class _Ctx:
    """One EVP decryption context, its key set: one thread's, for one key."""

    __slots__ = ("_lib", "_ctx")

    def __init__(self, lib: _Lib, key: bytes) -> None:
        self._lib = lib
        self._ctx = lib.new()
        if not self._ctx:
            raise MemoryError("EVP_CIPHER_CTX_new failed")
        if lib.init(self._ctx, lib.cipher, None, key, None) != 1:
            raise RuntimeError("libcrypto refused the key")

    def __del__(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx:
            self._lib.free(ctx)

    def open(self, nonce: bytes, data: memoryview, aad: bytes | None, out: memoryview) -> bool:
        """Decrypt ``data`` (the ciphertext, then the tag) into ``out``; False
        when it fails authentication."""
        lib, ctx = self._lib, self._ctx
        n = len(data) - TAG_BYTES
        src, at = _address(data, False)  # (both arrays kept alive for the calls)
        dst, to = _address(out, True)
        written = ctypes.c_int(0)
        ref = ctypes.byref(written)
        if lib.init(ctx, None, None, None, nonce) != 1:
            raise RuntimeError("libcrypto refused the nonce")
        if aad:
            aad = bytes(aad)
            if lib.update(ctx, None, ref, aad, len(aad)) != 1:
                raise RuntimeError("libcrypto refused the associated data")
        done = 0
        while done < n:
            step = min(n - done, _CHUNK)
            if lib.update(ctx, to + done, ref, at + done, step) != 1 or written.value != step:
                raise RuntimeError("libcrypto failed a GCM pass")
            done += step
        if lib.ctrl(ctx, _SET_TAG, TAG_BYTES, at + n) != 1:
            raise RuntimeError("libcrypto refused the tag")
        return lib.final(ctx, None, ref) == 1


class Gcm:
    """AES-256-GCM under one key: ``AESGCM``'s ``encrypt_into`` and
    ``decrypt_into``, the GIL free while a large message is opened (module
    doc). Thread-safe: each thread opens with a context of its own."""

    __slots__ = ("_aead", "_key", "_local")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)  # (checks the key's length)
        self._key = bytes(key)
        self._local = threading.local()

    def __repr__(self) -> str:
        return "Gcm(<key>)"

    def __reduce__(self) -> Any:
        raise TypeError("a Gcm holds key bytes and cannot be pickled")

    def encrypt_into(self, nonce: bytes, data: Any, associated_data: bytes | None, buf: Any) -> int:
        """Seal ``data`` into ``buf`` (``len(data) + 16`` bytes: the
        ciphertext, then the tag) with ``AESGCM``; returns the bytes written."""
        return self._aead.encrypt_into(nonce, data, associated_data, buf)

    def decrypt_into(self, nonce: bytes, data: Any, associated_data: bytes | None, buf: Any) -> int:
        """Open ``data`` (the ciphertext, then the tag) into ``buf`` (``len(data)
        - 16`` bytes); returns the bytes written. Raises ``InvalidTag`` when
        it fails authentication (``buf`` may then hold unauthenticated bytes)."""
        lib = libcrypto()
        if lib is None or memoryview(data).nbytes - TAG_BYTES < LARGE:
            return self._aead.decrypt_into(nonce, data, associated_data, buf)
        data_v, out_v = memoryview(data).cast("B"), memoryview(buf).cast("B")
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce of {len(nonce)} bytes; AES-GCM here takes {NONCE_BYTES}")
        if len(out_v) != len(data_v) - TAG_BYTES:
            raise ValueError(
                f"buffer of {len(out_v)} bytes for {len(data_v) - TAG_BYTES} bytes of plaintext"
            )
        ctx: _Ctx | None = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = _Ctx(lib, self._key)
        if not ctx.open(nonce, data_v, associated_data, out_v):
            raise InvalidTag
        return len(out_v)

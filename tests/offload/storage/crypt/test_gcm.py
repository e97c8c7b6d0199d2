"""``Gcm``: AES-256-GCM opening large messages through libcrypto, the GIL
free; the same bytes as ``cryptography``'s ``AESGCM`` both ways, the same
refusals, and the fallback where no libcrypto loads."""

from __future__ import annotations

import mmap
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.offload.storage.crypt import gcm
from radixcache.offload.storage.crypt.gcm import LARGE, Gcm

KEY = bytes(range(32))
NONCE = bytes(range(100, 112))
SIZES = [0, 1, 4095, LARGE - 1, LARGE, LARGE + 1, 256 << 10, (2 << 20) + 7]


class _Refuses:
    """Stands in for a Gcm's AESGCM: fails a test that reaches it."""

    def decrypt_into(self, *args: Any) -> int:
        raise AssertionError("the message went through AESGCM")


@pytest.fixture
def through_libcrypto() -> Gcm:
    """A Gcm whose AESGCM refuses to open: only libcrypto opens large messages."""
    if gcm.libcrypto() is None:
        pytest.fail("no libcrypto loaded, though this Python has one (test_the_libcrypto...)")
    g = Gcm(KEY)
    g._aead = _Refuses()  # type: ignore[assignment]
    return g


def test_the_libcrypto_this_python_loaded_is_used() -> None:
    path = gcm._loaded_path()
    assert path is not None, "this Python's hashlib maps a libcrypto"
    lib = gcm.libcrypto()
    assert lib is not None and lib.path == path


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("aad", [None, b"", b"associated bytes"])
def test_both_ways_the_same_bytes_as_aesgcm(size: int, aad: bytes | None) -> None:
    data = os.urandom(size)
    sealed = AESGCM(KEY).encrypt(NONCE, data, aad)
    out = bytearray(size)
    assert Gcm(KEY).decrypt_into(NONCE, sealed, aad, out) == size
    assert bytes(out) == data
    mine = bytearray(size + 16)
    assert Gcm(KEY).encrypt_into(NONCE, data, aad, mine) == size + 16
    assert bytes(mine) == sealed


@pytest.mark.parametrize("size", [LARGE, 256 << 10])
def test_large_messages_open_through_libcrypto(through_libcrypto: Gcm, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    sealed = AESGCM(KEY).encrypt(NONCE, data.tobytes(), b"aad")
    out = np.zeros(size, np.uint8)
    through_libcrypto.decrypt_into(NONCE, sealed, b"aad", out)
    assert np.array_equal(out, data)
    with pytest.raises(AssertionError, match="AESGCM"):  # a small one goes there
        through_libcrypto.decrypt_into(NONCE, sealed[: LARGE - 1 + 16], b"aad", out[: LARGE - 1])


def test_opens_from_a_read_only_mapped_file(through_libcrypto: Gcm, tmp_path: Path) -> None:
    data = os.urandom(3 * LARGE)
    path = tmp_path / "slot"
    path.write_bytes(b"x" * 100 + AESGCM(KEY).encrypt(NONCE, data, None))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:
            out = bytearray(len(data))
            through_libcrypto.decrypt_into(NONCE, view[100:], None, out)
        finally:
            view.release()
    assert bytes(out) == data


def _flip(buf: bytes, at: int) -> bytes:
    b = bytearray(buf)
    b[at] ^= 0x20
    return bytes(b)


@pytest.mark.parametrize("where", ["first byte", "middle", "last byte", "tag", "aad", "nonce"])
def test_a_flipped_bit_anywhere_fails_authentication(through_libcrypto: Gcm, where: str) -> None:
    data = os.urandom(LARGE + 100)
    sealed, aad, nonce = AESGCM(KEY).encrypt(NONCE, data, b"aad"), b"aad", NONCE
    if where == "first byte":
        sealed = _flip(sealed, 0)
    elif where == "middle":
        sealed = _flip(sealed, len(data) // 2)
    elif where == "last byte":
        sealed = _flip(sealed, len(data) - 1)
    elif where == "tag":
        sealed = _flip(sealed, len(sealed) - 1)
    elif where == "aad":
        aad = _flip(aad, 1)
    else:
        nonce = _flip(nonce, 11)
    with pytest.raises(InvalidTag):
        through_libcrypto.decrypt_into(nonce, sealed, aad, bytearray(len(data)))


def test_another_key_fails_authentication(through_libcrypto: Gcm) -> None:
    sealed = AESGCM(bytes(32)).encrypt(NONCE, bytes(LARGE), None)
    with pytest.raises(InvalidTag):
        through_libcrypto.decrypt_into(NONCE, sealed, None, bytearray(LARGE))


def test_bad_arguments_name_the_problem(through_libcrypto: Gcm) -> None:
    sealed = AESGCM(KEY).encrypt(NONCE, bytes(LARGE), None)
    with pytest.raises(ValueError, match="buffer of 65535 bytes for 65536 bytes of plaintext"):
        through_libcrypto.decrypt_into(NONCE, sealed, None, bytearray(LARGE - 1))
    with pytest.raises(ValueError, match="nonce of 8 bytes"):
        through_libcrypto.decrypt_into(NONCE[:8], sealed, None, bytearray(LARGE))
    with pytest.raises(TypeError, match="read-only"):
        through_libcrypto.decrypt_into(NONCE, sealed, None, bytes(LARGE))
    with pytest.raises(ValueError):
        Gcm(bytes(31))


def test_threads_open_with_contexts_of_their_own() -> None:
    keys = [os.urandom(32) for _ in range(3)]
    gcms = [Gcm(k) for k in keys]  # shared by every thread
    messages = [os.urandom(LARGE + 4096 * i) for i in range(3)]
    sealed = [[AESGCM(k).encrypt(NONCE, m, None) for m in messages] for k in keys]
    wrong: list[tuple[int, int]] = []

    def run(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            k, m = (int(x) for x in rng.integers(0, 3, 2))
            out = bytearray(len(messages[m]))
            gcms[k].decrypt_into(NONCE, sealed[k][m], None, out)
            if out != messages[m]:
                wrong.append((k, m))

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_without_libcrypto_every_message_goes_through_aesgcm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcm, "_lib", None)
    monkeypatch.setattr(gcm, "_opened", True)
    data = os.urandom(LARGE * 2)
    sealed = AESGCM(KEY).encrypt(NONCE, data, None)
    out = bytearray(len(data))
    Gcm(KEY).decrypt_into(NONCE, sealed, None, out)
    assert out == data
    g = Gcm(KEY)
    g._aead = _Refuses()  # type: ignore[assignment]
    with pytest.raises(AssertionError, match="AESGCM"):
        g.decrypt_into(NONCE, sealed, None, out)


def test_the_environment_keeps_every_message_on_aesgcm() -> None:
    code = "from radixcache.offload.storage.crypt import gcm; print(gcm.libcrypto())"
    env = dict(os.environ, RADIXCACHE_GCM="cryptography")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    env.pop("RADIXCACHE_GCM")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (off.returncode, off.stdout.strip()) == (0, "None"), off.stderr
    assert on.returncode == 0 and "_Lib" in on.stdout, on.stderr


def test_a_library_that_does_not_open_the_test_message_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert gcm._open() is not None
    opens = gcm._Ctx.open

    def never_refuses(self: gcm._Ctx, *args: Any) -> bool:
        opens(self, *args)
        return True  # decrypts, but accepts a flipped message

    monkeypatch.setattr(gcm._Ctx, "open", never_refuses)
    assert gcm._open() is None
    monkeypatch.setattr(gcm._Ctx, "open", lambda self, *args: True)  # writes nothing
    assert gcm._open() is None


def test_no_key_in_repr_and_no_pickle() -> None:
    g = Gcm(KEY)
    assert KEY.hex() not in repr(g) and "Gcm" in repr(g)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(g)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 3 * LARGE),
    aad=st.binary(max_size=64),
    key=st.binary(min_size=32, max_size=32),
    flip=st.integers(0, 1 << 30),
)
def test_fuzz_round_trip_and_any_flip_refused(size: int, aad: bytes, key: bytes, flip: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    sealed = AESGCM(key).encrypt(NONCE, data, aad)
    out = bytearray(size)
    Gcm(key).decrypt_into(NONCE, sealed, aad, out)
    assert out == data
    with pytest.raises(InvalidTag):
        Gcm(key).decrypt_into(NONCE, _flip(sealed, flip % len(sealed)), aad, out)

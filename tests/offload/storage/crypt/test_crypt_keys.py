"""Master keys: the key text formats, where keys come from, what is derived,
and that no key ever shows in a message, a repr or a pickle."""

from __future__ import annotations

import base64
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from radixcache.offload.storage.crypt import NO_KEYS, KeyLoadError, KeySource, open_codec
from radixcache.offload.storage.crypt.keys import (
    KeyRing,
    load_key_env,
    load_key_file,
    parse_keys,
    tenant_label,
)
from radixcache.offload import ModelFingerprint
from tests.offload.conftest import SPEC

K1 = bytes(range(32))
K2 = bytes(range(100, 132))
FINGERPRINT = ModelFingerprint("tiny-model", SPEC.describe(), 0)


def write_key_file(path: Path, *keys: bytes) -> str:
    path.write_text("# storage keys: the first writes\n" + "".join(k.hex() + "\n" for k in keys))
    path.chmod(0o600)
    return str(path)


def test_keys_parse_as_hex_or_base64_one_per_line_the_first_current() -> None:
    text = "\n".join([
        "# comment",
        K1.hex(),
        "",
        base64.b64encode(K2).decode(),
        base64.urlsafe_b64encode(bytes(range(200, 232))).decode().rstrip("="),
    ])
    assert parse_keys(text, "test") == [K1, K2, bytes(range(200, 232))]
    assert parse_keys(f"{K1.hex()}, {K2.hex()}", "env") == [K1, K2]  # a variable: commas too


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("ab" * 31, "key 1 has 62 hex digits; a key is 64"),
        ("k!" * 32, "key 1 is neither hex nor base64"),
        (base64.b64encode(b"x" * 16).decode(), "key 1 decodes to 16 bytes; a key is 32"),
        (K1.hex() + "\n" + K1.hex(), "a key is listed twice"),
        ("\n".join(bytes([i]).hex() * 32 for i in range(1, 18)), "17 keys; at most 16"),
    ],
)
def test_bad_key_text_is_refused_naming_the_entry_never_its_text(text: str, message: str) -> None:
    with pytest.raises(KeyLoadError, match=message) as err:
        KeyRing(parse_keys(text, "key file 'k'"), "key file 'k'")
    for word in text.split():
        if len(word) > 8:
            assert word not in str(err.value)


def test_a_key_file_is_read_and_a_loose_mode_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_key_file(tmp_path / "rx.key", K2, K1)
    with caplog.at_level(logging.DEBUG):
        ring = load_key_file(path)
    assert not caplog.records  # chmod 600: nothing to say
    assert len(ring.key_ids) == 2 and ring.current_id == ring.key_ids[0]
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        load_key_file(path)
    assert "can be read by other users (mode 644)" in caplog.text
    assert K1.hex() not in caplog.text and K2.hex() not in caplog.text


def test_missing_unreadable_or_binary_key_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyLoadError, match="cannot be read"):
        load_key_file(str(tmp_path / "missing.key"))
    binary = tmp_path / "binary.key"
    binary.write_bytes(b"\xff\xfe" + K1)
    with pytest.raises(KeyLoadError, match="is not text") as err:
        load_key_file(str(binary))
    assert K1.hex() not in str(err.value)


def test_keys_from_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RX_TEST_KEYS", f"{K1.hex()} {K2.hex()}")
    ring = load_key_env("RX_TEST_KEYS")
    assert len(ring.key_ids) == 2
    assert "environment variable RX_TEST_KEYS" in repr(ring)
    monkeypatch.delenv("RX_TEST_KEYS")
    with pytest.raises(KeyLoadError, match="RX_TEST_KEYS is not set"):
        load_key_env("RX_TEST_KEYS")


def test_a_ring_shows_key_ids_only_and_cannot_be_pickled() -> None:
    ring = KeyRing([K1, K2], "test keys")
    shown = repr(ring) + ring.describe() + str(ring)
    for key in (K1, K2):
        assert key.hex() not in shown and key.hex()[:16] not in shown
        assert base64.b64encode(key).decode()[:16] not in shown
    assert ring.current_id.hex() in shown
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(ring)


def test_derived_keys_differ_per_master_key_and_tenant() -> None:
    ring = KeyRing([K1, K2])
    a, b = ring.key_ids
    assert a != b and len(a) == 8
    assert ring.tenant_aead(a, None) is ring.tenant_aead(a, None)  # derived once
    def seal(aead: Any) -> bytes:
        out = bytearray(32)
        aead.encrypt_into(b"\0" * 12, b"x" * 16, None, out)
        return bytes(out)

    outs = {
        seal(ring.tenant_aead(kid, tenant))
        for kid in (a, b)
        for tenant in (None, b"sS\0\0\0\x01a", b"sB\0\0\0\x01a")
    }
    outs |= {seal(ring.meta_aead(kid)) for kid in (a, b)}
    assert len(outs) == 8  # every key distinct
    assert ring.tenant_aead(b"unknown!", None) is None and ring.meta_aead(b"unknown!") is None
    assert tenant_label(None) != tenant_label(b"") != tenant_label(b"kv/default")


def test_key_source_takes_one_source_and_no_keys_means_clear_records(tmp_path: Path) -> None:
    assert not NO_KEYS.enabled
    assert open_codec(NO_KEYS, FINGERPRINT).sealed is False
    with pytest.raises(ValueError, match="not both"):
        KeySource(key_file="a", key_env="B")
    with pytest.raises(ValueError, match="key_file must be a non-empty str"):
        KeySource(key_file="")
    codec = open_codec(KeySource(key_file=write_key_file(tmp_path / "k", K1)), FINGERPRINT)
    assert codec.sealed and K1.hex() not in repr(codec) + codec.describe()
    with pytest.raises(KeyLoadError, match="RX_NONE_SET is not set"):
        open_codec(KeySource(key_env="RX_NONE_SET"), FINGERPRINT)

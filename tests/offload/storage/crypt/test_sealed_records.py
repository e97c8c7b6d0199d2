"""Sealed records, codec by codec: round trips, every field tampered with,
the wrong key, another tenant, another model, rotation, and random
mutations (never wrong KV, never an exception but ``Unreadable``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.offload import ModelFingerprint
from radixcache.offload.storage import record
from radixcache.offload.storage.crypt import PLAIN, Framing, Unreadable
from radixcache.offload.storage.crypt.keys import KeyRing
from radixcache.offload.storage.crypt.sealed import SEAL_BYTES, SealedRecords
from radixcache.offload.storage.record import HEADER
from tests.offload.conftest import SPEC

K1, K2 = bytes(range(32)), bytes(range(100, 132))
FP = ModelFingerprint("tiny-model", SPEC.describe(), 0)
KEY = FP.digest() + bytes(range(16))  # a record key: fingerprint digest + page key
TAG = record.namespace_tag(FP.digest(), b"ns")
INFO = b'["tenant-a",null,null,[]]'
P = SPEC.page_bytes
KV = np.random.default_rng(3).integers(0, 256, P, dtype=np.uint8)
TOKENS = np.array([11, 12, 13, 14], dtype=np.int32)
ALICE = b"sS\0\0\0\x05alice"

CODEC = SealedRecords(KeyRing([K1]), FP)


def seal(framing: Framing, tokens: npt.NDArray[np.int32] | None = TOKENS, **over: Any) -> bytes:
    fields: dict[str, Any] = dict(
        key=KEY, ns_tag=TAG, tokens=tokens, kv=KV, seq=7, block_id=5, parent_block_id=4,
        depth=2, info=INFO,
    )
    fields.update(over)
    t = 0 if tokens is None else tokens.size
    out = bytearray(framing.record_size(len(fields["key"]), len(fields["info"]), t, P))
    framing.encode_into(out, **fields)
    return bytes(out)


def read(framing: Framing, value: bytes, tokens: npt.NDArray[np.int32] | None = TOKENS) -> bool:
    """``read_into`` a fresh page; True only with the page's exact KV bytes."""
    dst = np.zeros(P, dtype=np.uint8)
    ok = framing.read_into(value, key=KEY, ns_tag=TAG, tokens=tokens, dst=dst)
    assert not ok or np.array_equal(dst, KV), "a record read True with other KV bytes"
    return ok


def read_parts(framing: Framing, value: bytes, tokens: npt.NDArray[np.int32] | None = TOKENS) -> bool:
    """``verify_parts`` as a pool reader gets the record: its last P bytes in the page."""
    if len(value) < P:
        return False
    page = np.frombuffer(value[len(value) - P :], dtype=np.uint8).copy()
    ok = framing.verify_parts(value[: len(value) - P], page, key=KEY, ns_tag=TAG, tokens=tokens)
    assert not ok or np.array_equal(page, KV), "a record verified True with other KV bytes"
    return ok


def outcome(framing: Framing, value: bytes, parts: bool = False) -> str:
    try:
        return "read" if (read_parts if parts else read)(framing, value) else "corrupt"
    except Unreadable:
        return "unreadable"


def test_round_trip_whole_and_in_parts_for_token_and_raw_pages() -> None:
    alice = CODEC.framing(ALICE)
    for tokens in (TOKENS, None):
        value = seal(alice, tokens)
        assert len(value) == record.record_size(len(KEY), len(INFO), 0 if tokens is None else 4, P) + SEAL_BYTES
        assert read(alice, value, tokens) and read_parts(alice, value, tokens)
        head, body = alice.encode_parts(key=KEY, ns_tag=TAG, tokens=tokens, kv=KV, seq=7, info=INFO)
        assert len(head) + len(body) == len(value)
        assert read(alice, head + bytes(body), tokens) and read_parts(alice, head + bytes(body), tokens)


def test_nothing_of_the_prompt_or_the_kv_is_in_the_clear() -> None:
    value = seal(CODEC.framing(ALICE))
    assert TOKENS.astype("<i4").tobytes() not in value
    assert INFO not in value and b"tenant-a" not in value
    assert KV[:32].tobytes() not in value and KV[-32:].tobytes() not in value
    assert value[HEADER.size : HEADER.size + len(KEY)] == KEY  # the key stays in the clear
    assert seal(CODEC.framing(ALICE)) != value  # a fresh nonce each time


def test_survivors_read_the_info_and_tokens_without_the_tenant() -> None:
    value = seal(CODEC.framing(ALICE))
    meta = CODEC.read_meta(value)
    assert meta is not None
    assert (meta.key, meta.ns_tag, meta.info, meta.block_id, meta.parent_block_id) == (
        KEY, TAG, INFO, 5, 4)
    assert (meta.depth, meta.seq, meta.num_tokens, meta.kv_bytes, meta.raw) == (2, 7, 4, P, False)
    tokens = CODEC.read_tokens(value)
    assert tokens is not None and np.array_equal(tokens, TOKENS)
    assert record.read_seq(value) == 7 and record.read_namespace_tag(value) == TAG  # clear header
    other = SealedRecords(KeyRing([K2]), FP)
    assert other.read_meta(value) is None and other.read_tokens(value) is None
    assert PLAIN.read_meta(value) is None and PLAIN.read_tokens(value) is None
    assert CODEC.read_meta(value[:-1]) is None


_KEY_AT = HEADER.size + len(KEY)
_CLEAR_AT = _KEY_AT + 20
_META_END = _CLEAR_AT + len(INFO) + 16
_KV_AT = _META_END + 16

# byte offset -> what a flipped bit there must give ("unreadable": its tag
# fails; "corrupt": the clear checks fail first; both are misses)
FIELDS = {
    "magic": (0, "corrupt"),
    "version": (4, "unreadable"),  # 3 -> 2, a version still read: then its tag fails
    "unknown version": (4, "corrupt", 0x04),
    "raw flag": (6, "corrupt"),
    "sealed flag": (6, "unreadable", 0x02),
    "checksum field": (8, "unreadable"),
    "token count": (12, "corrupt"),
    "kv byte count": (16, "corrupt"),
    "write seq": (24, "unreadable"),
    "namespace tag": (32, "corrupt"),
    "block id": (48, "unreadable"),
    "parent block id": (56, "unreadable"),
    "depth": (64, "unreadable"),
    "key length": (68, "corrupt"),
    "info length": (70, "corrupt"),
    "key": (HEADER.size + 3, "corrupt"),
    "key id": (_KEY_AT + 1, "unreadable"),
    "nonce": (_KEY_AT + 8 + 5, "unreadable"),
    "info ciphertext": (_CLEAR_AT + 2, "unreadable"),
    "token ciphertext": (_CLEAR_AT + len(INFO) + 3, "unreadable"),
    "meta tag": (_META_END + 7, "unreadable"),
    "first kv byte": (_KV_AT, "unreadable"),
    "middle kv byte": (_KV_AT + P // 2, "unreadable"),
    "last kv byte": (_KV_AT + P - 1, "unreadable"),
    "kv tag": (-3, "unreadable"),
}


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("parts", [False, True], ids=["whole", "parts"])
def test_every_field_tampered_with_is_a_miss(field: str, parts: bool) -> None:
    at, expect, *bit = FIELDS[field]
    value = bytearray(seal(CODEC.framing(ALICE)))
    value[at] ^= bit[0] if bit else 0x01
    assert outcome(CODEC.framing(ALICE), bytes(value), parts) == expect


@pytest.mark.parametrize("parts", [False, True], ids=["whole", "parts"])
def test_truncated_padded_or_spliced_records_are_misses(parts: bool) -> None:
    alice = CODEC.framing(ALICE)
    value = seal(alice)
    assert outcome(alice, value[:-1], parts) == "corrupt"
    assert outcome(alice, value + b"\0", parts) == "corrupt"
    assert outcome(alice, value[:100], parts) == "corrupt"
    other = seal(alice)  # the same page sealed again: another nonce
    spliced = value[:_KV_AT] + other[_KV_AT:]  # its KV message under this head
    assert outcome(alice, spliced, parts) == "unreadable"


def test_the_wrong_key_another_tenant_or_another_model_cannot_read() -> None:
    value = seal(CODEC.framing(ALICE))
    assert outcome(SealedRecords(KeyRing([K2]), FP).framing(ALICE), value) == "unreadable"
    assert outcome(CODEC.framing(b"sS\0\0\0\x03bob"), value) == "unreadable"
    assert outcome(CODEC.framing(None), value) == "unreadable"  # the default tenant
    assert outcome(CODEC.framing(b"sB\0\0\0\x05alice"), value) == "unreadable"  # bytes salt
    other_model = ModelFingerprint("other-model", SPEC.describe(), 0)
    assert outcome(SealedRecords(KeyRing([K1]), other_model).framing(ALICE), value) == "unreadable"


def test_another_tenants_record_rewritten_under_this_key_and_namespace() -> None:
    """A record of bob's copied over alice's page, its clear header rewritten
    to pass every clear check: its tags fail."""
    bob_key = FP.digest() + bytes(range(50, 66))
    bob = seal(CODEC.framing(b"sS\0\0\0\x03bob"), key=bob_key,
               ns_tag=record.namespace_tag(FP.digest(), b"bob-ns"))
    forged = bytearray(bob)
    forged[32:48] = TAG
    forged[HEADER.size : HEADER.size + len(KEY)] = KEY
    assert outcome(CODEC.framing(ALICE), bytes(forged)) == "unreadable"
    assert outcome(CODEC.framing(ALICE), bytes(forged), parts=True) == "unreadable"


def test_rotation_reads_old_keys_writes_the_new_one_and_forgets_removed_ones() -> None:
    old = seal(SealedRecords(KeyRing([K1]), FP).framing(ALICE))
    rotated = SealedRecords(KeyRing([K2, K1]), FP)
    assert outcome(rotated.framing(ALICE), old) == "read"
    new = seal(rotated.framing(ALICE))
    new_id = KeyRing([K2]).current_id
    assert new[_KEY_AT : _KEY_AT + 8] == new_id != old[_KEY_AT : _KEY_AT + 8]
    only_new = SealedRecords(KeyRing([K2]), FP)
    assert outcome(only_new.framing(ALICE), new) == "read"
    assert outcome(only_new.framing(ALICE), old) == "unreadable"


def test_clear_and_sealed_records_never_read_as_each_other() -> None:
    sealed = seal(CODEC.framing(ALICE))
    clear = seal(PLAIN)
    for parts in (False, True):
        assert outcome(PLAIN, sealed, parts) == "unreadable"
        assert outcome(CODEC.framing(ALICE), clear, parts) == "unreadable"
        assert outcome(PLAIN, clear, parts) == "read"
    with pytest.raises(RuntimeError, match="use encode_parts"):
        from radixcache.offload.storage.jobs import PutJob
        from radixcache.transfer.host import HostKVBuffer
        from radixcache.transfer.ticket import FutureTicket

        host = HostKVBuffer(SPEC, 1)
        job = PutJob([KEY], TOKENS.reshape(1, 4), host, np.zeros(1, np.int32), TAG,
                     FutureTicket(), framing=CODEC.framing(ALICE))
        job.encode_head(0, 1, host.as_bytes()[0])


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=0, max_size=4
    ),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
    extra=st.binary(max_size=3),
    parts=st.booleans(),
    tenant=st.sampled_from([ALICE, None]),
)
def test_random_mutations_never_give_wrong_kv_or_raise(
    edits: list[tuple[int, int]], cut: int | None, extra: bytes, parts: bool,
    tenant: bytes | None,
) -> None:
    framing = CODEC.framing(tenant)
    original = seal(framing)
    value = bytearray(original)
    for at, x in edits:
        value[at % len(value)] ^= x
    if cut is not None:
        del value[cut % len(value) :]
    value += extra
    got = outcome(CODEC.framing(ALICE), bytes(value), parts)  # read() checks the KV when "read"
    if got == "read":
        assert tenant == ALICE and bytes(value) == original


def test_a_body_still_held_is_never_reused_and_a_dropped_one_is() -> None:
    alice = CODEC.framing(ALICE)
    fields = dict(key=KEY, ns_tag=TAG, tokens=TOKENS, kv=KV, seq=7, info=INFO)
    head1, body1 = alice.encode_parts(**fields)
    first = head1 + bytes(body1)
    head2, body2 = alice.encode_parts(**fields)  # body1 is still held: another buffer
    assert isinstance(body1, memoryview) and isinstance(body2, memoryview)
    assert body1.obj is not body2.obj
    assert head1 + bytes(body1) == first and read(alice, first) and read(alice, head2 + bytes(body2))
    held = id(body2.obj)
    del body2
    _head3, body3 = alice.encode_parts(**fields)
    assert isinstance(body3, memoryview) and id(body3.obj) == held  # recycled once dropped

"""The msgpack codec: round trips, the exact maps, and strict decoding."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from tests.events.events_testkit import BS, stored
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.events import (
    AllBlocksCleared,
    BatchEncoder,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    KvEvent,
    check_events,
    decode_batch,
    encode_batch,
)
from radixcache.events.codec import decode_typed
from radixcache.events.map_decoder import decode_maps
from tests.events import peer_structs

TOP = (1 << 63) - 1  # the largest legal hash


def good_stored_map(**changes: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [1, 2],
        "token_ids": list(range(2 * BS)),
        "block_size": BS,
        "medium": "GPU",
    }
    m.update(changes)
    return {k: v for k, v in m.items() if v is not _DROP}


_DROP = object()


def payload(*events: Any, ts: Any = 1.5, dp_rank: Any = None) -> bytes:
    data: bytes = msgpack.packb([ts, list(events), dp_rank])
    return data


def test_round_trip_keeps_every_field() -> None:
    events: list[KvEvent] = [
        AllBlocksCleared(),
        stored([0, TOP], list(range(2 * BS)), parent=7, lora_id=3, lora_name="adapter-a"),
        stored([5], [9, 8, 7, 6], medium="DISK"),
        BlockRemoved([0, TOP], "CPU_PINNED"),
    ]
    batch = EventBatch(1234.5, events, dp_rank=2)
    decoded = decode_batch(encode_batch(batch))
    assert decoded == batch


def test_encoder_is_reusable_and_deterministic() -> None:
    encoder = BatchEncoder()
    events = [stored([1, 2], list(range(2 * BS)))]
    first = encoder.encode(events, 10.0, 0)
    assert encoder.encode(events, 10.0, 0) == first
    assert encoder.encode([BlockRemoved([1], "GPU")], 10.0, 0) != first
    assert decode_batch(first).events == events


def test_maps_hold_exact_keys_in_wire_order() -> None:
    full = stored([1, 2], list(range(2 * BS)), parent=9, medium="CPU_PINNED", lora_id=4, lora_name="x")
    bare = stored([3], [1, 2, 3, 4])
    raw = msgpack.unpackb(encode_batch(EventBatch(1.0, [full, bare, BlockRemoved([3], None), AllBlocksCleared()])))
    assert list(raw[1][0]) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    ]
    # Every key without a default in vLLM's and SGLang's decoders is written, nil included.
    assert raw[1][1] == {
        "type": "BlockStored", "block_hashes": [3], "parent_block_hash": None, "token_ids": [1, 2, 3, 4],
        "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None,
    }
    assert raw[1][2] == {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}
    assert raw[1][3] == {"type": "AllBlocksCleared"}


def test_salted_events_carry_cache_salt_and_per_block_extra_keys() -> None:
    salted = BlockStored([1, 2], None, list(range(2 * BS)), BS, None, "DISK", None, "tenant-a",
                         [("tenant-a", b"img"), ("tenant-a", b"img")])
    raw = msgpack.unpackb(encode_batch(EventBatch(1.0, [salted])))
    assert list(raw[1][0])[-2:] == ["cache_salt", "extra_keys"]
    assert raw[1][0]["cache_salt"] == "tenant-a"
    assert raw[1][0]["extra_keys"] == [["tenant-a", b"img"], ["tenant-a", b"img"]]
    assert decode_batch(encode_batch(EventBatch(1.0, [salted]))).events == [salted]
    with pytest.raises(ValueError, match="one entry per block"):
        check_events([BlockStored([1, 2], None, list(range(2 * BS)), BS, extra_keys=[None])])


def test_vllm_medium_vocabulary_round_trips() -> None:
    events: list[KvEvent] = [stored([1], [1, 2, 3, 4], medium=m) for m in ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")]
    raw = msgpack.unpackb(BatchEncoder("vllm").encode(events, 1.0))
    assert [e["medium"] for e in raw[1]] == ["GPU", "CPU", "STORAGE", "EXTERNAL"]
    assert decode_batch(BatchEncoder("vllm").encode(events, 1.0)).events == events
    with pytest.raises(ValueError, match="vocabulary"):
        BatchEncoder("trtllm")


def test_hash_limits_fit_u64_and_i64_readers() -> None:
    data = encode_batch(EventBatch(1.0, [BlockRemoved([0, TOP], "GPU")]))
    # The largest hash is packed as uint64 0xcf followed by 0x7f..: a signed
    # 64-bit reader sees the same positive number.
    assert b"\xcf\x7f\xff\xff\xff\xff\xff\xff\xff" in data
    assert decode_batch(data).events == [BlockRemoved([0, TOP], "GPU")]


@pytest.mark.parametrize(
    ("event", "needle"),
    [
        (stored([-1], [1, 2, 3, 4]), "[0, 2**63)"),
        (stored([1 << 63], [1, 2, 3, 4]), "[0, 2**63)"),
        (stored([1.0], [1, 2, 3, 4]), "[0, 2**63)"),  # type: ignore[list-item]
        (stored([], []), "empty"),
        (stored([1], [1, 2, 3]), "expected 1 blocks"),
        (stored([1], [1, 2, 3, 4.5]), "only ints"),  # type: ignore[list-item]
        (stored([1], [1, 2, 3, "4"]), "only ints"),  # type: ignore[list-item]
        (stored([1], [1, 2, 3, 4], parent=-3), "parent_block_hash"),
        (stored([1], [1, 2, 3, 4], medium="HBM"), "medium"),  # type: ignore[arg-type]
        (stored([1], [1, 2, 3, 4], lora_id="a"), "lora_id"),  # type: ignore[arg-type]
        (BlockRemoved([1 << 64], "GPU"), "[0, 2**63)"),
        (BlockStored((1,), None, bytearray(4), BS), "token_ids must be a list"),  # type: ignore[arg-type]
        ("BlockStored", "not an event record"),
    ],
)
def test_check_events_names_the_problem(event: Any, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        check_events([stored([1], [1, 2, 3, 4]), event])
    assert "event 1" in str(err.value)
    assert needle in str(err.value)


def test_good_payload_decodes() -> None:
    batch = decode_batch(payload(good_stored_map(parent_block_hash=3, lora_id=1), dp_rank=5))
    assert batch.dp_rank == 5 and batch.ts == 1.5
    assert batch.events == [BlockStored([1, 2], 3, list(range(2 * BS)), BS, 1, "GPU", None)]


def test_unknown_keys_are_ignored() -> None:
    event = decode_batch(payload(good_stored_map(group_idx=3, locality="LOCAL"))).events[0]
    assert event == BlockStored([1, 2], None, list(range(2 * BS)), BS, None, "GPU", None)


BAD_PAYLOADS: list[tuple[str, bytes, str]] = [
    ("not msgpack", b"\xc1", "not one msgpack object"),
    ("truncated", payload(good_stored_map())[:-3], "not one msgpack object"),
    ("trailing bytes", payload(good_stored_map()) + b"\x00", "not one msgpack object"),
    ("a map", msgpack.packb({"ts": 1}), "array of 3"),
    ("array of 2", msgpack.packb([1.0, []]), "array of 2"),
    ("array of 4", msgpack.packb([1.0, [], None, 0]), "array of 4"),
    ("ts a string", payload(good_stored_map(), ts="now"), "ts must be a number"),
    ("dp_rank a float", payload(good_stored_map(), dp_rank=1.0), "dp_rank"),
    ("events a map", msgpack.packb([1.0, {"a": 1}, None]), "events must be an array"),
    ("empty batch", payload(), "zero events"),
    ("event an array", payload(["BlockStored", [1]]), "must be a map"),
    ("no type", payload({"block_hashes": [1], "medium": "GPU"}), "'type' key"),
    ("key not a string", payload({"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", 7: 1}), "strings"),
    ("unknown type", payload({"type": "BlockMoved"}), "unknown event type 'BlockMoved'"),
    ("no hashes", payload(good_stored_map(block_hashes=_DROP)), "lacks required key 'block_hashes'"),
    ("no tokens", payload(good_stored_map(token_ids=_DROP)), "lacks required key 'token_ids'"),
    ("no block size", payload(good_stored_map(block_size=_DROP)), "lacks required key 'block_size'"),
    ("no medium", payload(good_stored_map(medium=_DROP)), "lacks required key 'medium'"),
    ("removal without medium", payload({"type": "BlockRemoved", "block_hashes": [1]}), "'medium'"),
    ("hash negative", payload(good_stored_map(block_hashes=[1, -2])), "[0, 2**63)"),
    ("hash too big", payload(good_stored_map(block_hashes=[1, 1 << 63])), "[0, 2**63)"),
    ("hash a string", payload(good_stored_map(block_hashes=[1, "2"])), "[0, 2**63)"),
    ("hash a bool", payload(good_stored_map(block_hashes=[1, True])), "[0, 2**63)"),
    ("hash a float", payload({"type": "BlockRemoved", "block_hashes": [1.0], "medium": "GPU"}), "[0, 2**63)"),
    ("hashes not a list", payload(good_stored_map(block_hashes=5)), "must be a list"),
    ("token count", payload(good_stored_map(token_ids=[1, 2, 3])), "expected 2 blocks"),
    ("token a float", payload(good_stored_map(token_ids=[0.5] * (2 * BS))), "only ints"),
    ("token nil", payload(good_stored_map(token_ids=[None] * (2 * BS))), "only ints"),
    ("token a bool", payload(good_stored_map(token_ids=[True] + [5] * (2 * BS - 1))), "only ints"),
    ("tokens a map", payload(good_stored_map(token_ids={"a": 1})), "token_ids must be a list"),
    ("block size zero", payload(good_stored_map(block_size=0)), "block_size"),
    ("medium unknown", payload(good_stored_map(medium="HBM")), "medium 'HBM'"),
    ("medium a list", payload(good_stored_map(medium=["GPU"])), "medium"),
    ("parent a string", payload(good_stored_map(parent_block_hash="p")), "parent_block_hash"),
    ("lora_id a string", payload(good_stored_map(lora_id="1")), "lora_id"),
    ("lora_name an int", payload(good_stored_map(lora_name=1)), "lora_name"),
    ("cache_salt an int", payload(good_stored_map(cache_salt=1)), "cache_salt"),
    ("extra keys per block", payload(good_stored_map(extra_keys=[None])), "one entry per block"),
    ("extra key a string", payload(good_stored_map(extra_keys=["a", None])), "tuples or None"),
]


@pytest.mark.parametrize(("case", "data", "needle"), BAD_PAYLOADS, ids=[c[0] for c in BAD_PAYLOADS])
def test_decode_rejects_with_a_specific_error(case: str, data: bytes, needle: str) -> None:
    with pytest.raises(DecodeError) as err:
        decode_batch(data)
    assert needle in str(err.value), f"{case}: {err.value}"
    assert isinstance(err.value, ValueError)


def test_decode_error_names_the_event_position() -> None:
    bad = payload({"type": "AllBlocksCleared"}, good_stored_map(block_hashes=[-1]))
    with pytest.raises(DecodeError, match=r"^event 1: "):
        decode_batch(bad)


def test_type_key_is_found_anywhere_like_the_peers_decoders_do() -> None:
    """Producers write "type" first (ours does, see the wire-order test);
    vLLM's and SGLang's decoders find it anywhere in the map, and so do we."""
    late = payload({"block_hashes": [1], "medium": "GPU", "type": "BlockRemoved"})
    assert decode_batch(late).events == [BlockRemoved([1], "GPU")]
    assert peer_structs.VLLM.decode(late).events[0] == peer_structs.VllmBlockRemoved([1], "GPU")


def test_numpy_token_ids_encode_like_lists() -> None:
    tokens = np.arange(100_000, 100_000 + 2 * BS, dtype=np.int32)
    as_array = BlockStored([1, 2], None, tokens, BS, None, "GPU", None)  # type: ignore[arg-type]
    as_list = BlockStored([1, 2], None, tokens.tolist(), BS, None, "GPU", None)
    check_events([as_array])
    assert BatchEncoder().encode([as_array], 1.0) == BatchEncoder().encode([as_list], 1.0)
    assert decode_batch(BatchEncoder().encode([as_array], 1.0)).events == [as_list]
    for bad, needle in [(tokens.astype(np.float32), "integer dtype"), (tokens.reshape(2, BS), "1-D"),
                        (tokens[:3], "expected 2 blocks")]:
        with pytest.raises(ValueError, match=needle):
            check_events([BlockStored([1, 2], None, bad, BS)])  # type: ignore[arg-type]


# ---------------------------------------------------------------- both decoding passes agree

_NEAR: dict[str, list[Any]] = {  # per key: good values and near misses
    "block_hashes": [[1, 2], [1], [0, (1 << 63) - 1], [], [1, True], [1, -1], [1, 1 << 63], [1.0, 2], 5, None],
    "token_ids": [
        list(range(2 * BS)), [0] * 7, [True] + [1] * 7, [1.0] * 8, [None] * 8, [-3] * 8, [(1 << 64) - 1] * 8,
        {"a": 1}, None, "x",
    ],
    "block_size": [BS, 2, 8, 0, -1, True, 4.0, None, "4"],
    "medium": ["GPU", "CPU", "STORAGE", "CPU_PINNED", "EXTERNAL", "HBM", None, 1, ["GPU"]],
    "parent_block_hash": [None, 5, 0, -1, 1 << 63, True, "p", 2.0],
    "lora_id": [None, 1, -1, True, "1", 1.0],
    "lora_name": [None, "n", 1, b"n"],
    "cache_salt": [None, "s", 1],
    "extra_keys": [
        None, [None, None], [["a", 1], [b"x"]], [[[1], {"k": 2.5}], None], [None], ["a", None], [[1], 2], 5,
    ],
    "group_idx": [1, None, "x", [1]],
}


@st.composite
def wire_events(draw: st.DrawFn) -> dict[Any, Any]:
    """A map near a real event: a valid one with up to two keys dropped or
    given a value from their pool of good values and near misses; "type"
    maybe moved or gone, maybe a key that is not a string."""
    kind = draw(st.sampled_from(["BlockStored"] * 5 + ["BlockRemoved", "AllBlocksCleared", "Other"]))
    base: dict[Any, Any] = {"type": kind}
    if kind == "BlockStored":
        base.update(good_stored_map(parent_block_hash=5, lora_id=1, lora_name="n"))
    elif kind == "BlockRemoved":
        base.update(block_hashes=[1, 2], medium="DISK")
    for key in draw(st.lists(st.sampled_from(sorted(_NEAR)), max_size=2)):
        value = draw(st.sampled_from([_DROP, *_NEAR[key]]))
        if value is _DROP:
            base.pop(key, None)
        else:
            base[key] = value
    if draw(st.integers(0, 7)) == 0:  # "type" somewhere else, or gone
        t = base.pop("type")
        if draw(st.booleans()):
            base["type"] = t
    if draw(st.integers(0, 15)) == 0:
        base[draw(st.sampled_from([0, b"k"]))] = 1  # a key that is not a string
    return base


def _both_passes(data: bytes) -> tuple[EventBatch | None, EventBatch | None]:
    try:
        by_maps: EventBatch | None = decode_maps(data)
    except DecodeError:
        by_maps = None
    return decode_typed(data), by_maps


@settings(max_examples=500, deadline=None)
@given(
    events=st.lists(wire_events(), max_size=4),
    ts=st.sampled_from([1.5, 1.5, 1.5, 2, "t", True, None]),
    dp_rank=st.sampled_from([None, None, 0, 3, -1, 1.0, True]),
    extra=st.sampled_from([(), (), (), (0,)]),
)
def test_typed_and_map_decoding_accept_the_same_payloads(
    events: list[dict[Any, Any]], ts: Any, dp_rank: Any, extra: tuple[Any, ...]
) -> None:
    """The typed pass and the explaining map decoder agree: same payloads
    accepted, same records built (each event alone, then the whole batch)."""
    for event in events:
        typed, by_maps = _both_passes(msgpack.packb([1.5, [event], None], use_bin_type=True))
        assert typed == by_maps, event
    typed, by_maps = _both_passes(msgpack.packb([ts, events, dp_rank, *extra], use_bin_type=True))
    assert typed == by_maps


def test_typed_and_map_decoding_agree_on_every_single_near_miss() -> None:
    """Every key of a store and a removal, dropped or set to each value of
    its pool, one at a time: both passes give the same answer."""
    accepted = refused = 0
    for base in (good_stored_map(parent_block_hash=5), {"block_hashes": [1, 2], "medium": "DISK"}):
        kind = "BlockStored" if "token_ids" in base else "BlockRemoved"
        for key, pool in _NEAR.items():
            for value in [_DROP, *pool]:
                event = {"type": kind, **base, key: value}
                if value is _DROP:
                    del event[key]
                typed, by_maps = _both_passes(msgpack.packb([1.5, [event], None], use_bin_type=True))
                assert typed == by_maps, event
                accepted += typed is not None
                refused += typed is None
    assert accepted > 30 and refused > 30  # both answers are exercised

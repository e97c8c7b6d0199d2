"""A namespace is checked when it is built for everything later code does
with it: hashing, the event wire (our codec and vLLM's and SGLang's own
structs), a storage record.

Issue 21 (2) and (4): ``Namespace(salt="\\ud800")`` (what
``json.loads('"\\\\ud800"')`` returns, also through ``from_wire``), a
``lora_id`` of thousands of digits and ``lora_id=2**64`` used to be
accepted; ``digest()`` or the event encoder then failed later, inside a
commit (a device page owned twice) or on the publisher's thread (a whole
batch lost). Now they are refused at construction, naming the field, and
a fuzzer checks that whatever is accepted goes everywhere."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import Namespace
from radixcache.events import BatchEncoder, BlockStored, check_events, decode_batch
from radixcache.offload.storage.record import MAX_INFO_BYTES as RECORD_INFO_BYTES
from radixcache.recorder import EventRecorder
from tests.events.peer_structs import SGLANG, VLLM
from tests.radixcache.bigints import HUGE, unmark


class _Str(str):
    pass


class _Int(int):
    pass


REFUSED: list[tuple[dict[str, Any], type, str]] = [
    (dict(salt="\ud800"), ValueError, "salt"),
    (dict(salt="ok\udfffok"), ValueError, "salt.*index 2"),
    (dict(salt=json.loads('"\\ud800"')), ValueError, "salt"),
    (dict(salt=_Str("a")), TypeError, "salt"),
    (dict(salt=3), TypeError, "salt"),
    (dict(salt="x" * 5000), ValueError, "too large"),
    (dict(salt=b"\x00" * 3000), ValueError, "too large"),
    (dict(lora_id=2**63), ValueError, "lora_id"),
    (dict(lora_id=2**64), ValueError, "lora_id"),
    (dict(lora_id=HUGE), ValueError, "lora_id.*bits"),
    (dict(lora_id=-1), ValueError, "lora_id"),
    (dict(lora_id=True), TypeError, "lora_id"),
    (dict(lora_id=1.0), TypeError, "lora_id"),
    (dict(lora_id=np.int64(3)), TypeError, "lora_id"),
    (dict(lora_id=_Int(3)), TypeError, "lora_id"),
    (dict(lora_name="\ud83d"), ValueError, "lora_name"),
    (dict(lora_name=b"a"), TypeError, "lora_name"),
    (dict(extra_keys=[1]), TypeError, "extra_keys"),
    (dict(extra_keys=(2**63,)), ValueError, r"extra_keys\[0\]"),
    (dict(extra_keys=("a", -(2**63) - 1)), ValueError, r"extra_keys\[1\]"),
    (dict(extra_keys=(HUGE,)), ValueError, r"extra_keys\[0\].*bits"),
    (dict(extra_keys=(1.5,)), TypeError, r"extra_keys\[0\]"),
    (dict(extra_keys=(None,)), TypeError, r"extra_keys\[0\]"),
    (dict(extra_keys=((1, 2),)), TypeError, r"extra_keys\[0\]"),
    (dict(extra_keys=(False,)), TypeError, r"extra_keys\[0\]"),
    (dict(extra_keys=("\udc80",)), ValueError, r"extra_keys\[0\]"),
    (dict(extra_keys=tuple(range(10**15, 10**15 + 400))), ValueError, "too large"),
]


@pytest.mark.parametrize(("fields", "error", "names"), REFUSED, ids=[f"{i}-{next(iter(r[0]))}" for i, r in enumerate(REFUSED)])
def test_what_a_namespace_cannot_carry_is_refused_naming_the_field(
    fields: dict[str, Any], error: type, names: str
) -> None:
    with pytest.raises(error, match=names):
        Namespace(**{k: unmark(v) for k, v in fields.items()})


def test_from_wire_and_from_info_apply_the_same_rules() -> None:
    with pytest.raises(ValueError, match="salt"):
        Namespace.from_wire(cache_salt=json.loads('"\\ud800"'))
    with pytest.raises(ValueError, match="lora_id"):
        Namespace.from_wire(lora_id=2**64)
    with pytest.raises(TypeError, match="extra_keys"):
        Namespace.from_wire(extra_keys="abc")  # type: ignore[arg-type]
    for info in (
        b'["\\ud800",null,null,[]]',
        b"[null," + b"9" * 5000 + b",null,[]]",
        b"[null," + b"9" * 40 + b",null,[]]",
        b'[null,null,null,"abc"]',
        b"[" * 100_000,
        b"\xff\xfe",
        b'[{"b":"zz"},null,null,[]]',
    ):
        with pytest.raises(ValueError, match="namespace info"):
            Namespace.from_info(info)


def test_the_info_limit_is_the_records() -> None:
    from radixcache.namespace import MAX_INFO_BYTES

    assert MAX_INFO_BYTES == RECORD_INFO_BYTES


def test_the_largest_lora_id_and_extreme_keys_go_everywhere() -> None:
    for ns in (
        Namespace(lora_id=2**63 - 1, lora_name="adapter-\u00e9\U0001f600"),
        Namespace(salt=b"\x00\xff" * 100, extra_keys=(-(2**63), 2**63 - 1, b"", "")),
        Namespace(salt="\U0001f600" * 100),
    ):
        _goes_everywhere(ns)


def _goes_everywhere(ns: Namespace) -> None:
    """What later code does with an accepted namespace, checked."""
    assert len(ns.digest()) == 16 and ns.digest() == Namespace(*_fields(ns)).digest()
    hash(ns)
    info = ns.to_info()
    assert len(info) <= RECORD_INFO_BYTES
    assert Namespace.from_info(info) == ns
    if not isinstance(ns.salt, bytes):
        assert Namespace.from_wire(ns.lora_id, ns.lora_name, ns.salt, list(ns.extra_keys)) == ns
    rec = EventRecorder(_PageSize())
    rec.stored_ids([7, 8], 6, np.arange(8, dtype=np.int32), ns, "DISK")
    events = rec.take()
    check_events(events)
    for media in ("sglang", "vllm"):
        payload = BatchEncoder(media).encode(events, 1.5, None)
        ours = decode_batch(payload).events[0]
        assert isinstance(ours, BlockStored)
        assert (ours.lora_id, ours.lora_name, ours.cache_salt) == (ns.lora_id, ns.lora_name, ns.wire_salt())
        extra = ns.event_extra()
        assert ours.extra_keys == (None if extra is None else [extra, extra])
        peer_v = VLLM.decode(payload).events[0]
        assert (peer_v.lora_id, peer_v.lora_name) == (ns.lora_id, ns.lora_name)
        assert peer_v.extra_keys == (None if extra is None else [extra, extra])
        peer_s = SGLANG.decode(payload).events[0]
        assert (peer_s.lora_id, peer_s.cache_salt) == (ns.lora_id, ns.wire_salt())


def _fields(ns: Namespace) -> tuple[Any, ...]:
    return (ns.salt, ns.lora_id, ns.lora_name, ns.extra_keys)


class _PageSize:
    page_size = 4


# ----------------------------------------------------------------- the fuzzer

_any_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.integers(0, 0x10FFFF), max_size=12).map(lambda cps: "".join(map(chr, cps))),  # surrogates too
    st.text(max_size=1).map(lambda c: c * 2000),
)
_any_int = st.one_of(
    st.integers(-(2**65), 2**65),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, HUGE]),
)
_anything = st.one_of(
    _any_text, st.binary(max_size=40), _any_int, st.none(), st.booleans(), st.floats(allow_nan=False),
    st.tuples(st.integers()), st.builds(np.int64, st.integers(-5, 5)),
)
_extra = st.one_of(
    st.lists(_anything, max_size=5).map(tuple),
    st.lists(st.one_of(_any_text, st.binary(max_size=40), _any_int), max_size=5).map(tuple),
    st.lists(st.integers(), max_size=3),  # a list: refused
)


@settings(max_examples=400, deadline=None, database=None)
@given(
    salt=st.one_of(st.none(), _any_text, st.binary(max_size=3000), _anything),
    lora_id=st.one_of(st.none(), _any_int, _anything),
    lora_name=st.one_of(st.none(), _any_text, _anything),
    extra_keys=_extra,
)
def test_any_namespace_is_refused_at_once_or_goes_everywhere(
    salt: Any, lora_id: Any, lora_name: Any, extra_keys: Any
) -> None:
    fields = [unmark(f) for f in (salt, lora_id, lora_name, extra_keys)]
    try:
        ns = Namespace(*fields)
    except (TypeError, ValueError) as exc:
        assert any(f in str(exc) for f in ("salt", "lora_id", "lora_name", "extra_keys", "too large")), exc
        return
    _goes_everywhere(ns)


def test_a_namespace_pickled_in_another_process_hashes_as_this_process_does() -> None:
    """The identity's hash is taken once per process (str hashes are salted
    per process): one unpickled from a spawned engine finds its equal."""
    code = ("import base64, pickle; from radixcache import Namespace; "
            "print(base64.b64encode(pickle.dumps(Namespace('tenant-a', 7, 'adapter', ('img', 3), "
            "tags=('model:v3',)))).decode())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    theirs = pickle.loads(base64.b64decode(out.stdout))
    mine = Namespace("tenant-a", 7, "adapter", ("img", 3))
    assert theirs == mine and hash(theirs) == hash(mine) and {mine: 1}.get(theirs) == 1
    assert theirs.tags == ("model:v3",)  # carried, though not part of the identity

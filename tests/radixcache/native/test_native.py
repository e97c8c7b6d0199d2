"""The compiled core (radixcache/native) against the pure-Python modules it
stands in for: which one runs, each loop on random inputs, and whole random
workloads through the public API value for value."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import native
from radixcache.keys.hashing import _TABLES, block_id_of_sequence, vector_block_ids
from radixcache import RadixTree, make_eviction_policy
from radixcache.keys.event_ids import (
    EventIds, chain_start_reference, last_id_reference, node_ids_reference, run_ids_reference,
)
from radixcache.namespace import DEFAULT_NAMESPACE
from radixcache.request import Request, append_pages_reference
from radixcache.tree import node as node_module
from radixcache.tree import radix_tree
from radixcache.tree.node import EMPTY_PAGES, Node

ROOT = Path(__file__).resolve().parents[3]
NATIVE_DIR = ROOT / "radixcache" / "native"
BUILT = sorted(p.name for p in NATIVE_DIR.glob("_core*") if p.suffix in (".so", ".pyd"))


def _core() -> ModuleType:
    if not BUILT:
        pytest.skip("the compiled core is not built here (pip install -e . builds it with a C compiler)")
    return importlib.import_module("radixcache.native._core")


def test_the_compiled_core_is_in_use_when_it_is_built() -> None:
    """A built extension that fails to load must not pass for compiled: the
    process runs it unless RADIXCACHE_PURE says otherwise."""
    pure = native._flag(native.PURE_ENV)
    if native._flag(native.REQUIRE_ENV):
        assert native.COMPILED, native.REASON
    if BUILT and not pure:
        assert native.COMPILED, f"{BUILT} is built but not in use: {native.REASON}"
        assert node_module.Node is native.compiled.Node  # type: ignore[union-attr]
    if pure:
        assert not native.COMPILED and native.compiled is None
        assert node_module.Node.__module__ == "radixcache.tree.node"


def test_the_switch_reads_the_environment_at_import() -> None:
    code = "import radixcache.native as n, radixcache.tree.node as t; print(n.COMPILED, t.Node.__module__)"
    env = {**os.environ, native.PURE_ENV: "1"}
    env.pop(native.REQUIRE_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "radixcache.tree.node"], out.stderr
    env[native.REQUIRE_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "both set" in out.stderr


def test_the_compiled_node_has_every_field_of_the_python_node() -> None:
    core = _core()
    n = core.Node(np.zeros(4, np.int32), None, "ns", 7)
    for name in _python_node_slots():
        assert hasattr(n, name), name
    assert (n.uid, n.last_access, n.heap_seq, n.lock_ref, n.children, n.is_root) == (7, 7, -1, 0, {}, True)


def test_the_compiled_insert_records_stores_under_the_tree_s_medium() -> None:
    assert _core().GPU == radix_tree.GPU


def _dataclass_fields(name: str) -> list[str]:
    """The fields of the dataclass ``name`` of radixcache/tree/node.py, in order (its source)."""
    src = (ROOT / "radixcache" / "tree" / "node.py").read_text()
    body = src[src.index(f"class {name}:"): src.index("@property", src.index(f"class {name}:"))]
    return [line.split(":")[0].strip() for line in body.splitlines()
            if line.startswith("    ") and ":" in line and not line.strip().startswith(('"', "#"))]


def test_the_compiled_match_result_is_the_python_one() -> None:
    """The same fields, defaults, mutability and derived length as the dataclass."""
    core = _core()
    names = _dataclass_fields("MatchResult")
    assert names == ["device_len", "device_pages", "last_device_node", "host_len", "host_nodes",
                     "storage_len"], names
    pages = np.arange(2, dtype=np.int32)
    m = core.MatchResult(8, pages, None)
    assert [getattr(m, f) is not None for f in names] == [True, True, False, True, True, True]
    assert (m.host_len, m.host_nodes, m.storage_len, m.total_len) == (0, (), 0, 8)
    m.storage_len = 4
    assert m.total_len == 12 and m.device_pages is pages
    assert repr(m).startswith("MatchResult(device_len=8, device_pages=array([0, 1]")


def test_the_compiled_insert_result_is_the_python_one() -> None:
    """The same fields, in order, and the same derived page ids as the dataclass."""
    core = _core()
    names = _dataclass_fields("InsertResult")
    assert names == ["existing_pages", "device_parts", "last_node", "new_nodes", "new_node_offsets",
                     "inserted_pages"], names
    parts = [np.arange(2, dtype=np.int32), np.arange(5, 8, dtype=np.int32)]
    values = [1, parts, None, [], [0], 5]
    r = core.InsertResult(*values)
    assert [getattr(r, f) for f in names] == values
    assert r.device_pages.tolist() == [0, 1, 5, 6, 7] == node_module.concat_pages(parts).tolist()
    assert repr(r).startswith("InsertResult(existing_pages=1, device_parts=[array([0, 1]")
    tree = RadixTree(4, make_eviction_policy("lru"))
    got = tree.insert(DEFAULT_NAMESPACE, np.arange(8, dtype=np.int32), np.array([3, 4], np.int32))
    assert type(got) is node_module.InsertResult  # (the compiled one where the core is in use)
    assert (got.existing_pages, got.inserted_pages, got.device_pages.tolist()) == (0, 2, [3, 4])
    with pytest.raises(ValueError, match="whole pages"):
        tree.insert(DEFAULT_NAMESPACE, np.arange(6, dtype=np.int32), np.array([3], np.int32))
    with pytest.raises(ValueError, match="need 2 pages, got 1"):
        tree.insert(DEFAULT_NAMESPACE, np.arange(8, dtype=np.int32), np.array([3], np.int32))


def _python_node_slots() -> tuple[str, ...]:
    src = (ROOT / "radixcache" / "tree" / "node.py").read_text()
    start = src.index("__slots__ = (")
    body = src[start + len("__slots__ = ("): src.index(")", start)]
    return tuple(s.strip().strip('",') for s in body.split() if s.strip().strip('",'))


tokens32 = st.lists(st.integers(0, 2**31 - 1), max_size=4 * 64).map(lambda v: np.asarray(v, dtype=np.int32))


# (16, 32 and 64 have loops of their own in the core, every other size the general one)
# (16 also has an AVX2 loop, used where the CPU has it; ``simd`` False runs the plain one)
@settings(max_examples=300, deadline=None)
@given(tokens32, st.sampled_from([1, 2, 4, 5, 16, 32, 64]), st.one_of(st.none(), st.integers(0, 2**63 - 1)),
       st.booleans())
def test_block_ids_equal_the_definition(tokens: np.ndarray, p: int, parent: int | None, simd: bool) -> None:
    core = _core()
    tokens = tokens[: tokens.size - tokens.size % p]
    seed = 12345
    start = seed if parent is None else parent
    try:
        core.ids_simd(simd)
        got = core.block_ids(tokens, p, start, _TABLES.lane_weights(p))
    finally:
        core.ids_simd(True)
    assert got.dtype == np.int64
    assert got.tolist() == vector_block_ids(tokens, p, start).tolist()
    assert got.tolist() == block_id_of_sequence(tokens, p, parent, seed)


def _common_len_reference(key: np.ndarray, tokens: np.ndarray, pos: int, n: int, p: int) -> int:
    m = min(key.size, n - pos)
    same = 0
    while same + p <= m and (key[same : same + p] == tokens[pos + same : pos + same + p]).all():
        same += p
    return same


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_token_loops_equal_their_python_references(data: st.DataObject) -> None:
    core = _core()
    p = data.draw(st.sampled_from([1, 2, 4]))
    pages = data.draw(st.integers(1, 6))
    key = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=pages * p, max_size=pages * p)), np.int32)
    tokens = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=p, max_size=10 * p)), np.int32)
    tokens = tokens[: tokens.size - tokens.size % p]
    pos = data.draw(st.integers(0, tokens.size // p - 1)) * p
    n = data.draw(st.integers(pos // p + 1, tokens.size // p)) * p
    want = _common_len_reference(key, tokens, pos, n, p)
    assert core.common_len(key, tokens, pos, n, p) == want
    assert node_module.common_len(key, tokens, pos, n, p) == want  # whichever path this process runs
    assert core.first_page(tokens, pos, p) == tokens[pos : pos + p].tobytes()
    parts = [tokens[i : i + p] for i in range(0, tokens.size, p)]
    assert core.concat_pages(parts).tolist() == tokens.tolist()
    assert core.concat_pages([]).dtype == np.int32 and core.concat_pages([]).size == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=64))
def test_owned_tokens_copies_and_refuses_negative_ids(values: list[int]) -> None:
    core = _core()
    arr = np.asarray(values, dtype=np.int32)
    got = core.owned_tokens(arr)
    if arr.size and arr.min() < 0:
        assert got is None
    else:
        assert got is not None and got.tolist() == values and got.dtype == np.int32
        assert not np.shares_memory(got, arr)


def test_owned_tokens_leaves_every_other_buffer_to_the_general_path() -> None:
    """Only a 1-D C-contiguous native int32 buffer is copied here; anything
    else comes back as NotImplemented, unread (as_tokens converts or refuses it)."""
    core = _core()
    base = np.arange(8, dtype=np.int32)
    others = [
        base[::2], base.reshape(2, 4), np.array(3, np.int32), base.astype(">i4"), base.astype(np.int64),
        base.astype(np.uint32), base.astype(np.int16), b"abcd", [1, 2], None,
    ]
    for other in others:
        assert core.owned_tokens(other) is NotImplemented, other
    assert core.owned_tokens(memoryview(base)).tolist() == base.tolist()  # (as_tokens passes ndarrays only)


class _Sub(np.ndarray):
    """A numpy subclass: read through the buffer protocol, not from the array head."""


def test_plain_arrays_and_every_other_buffer_read_the_same() -> None:
    """The loops read a plain 1-D numpy array of numpy's own dtype objects
    from the array's head, and anything else (a subclass, a dtype with
    metadata, a read-only or offset view) through the buffer protocol:
    the same ids either way, and a destination that is not writable is
    refused, not written."""
    core = _core()
    base = np.arange(40, dtype=np.int32)
    tagged = np.dtype(np.int32, metadata={"why": "not numpy's own int32 object"})
    read_only = base.copy()
    read_only.setflags(write=False)
    forms = [base, base[3:27], base[:0], base.view(_Sub), base.astype(tagged), read_only,
             np.frombuffer(base.tobytes(), np.int32)]  # fmt: skip
    assert base.astype(tagged).dtype is not base.dtype  # (the fallback is what it exercises)
    for arr in forms:
        want = np.asarray(arr).tolist()
        assert core.owned_tokens(arr).tolist() == want
        assert core.concat_pages([arr, base[:4], arr]).tolist() == want + [0, 1, 2, 3] + want
        n = len(want) - len(want) % 4
        assert core.common_len(arr, base, 0, n, 4) == (n if want[:n] == list(range(n)) else 0)
        if len(want) >= 4:
            assert core.first_page(arr, 0, 4) == np.asarray(arr)[:4].tobytes()
    src = np.arange(3 * 4096, dtype=np.uint64).view(np.uint8)[: 3 * 4096]
    dst = np.zeros(src.size, np.uint8)
    rows, cols = core.copy_sums(src, 0, dst)
    assert np.array_equal(dst, src) and rows.size == 3
    frozen = np.zeros(src.size, np.uint8)
    frozen.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        core.copy_sums(src, 0, frozen)
    assert not frozen.any()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_append_pages_equals_the_python_reference(data: st.DataObject) -> None:
    core = _core()
    prompt = np.zeros(data.draw(st.integers(0, 300)), np.int32)
    mine, ref = (Request(0, DEFAULT_NAMESPACE, prompt, 0) for _ in range(2))
    for _ in range(data.draw(st.integers(1, 8))):
        ids = np.asarray(data.draw(st.lists(st.integers(0, 2**31 - 1), max_size=40)), np.int32)
        form = data.draw(st.sampled_from(["int32", "int64", "strided", "read-only"]))
        if form == "int64":
            ids = ids.astype(np.int64)
        elif form == "strided":
            ids = np.repeat(ids, 2)[::2]
        elif form == "read-only":
            ids.setflags(write=False)
        core.append_pages(mine, ids)
        append_pages_reference(ref, ids)
        assert mine.num_pages == ref.num_pages
        assert mine.page_table.tolist() == ref.page_table.tolist()
        assert mine._pages.size == ref._pages.size and mine._pages.dtype == np.int32
        assert not np.shares_memory(mine._pages, ids)
    assert EMPTY_PAGES.size == 0  # the shared empty table was never written


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=1, max_size=8),
    st.lists(st.sampled_from(["none", "node", "last", "run", "start"]), min_size=8, max_size=8),
    st.randoms(use_true_random=False),
    st.sampled_from([(4, True), (16, True), (16, False)]),
)
def test_event_ids_equal_the_python_reference(pages: list[list[int]], ask: list[str], rnd: Any,
                                              size_simd: tuple[int, bool]) -> None:
    core = _core()
    P, simd = size_simd  # (16 tokens a page: the AVX2 loop where the CPU has it, or the plain one)
    core.ids_simd(simd)
    try:
        _event_ids_walk(core, pages, ask, rnd, P)
    finally:
        core.ids_simd(True)


def _event_ids_walk(core: ModuleType, pages: list[list[int]], ask: list[str], rnd: Any, P: int) -> None:
    if native.COMPILED:  # (on the pure path the tree's nodes are Python ones: both sides are the reference)
        assert EventIds.node_ids is core.node_ids and EventIds.run_ids is core.run_ids
        assert EventIds.last_id is core.last_id and EventIds.chain_start is core.chain_start
    # Two identical trees, each keeping its own ids: one asked through the
    # walks this process runs (the compiled ones, unless RADIXCACHE_PURE is
    # set), one through the references, in lockstep; ids kept between
    # inserts get extended past and split by the later ones.
    trees = [RadixTree(P, make_eviction_policy("lru")) for _ in range(2)]
    sides = [(EventIds(P), EventIds.run_ids, EventIds.node_ids, EventIds.last_id, EventIds.chain_start),
             (EventIds(P), run_ids_reference, node_ids_reference, last_id_reference, chain_start_reference)]
    start = 0
    for i, p in enumerate(pages):
        tokens = np.repeat(np.asarray(p, np.int32), P)
        ids = np.arange(start, start + len(p), dtype=np.int32)
        start += len(p)
        ends = [tree.insert(DEFAULT_NAMESPACE, tokens, ids).last_node for tree in trees]
        how = "node" if i == len(pages) - 1 else ask[i]
        while how != "none" and ends[0].parent is not None:
            size = ends[0].key.size // P
            first = rnd.randrange(size)
            count = rnd.randrange(1, size - first + 1)
            got = []
            for (eids, run, whole, last, chain), node in zip(sides, ends):
                if how == "start":
                    got.append(chain(eids, node))
                elif how == "run":
                    before, out = run(eids, node, first, count)
                    got.append((before, out.tolist()))
                elif how == "last":
                    got.append(last(eids, node))
                else:
                    got.append(whole(eids, node).tolist())
            assert got[0] == got[1]
            assert [(n.id_pages, n.last_id) for n in ends] == [(ends[1].id_pages, ends[1].last_id)] * 2
            ends = [node.parent for node in ends]


def _workload(pure: bool, seeds: int, steps: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in (native.PURE_ENV, native.REQUIRE_ENV)}
    if pure:
        env[native.PURE_ENV] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "tests.radixcache.native.native_workload", str(seeds), str(steps)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_random_workloads_give_the_same_results_compiled_and_pure() -> None:
    _core()
    compiled = _workload(False, seeds=12, steps=300)
    pure = _workload(True, seeds=12, steps=300)
    assert compiled["compiled"] is True and pure["compiled"] is False
    for a, b in zip(compiled["runs"], pure["runs"]):  # type: ignore[call-overload]
        assert a == b, f"seed {a['seed']} differs"


def test_the_engine_hands_its_copy_and_checksum_pass_to_the_storage_layer() -> None:
    """Opening stores through the engine (``radixcache.tiers.config``) gives
    the storage layer the compiled passes (copy and sum; sum where the bytes
    lie), or numpy's on the pure path."""
    importlib.import_module("radixcache.tiers.config")
    checksums = importlib.import_module("radixcache.offload.storage.kv_checksum")
    assert checksums._copy_sums is (None if native.compiled is None else native.compiled.copy_sums)
    assert checksums._sums is (None if native.compiled is None else native.compiled.kv_sums)

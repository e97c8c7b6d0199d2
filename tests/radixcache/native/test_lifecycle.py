"""The request lifecycle's common case in C (radixcache/native/lifecycle.pxi:
``cache_admit``, ``cache_release``, ``cache_take_events`` and the handle
``new_request`` builds) against the Python methods of radixcache/cache.py
they stand for: the same handles, counters, tenant counts, locks, events and
errors, on the common case and on every case the C code hands back to the
Python method (tags, quotas, lists, bad ids, closed caches, foreign or
released handles)."""

from __future__ import annotations

import gc
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import CacheConfig, KVSpec, Namespace, RadixCache, native
from radixcache.errors import CacheClosedError, OutOfPagesError, RequestStateError
from radixcache.namespace import DEFAULT_NAMESPACE
from radixcache.native import compiled as native_core
from radixcache.request import Request
from radixcache.tenants import QuotaBook
from radixcache.tenants.gate import TenantGate
from radixcache.stats import Counters
from radixcache.tenants.ledger import TenantCounters, TenantLedger
from radixcache.tree.node import EMPTY_PAGES

# The tests below need the compiled lifecycle in this process; on the
# pure-Python path (RADIXCACHE_PURE=1) the last test runs them in a child
# process that has it, so neither path skips them.
COMPILED = native_core is not None
ROOT = Path(__file__).resolve().parents[3]


def _compiled(test: Any) -> Any:
    """Collected only where the compiled core is in use."""
    test.__test__ = COMPILED
    return test


P = 4
SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
SPACES = [DEFAULT_NAMESPACE, Namespace(salt="s1"), Namespace(lora_id=3, lora_name="ad"),
          Namespace(salt="t", tags=("team-a",))]  # (the last: tags, the Python method's case)
BASE = np.arange(100, 100 + 6 * P, dtype=np.int32)


def _prompt(kind: int, length: int) -> object:
    """Prompts that share prefixes with each other, and the odd ones."""
    if kind == 0:
        return BASE[:length].copy()
    if kind == 1:
        return np.concatenate([BASE[: length // 2], np.arange(length - length // 2, dtype=np.int32) + 7])
    if kind == 2:
        return BASE[:length].tolist()  # a list: converted by the Python method
    if kind == 3:
        return BASE[:length].astype(np.int64)  # another dtype: converted there too
    if kind == 4:
        return np.concatenate([BASE[:length], [-1]]).astype(np.int32)  # a negative id: refused
    return BASE[: 2 * length : 2]  # a strided view: converted


def _cache(quotas: bool) -> RadixCache:
    return RadixCache(CacheConfig(spec=SPEC, device_pages=24, allocate_kv=False, record_events=True,
                                  quotas=QuotaBook() if quotas else None))


def _fields(req: Request) -> dict[str, Any]:
    """A handle's fields, nodes by their tokens and lock count, arrays by content."""
    out: dict[str, Any] = {}
    for name in Request.__slots__:
        v = getattr(req, name)
        if name == "_pages":  # (past ``num_pages``: room not written yet)
            v = v[: req.num_pages].tolist()
        elif name == "_tokens":
            v = v[: req.num_tokens].tolist()
        elif name == "locked_node" and v is not None:
            v = (v.key.tolist(), v.lock_ref)
        elif name == "namespace":
            v = SPACES.index(v)
        out[name] = v
    out["page_table"] = req.page_table.tolist()
    return out


def _events(cache: RadixCache, take: Any) -> list[Any]:
    return [(type(e).__name__, [int(h) for h in getattr(e, "block_hashes", [])],
             getattr(e, "medium", None)) for e in take(cache)]


def _state(cache: RadixCache) -> Any:
    ledger = cache._ledger
    return (asdict(cache.stats()), {str(k): asdict(v) for k, v in ledger.counters.items()},
            dict(ledger.device), dict(ledger.evictable), cache.tree.evictable_pages, cache.tree.node_count,
            cache.pool.free_count)


def _call(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the error is part of what must agree
        return ("raised", type(exc).__name__, str(exc))


OPS = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5), st.integers(0, 6 * P), st.integers(0, 3),
                         st.integers(-1, 2)), min_size=1, max_size=40)


@_compiled
@settings(max_examples=60, deadline=None)
@given(ops=OPS, quotas=st.booleans())
def test_the_compiled_lifecycle_does_what_the_python_methods_do(ops: list[tuple[int, ...]], quotas: bool) -> None:
    """The same calls on two caches, one through the installed (compiled)
    methods and one through the Python ones: every result and error, every
    handle's fields, the counters, tenant counts, events and free pages agree
    after every call, and both caches pass their integrity check."""
    admit_py, reserve_py, commit_py, release_py, take_py = native_core.reference_methods()
    ours, ref = _cache(quotas), _cache(quotas)
    live: list[tuple[Request, Request]] = []
    gone: list[tuple[Request, Request]] = []
    for op, kind, length, space, priority in ops:
        if op <= 2 or not live:  # admit
            prompt = _prompt(kind, length)
            prio: object = priority if priority >= 0 else True  # (a bool is refused)
            a = _call(RadixCache.admit, ours, prompt, SPACES[space], prio)
            b = _call(admit_py, ref, prompt, SPACES[space], prio)
            assert a[0] == b[0], (a, b)
            if a[0] == "raised":
                assert a == b
            else:
                assert type(a[1]) is Request and _fields(a[1]) == _fields(b[1])
                live.append((a[1], b[1]))
        elif op == 3:  # compute some of the rest of a prompt (a chunk, a page or all of it), commit it
            ra, rb = live[length % len(live)]
            n = (ra.num_tokens - ra.num_computed) // (1 + kind % 3)
            a, b = _call(RadixCache.reserve, ours, ra, n), _call(reserve_py, ref, rb, n)
            assert a[0] == b[0] and (a == b if a[0] == "raised" else a[1].tolist() == b[1].tolist()), (a, b)
            if priority == 2:  # a commit past the reservation: refused
                n = ra.reserved_tokens - ra.num_computed + 1
            a, b = _call(RadixCache.commit, ours, ra, n), _call(commit_py, ref, rb, n)
            assert a == b, (a, b)
        elif op == 4:  # release
            ra, rb = live.pop(length % len(live))
            assert _call(RadixCache.release, ours, ra) == _call(release_py, ref, rb)
            gone.append((ra, rb))
        elif op == 5 and gone:  # release again: refused, nothing changed
            ra, rb = gone[length % len(gone)]
            a, b = _call(RadixCache.release, ours, ra), _call(release_py, ref, rb)
            assert a == b and a[:2] == ("raised", "RequestStateError"), (a, b)
        else:  # make room
            ours.evict(length)
            ref.evict(length)
        for ra, rb in live + gone:
            assert _fields(ra) == _fields(rb)
        assert _state(ours) == _state(ref)
        assert _events(ours, RadixCache.take_events) == _events(ref, take_py)
    ours.check_integrity()
    ref.check_integrity()
    for ra, rb in live:
        assert _call(RadixCache.release, ours, ra) == _call(release_py, ref, rb)
    assert _state(ours) == _state(ref)
    ours.check_integrity()


@_compiled
def test_the_installed_methods_are_the_compiled_ones() -> None:
    installed = (RadixCache.admit, RadixCache.reserve, RadixCache.commit, RadixCache.release,
                 RadixCache.take_events)
    assert installed == (native_core.cache_admit, native_core.cache_reserve, native_core.cache_commit,
                         native_core.cache_release, native_core.cache_take_events)
    python = native_core.reference_methods()
    assert [(f.__module__, f.__name__) for f in python] == [
        ("radixcache.cache", name) for name in ("admit", "reserve", "commit", "release", "take_events")]
    for fn, method in zip(installed, python):  # what help() and inspect show: the methods' own
        assert fn.__doc__ == method.__doc__ and inspect.signature(fn) == inspect.signature(method)
    admit = inspect.signature(RadixCache.admit).parameters
    assert list(admit) == ["self", "tokens", "namespace", "priority"]
    assert admit["namespace"].default is DEFAULT_NAMESPACE and admit["priority"].default == 0


@_compiled
def test_the_compiled_handle_has_every_field_of_the_python_one() -> None:
    tokens = np.arange(9, dtype=np.int32)
    ns = Namespace(salt="a")
    assert tuple(Request.__slots__) == native_core.REQUEST_SLOTS
    before = sys.getrefcount(tokens)
    built, ref = native_core.new_request(5, ns, tokens, 3, 2), Request(5, ns, tokens, 3, 2)
    assert type(built) is Request and sys.getrefcount(tokens) == before + 2
    for name in Request.__slots__:
        a, b = getattr(built, name), getattr(ref, name)
        assert type(a) is type(b) and (a is b if isinstance(b, np.ndarray) else a == b), name
    assert built.pending == [] and built.pending is not native_core.new_request(1, ns, tokens, 0).pending
    assert built._pages is EMPTY_PAGES and built.tokens.tolist() == list(range(9))
    built.num_computed = 4  # a plain handle: its slots take new values
    assert built.num_computed == 4 and "Request(rid=5, tokens=9" in repr(built)
    del built, ref
    gc.collect()
    assert sys.getrefcount(tokens) == before  # nothing leaked


@_compiled
def test_binding_refuses_a_handle_class_of_other_slots() -> None:
    class Fewer:
        __slots__ = ("rid",)

    class Renamed:
        __slots__ = native_core.REQUEST_SLOTS[:-1] + ("others",)

    class Subclass(Request):
        __slots__ = ()

    for cls in (Fewer, Renamed, Subclass):
        with pytest.raises(TypeError, match="slots"):
            native_core.bind_cache(RadixCache, cls, Namespace, DEFAULT_NAMESPACE, TenantLedger, TenantGate,
                                   EMPTY_PAGES, Counters, TenantCounters)
    with pytest.raises(TypeError, match="slots"):  # (a counter class without the counters it bumps)
        native_core.bind_cache(RadixCache, Request, Namespace, DEFAULT_NAMESPACE, TenantLedger, TenantGate,
                               EMPTY_PAGES, Fewer, TenantCounters)
    cache = _cache(False)  # nothing was rebound
    req = cache.admit(np.arange(9, dtype=np.int32))
    assert type(req) is Request
    cache.release(req)
    cache.check_integrity()


@_compiled
def test_errors_of_the_compiled_calls_are_the_python_methods_and_change_nothing() -> None:
    cache, other = _cache(False), _cache(False)
    prompt = np.arange(3 * P + 1, dtype=np.int32)
    first = cache.admit(prompt)
    cache.reserve(first, first.num_tokens)
    cache.commit(first, first.num_tokens)
    cache.release(first)
    cache.take_events()
    before = _state(cache)
    foreign = other.admit(prompt)
    bare = Request.__new__(Request)
    for call, kind, error in [
        (lambda: cache.release(first), RequestStateError, "already released"),
        (lambda: cache.release(foreign), RequestStateError, "does not belong to this cache"),
        (lambda: cache.release("req"), TypeError, "expected a Request"),
        (lambda: cache.release(bare), AttributeError, "has no attribute 'released'"),
        (lambda: cache.admit(prompt, "ns"), TypeError, "namespace must be a Namespace"),
        (lambda: cache.admit(prompt, DEFAULT_NAMESPACE, 1.0), TypeError, "priority must be an int"),
        (lambda: cache.admit(np.array([1, -2], np.int32)), ValueError, "out of range"),
        (lambda: cache.admit(np.zeros((2, 2), np.int32)), ValueError, "1-D"),
        (lambda: cache.reserve(first, 4), RequestStateError, "already released"),
        (lambda: cache.commit(foreign, 0), RequestStateError, "does not belong to this cache"),
        (lambda: cache.reserve(bare, 4), AttributeError, "has no attribute 'released'"),
    ]:
        with pytest.raises(kind, match=error):
            call()
        assert _state(cache) == before and cache.take_events() == []
    hit = cache.admit(prompt)  # the cache still serves: the cached pages are found and locked
    assert hit.cached_len == 3 * P and hit.locked_node is not None and hit.locked_node.lock_ref == 1
    for call, kind, error in [
        (lambda: cache.reserve(hit, -1), ValueError, "non-negative int"),
        (lambda: cache.reserve(hit, 1.5), ValueError, "non-negative int"),
        (lambda: cache.reserve(hit, True), ValueError, "non-negative int"),
        (lambda: cache.commit(hit, 2), ValueError, "only 12 were reserved"),
        (lambda: cache.reserve(hit, 1 << 70), OutOfPagesError, "pages"),
    ]:
        with pytest.raises(kind, match=error):
            call()
        assert hit.reserved_tokens == 3 * P and hit.num_pages == 3 and hit.locked_node.lock_ref == 1
    assert cache.reserve(hit, 2).tolist()[:3] == first.page_table.tolist()[:3]
    cache.commit(hit, 1)
    assert (hit.num_computed, hit.shared_pages, hit.num_pages) == (3 * P + 1, 3, 4)
    cache.close()
    for call in (lambda: cache.admit(prompt), lambda: cache.release(hit), cache.take_events):
        with pytest.raises(CacheClosedError, match="closed"):
            call()
    assert hit.released  # close released it


@_compiled
def test_the_compiled_store_record_is_the_python_one() -> None:
    """An insert's ``BlockStored``, built through its slots, equals the class's
    own from the same arguments, field by field, and reads like one."""
    from radixcache.events.types import BlockStored

    args = (np.array([5, 6], np.int64), 4, np.arange(8, dtype=np.int32), P, 7, None, "ad", "salt",
            [("img",), ("img",)])
    built, ref = native_core.new_stored(*args), BlockStored(*args)
    assert type(built) is BlockStored and built == ref
    assert built.block_hashes == [5, 6] and built.num_blocks == 2 and built.token_ids is args[2]
    assert repr(built) == repr(ref)
    assert native_core.STORED_SLOTS[0] == "_hashes" and sorted(native_core.STORED_SLOTS) == sorted(
        ["_hashes", *BlockStored.__slots__])

    class Other(BlockStored):
        __slots__ = ("more",)

    with pytest.raises(TypeError, match="slots"):
        native_core.bind_recorder(object, object, Other)


@_compiled
def test_counters_of_another_class_are_bumped_through_their_attributes() -> None:
    """The admission bumps the exact counter classes in their slots, and any
    other counters object (here a subclass) through its attributes."""

    class MyCounters(Counters):
        __slots__ = ()

    cache = _cache(False)
    cache.counters = MyCounters()
    cache._capacity.counters = cache.counters
    prompt = np.arange(3 * P + 1, dtype=np.int32)
    for _ in range(2):
        req = cache.admit(prompt)
        cache.reserve(req, req.num_tokens - req.num_computed)
        cache.commit(req, req.num_tokens - req.num_computed)
        cache.release(req)
    stats = cache.stats()
    assert (stats.requests, stats.prompt_tokens, stats.hit_tokens, stats.hit_pages) == (2, 26, 12, 3)
    tenant = cache._ledger.counters_of(DEFAULT_NAMESPACE)
    assert (tenant.requests, tenant.prompt_tokens, tenant.device_hit_tokens) == (2, 26, 12)


def test_the_compiled_lifecycle_in_a_process_that_runs_it() -> None:
    """On the pure-Python path: the tests above, in a child process that runs
    the compiled core (built in this checkout; required there)."""
    built = sorted((ROOT / "radixcache" / "native").glob("_core*.so"))
    if not built:
        pytest.skip("the compiled core is not built here (pip install -e . builds it with a C compiler)")
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    env[native.REQUIRE_ENV] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(Path(__file__))],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and re.search(r"^7 passed", out.stdout, re.M), out.stdout[-4000:] + out.stderr[-4000:]


test_the_compiled_lifecycle_in_a_process_that_runs_it.__test__ = not COMPILED  # type: ignore[attr-defined]

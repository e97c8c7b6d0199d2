"""A fuzzer of the public API: every call succeeds, or raises an error its
docstring names and changes nothing (invariant 12).

The machine drives a tiered cache (device, host, a tiny LMDB store; events
recorded) through every public call with valid AND invalid arguments: token
containers of every kind (lists, numpy arrays of several dtypes and byte
orders, strided views, tensors, a reused int32 buffer rewritten after each
call), masked arrays, out-of-range ids, empty and huge prompts, odd (valid)
namespaces and ones the constructor must refuse, double release, commit
beyond the reservation or the tokens, a request of another cache, calls
after ``close()``. A manual copy engine and storage hold every copy, read
and write until a rule finishes it (succeeding, failing, or short), and
rules take the copy engine or chosen storage calls down (they raise) and
bring them back.

After every call: either it succeeded, or it raised an error its docstring
names and a snapshot of the tree, pools, requests, tier counters, jobs in
flight and recorded events equals the one taken before (``OutOfPagesError``
from ``reserve``: no eviction, no allocation, and with no job in flight and
nothing pending, nothing changed but the failure counter). After every
step: ``check_integrity()``, and the KV of every ready request is bit-exact
(a deterministic model's, a function of prefix, namespace and incarnation).
Taken events encode and decode with vLLM's and SGLang's own structs.

Profiles: the short one runs in the suite (a few seconds);
``RADIXCACHE_API_PROFILE=long`` runs ``RADIXCACHE_API_EXAMPLES`` examples of
100 steps (default 12,000: more than 10**6 steps); the steps run are
written to ``RADIXCACHE_API_STEPS_FILE`` when set."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixcache import CacheClosedError, CacheConfig, KVSpec, Namespace, OutOfPagesError, RadixCache, Request
from radixcache.events import BatchEncoder, check_events, decode_batch
from radixcache.offload import HostPoolConfig, StorageConfig
from radixcache.offload.policy import make_prefetch_policy, make_write_policy
from radixcache.offload.storage import record_size
from radixcache.tiers import HostTiers, TierConfig
from tests.events.peer_structs import SGLANG, VLLM
from tests.radixcache.apikit import (
    BAD_TOKENS,
    CONTAINERS,
    DOCUMENTED,
    ExpectedKV,
    Snapshot,
    differences,
    kv_problem,
    take_snapshot,
    write_kv,
)
from tests.radixcache.bigints import HUGE, unmark
from tests.radixcache.tiers.manual import ManualCopyEngine, ManualStorage

P = 4
SPEC = KVSpec(num_layers=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)
STEPS = [0]  # steps (rules) run, over every example
EXAMPLES = [0]  # examples (machines) run
CALLS = [0]  # public calls made, over every example
STORAGE_CALLS = ["longest_prefix", "get", "put", "take_removed", "take_written", "forget_namespace", "stats"]

# Valid namespaces at the edges of what the wire and a record carry.
BASE_NAMESPACES = [
    Namespace(),
    Namespace(salt="tenant-\u00e9\U0001f600"),
    Namespace(salt=b"\x00\xffbytes"),
    Namespace(lora_id=2**63 - 1, lora_name="lora-\u00e9"),
    Namespace(extra_keys=(-(2**63), 2**63 - 1, b"", "k")),
]

_text = st.one_of(
    st.text(max_size=6),
    st.lists(st.integers(0, 0x10FFFF), max_size=4).map(lambda cps: "".join(map(chr, cps))),
)
_value = st.one_of(
    st.none(), _text, st.binary(max_size=6), st.booleans(), st.floats(allow_nan=False),
    st.integers(-(2**64), 2**64), st.sampled_from([2**63 - 1, 2**63, HUGE, -1]),
)
_valid_key = st.one_of(_text, st.binary(max_size=6), st.integers(-(2**63), 2**63 - 1))
ODD_NAMESPACE = st.one_of(
    st.tuples(  # mostly valid: the cache runs with them
        st.one_of(st.none(), _text, st.binary(max_size=6)), st.one_of(st.none(), st.integers(0, 2**63 - 1)),
        st.one_of(st.none(), _text), st.lists(_valid_key, max_size=3).map(tuple),
    ),
    st.tuples(_value, _value, _value, st.one_of(st.lists(_value, max_size=3).map(tuple), _value)),
)
BAD_NAMESPACES: list[Any] = ["tenant", None, 3, {"salt": "a"}, (None, None)]


class Failed:
    """What ``ApiMachine._call`` returns when the call raised (documented)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class ApiMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        EXAMPLES[0] += 1
        STEPS[0] -= 1  # (the invariants also run once before the first step)
        self._dir = tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.namespaces = list(BASE_NAMESPACES)
        self.incarnations = [0] * len(self.namespaces)  # forgets per namespace, across restarts
        # id(req) -> (req, cache generation, ns, incarnation); holding the
        # request keeps its id unique for the example
        self.meta: dict[int, tuple[Request, int, int, int]] = {}
        self.reqs: list[Request] = []  # live and released ones (to call again)
        self.prompts: list[np.ndarray] = []  # recent prompts, asked again
        self.kv = ExpectedKV()
        self.generation = 0
        self.input_ids = torch.zeros(4096, dtype=torch.int32)  # the runner's reused buffer
        other_spec = KVSpec(1, 1, 2, torch.float32, P)
        self.other = RadixCache(CacheConfig(spec=other_spec, device_pages=4, allocate_kv=False))
        self.foreign = self.other.admit(np.arange(9, dtype=np.int32))
        self._open()

    # -------------------------------------------------------------- the cache
    def _open(self) -> None:
        record = record_size(24, 64, P, SPEC.page_bytes)
        tiers = TierConfig(
            host=HostPoolConfig(pages=8),
            write_policy="write_through",
            prefetch_policy="wait_complete",
            storage=StorageConfig(
                path=Path(self._dir.name) / "s", capacity_bytes=8 * record, durability="fast",
                num_readers=1,
            ),
            model_id="api-fuzz",
        )
        self.cache = RadixCache(CacheConfig(spec=SPEC, device_pages=16, tiers=tiers, record_events=True))
        t = self.cache.tiers
        assert isinstance(t, HostTiers) and self.cache.kv is not None
        t.controller.copy.close()
        self.engine = ManualCopyEngine(self.cache.kv, t.host.buffer)
        t.controller.copy = self.engine  # type: ignore[assignment]
        self.storage = ManualStorage(t.controller.storage)
        t.controller.storage = self.storage  # type: ignore[assignment]
        self.tiers = t
        self.generation += 1

    def _shut(self) -> None:
        """Bring the tiers back up and close (owed deletions settle)."""
        self.engine.raising = False
        self.storage.raising = set()
        if not self.cache.closed:
            self._call("close", self.cache.close)
        assert self.cache.closed

    # -------------------------------------------------------------- the contract
    def _call(self, name: str, fn: Callable[..., Any], *args: Any, expect_ok: bool = False) -> Any:
        """Run one public call: it succeeds, or raises what ``name`` documents
        and changes nothing."""
        CALLS[0] += 1
        # A call that must succeed needs no snapshot: failing is the violation.
        before = None if expect_ok else take_snapshot(self.cache)
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - judged below
            allowed = (*DOCUMENTED[name], CacheClosedError)
            assert isinstance(exc, allowed), f"{name} raised an undocumented {type(exc).__name__}: {exc}"
            assert before is not None, f"{name} should have succeeded: {type(exc).__name__}: {exc}"
            self._unchanged(name, exc, before, take_snapshot(self.cache))
            event(f"{name}: {type(exc).__name__}")
            return Failed(exc)

    def _unchanged(self, name: str, exc: BaseException, before: Snapshot, after: Snapshot) -> None:
        if isinstance(exc, OutOfPagesError):
            assert after.stats.evicted_pages == before.stats.evicted_pages, "a failed allocation evicted"
            assert after.stats.out_of_pages == before.stats.out_of_pages + 1
            pending = any(r[9] for r in before.requests)
            if not before.busy and not pending:  # nothing in flight to apply: nothing may change
                assert differences(before, after) == ["stats"], differences(before, after)
                assert dataclasses.replace(after.stats, out_of_pages=before.stats.out_of_pages) == before.stats
            return
        assert after == before, f"{name} raised {type(exc).__name__} ({exc}) and changed {differences(before, after)}"

    # -------------------------------------------------------------- the runner's side
    def _ns_index(self, pick: int) -> int:
        return pick % len(self.namespaces)

    def _tokens(self, body: list[int], pick: int) -> np.ndarray:
        if self.prompts and pick % 3 == 0:
            old = self.prompts[pick % len(self.prompts)]
            return np.concatenate([old, np.asarray(body[:3], dtype=np.int32)])
        if pick % 97 == 1:
            return (np.arange(20_000, dtype=np.int32) % 3)  # huge: never fits the pool
        return np.asarray(body, dtype=np.int32)

    def _container(self, tokens: np.ndarray, kind: str) -> tuple[Any, Callable[[], None]]:
        """``tokens`` as ``kind``, and how the caller rewrites it afterwards."""
        if kind == "reused int32 buffer":
            n = tokens.size
            if n > self.input_ids.numel():
                return tokens.copy(), lambda: None
            buf = self.input_ids
            buf[:n] = torch.from_numpy(tokens)
            view = buf[:n]
            return view, lambda: buf.fill_(2)  # the runner's next step overwrites it
        made = CONTAINERS[kind](tokens)
        if isinstance(made, (np.ndarray, torch.Tensor)):
            return made, lambda: made.__setitem__(slice(None), 1) if len(made) else None
        return made, lambda: None

    def _admit(self, ns: int, tokens: np.ndarray, kind: str, priority: int) -> Request | None:
        arg, rewrite = self._container(tokens, kind)
        out = self._call("admit", self.cache.admit, arg, self.namespaces[ns], priority, expect_ok=True)
        rewrite()
        if isinstance(out, Failed):
            return None
        req: Request = out
        assert np.array_equal(req.tokens, tokens), f"{kind}: the request's tokens changed with the caller's"
        self.meta[id(req)] = (req, self.generation, ns, self.incarnations[ns])
        self.reqs = [r for r in self.reqs if not r.released][-10:] + [req]
        if tokens.size < 200:
            self.prompts = (self.prompts + [tokens])[-6:]
        if req.pending:
            event("admitted with a load or fetch in flight")
        return req

    def _mine(self, req: Request) -> bool:
        m = self.meta.get(id(req))
        return m is not None and m[1] == self.generation and not req.released and not self.cache.closed

    def _want(self, req: Request, end: int) -> torch.Tensor:
        _, _, ns, inc = self.meta[id(req)]
        return self.kv.values(id(req), ns, inc, req.tokens, end)

    def _compute(self, req: Request, n: int) -> None:
        """Reserve (OutOfPagesError only when the pool cannot cover it),
        write the model's KV, commit."""
        n = min(n, req.num_tokens - req.num_computed)
        need = -(-(req.num_computed + n) // P) - req.num_pages
        cover = self.cache.pool.free_count + self.cache.tree.evictable_pages
        out = self._call("reserve", self.cache.reserve, req, n)
        if isinstance(out, Failed):
            assert isinstance(out.error, OutOfPagesError) and need > cover, out.error
            return
        start = req.num_computed
        n = min(n, req.reserved_tokens - start)
        write_kv(self.cache, req, start, self._want(req, start + n)[start:])
        self._call("commit", self.cache.commit, req, n, expect_ok=True)

    def _pick_req(self, pick: int) -> Request | None:
        return self.reqs[pick % len(self.reqs)] if self.reqs else None

    # -------------------------------------------------------------- rules: requests
    @rule(pick=st.integers(0, 999), body=st.lists(st.integers(0, 2), max_size=18),
          kind=st.sampled_from([*CONTAINERS, "reused int32 buffer"]), priority=st.integers(-(2**70), 2**70))
    def admit(self, pick: int, body: list[int], kind: str, priority: int) -> None:
        self._admit(self._ns_index(pick), self._tokens(body, pick), kind, priority)

    @rule(pick=st.integers(0, 999), body=st.lists(st.integers(0, 2), min_size=1, max_size=14),
          kind=st.sampled_from([*CONTAINERS, "reused int32 buffer"]))
    def serve(self, pick: int, body: list[int], kind: str) -> None:
        """A whole request: admit, resolve, compute, release."""
        req = self._admit(self._ns_index(pick), self._tokens(body, pick), kind, 0)
        if req is None or req.num_tokens > 200:
            return
        self._compute(req, 0)
        self._compute(req, req.num_tokens)
        self._call("release", self.cache.release, req, expect_ok=True)

    @rule(pick=st.integers(0, 999), n=st.integers(0, 9))
    def compute(self, pick: int, n: int) -> None:
        req = self._pick_req(pick)
        if req is not None and self._mine(req):
            self._compute(req, n)

    @rule(pick=st.integers(0, 999), n=st.one_of(st.integers(-3, 40), st.sampled_from([10**12, 1.5, True, "2", None])))
    def reserve_anything(self, pick: int, n: Any) -> None:
        req = self._pick_req(pick)
        if req is None:
            return
        valid = type(n) is int and n >= 0 and self._mine(req)
        out = self._call("reserve", self.cache.reserve, req, n)
        if valid and isinstance(out, Failed):
            assert isinstance(out.error, OutOfPagesError), out.error

    @rule(pick=st.integers(0, 999), n=st.one_of(st.integers(-3, 40), st.sampled_from([1.0, False, None])))
    def commit_anything(self, pick: int, n: Any) -> None:
        """Commit any count; within the reservation and the tokens, after
        writing the KV (a commit is then valid and must succeed)."""
        req = self._pick_req(pick)
        if req is None:
            return
        valid = (
            type(n) is int and n >= 0 and self._mine(req)
            and req.num_computed + n <= min(req.reserved_tokens, req.num_tokens)
        )
        if valid and n and req.pending:
            valid = False  # refused: reserve() first (the prefetch policy may move num_computed)
        elif valid and n:
            start = req.num_computed
            write_kv(self.cache, req, start, self._want(req, start + n)[start:])
        self._call("commit", self.cache.commit, req, n, expect_ok=valid)

    @rule(pick=st.integers(0, 999), extra=st.lists(st.integers(0, 2), min_size=0, max_size=5),
          kind=st.sampled_from([*CONTAINERS, "reused int32 buffer"]))
    def extend(self, pick: int, extra: list[int], kind: str) -> None:
        req = self._pick_req(pick)
        if req is None:
            return
        tokens = np.asarray(extra, dtype=np.int32)
        arg, rewrite = self._container(tokens, kind)
        before = req.tokens.copy()
        out = self._call("extend", self.cache.extend, req, arg, expect_ok=self._mine(req))
        rewrite()
        if not isinstance(out, Failed):
            assert np.array_equal(req.tokens, np.concatenate([before, tokens])), kind

    @rule(pick=st.integers(0, 999))
    def release(self, pick: int) -> None:
        req = self._pick_req(pick)
        if req is not None:
            self._call("release", self.cache.release, req, expect_ok=self._mine(req))

    # -------------------------------------------------------------- rules: bad inputs
    @rule(data=st.data(), which=st.sampled_from(
        ["tokens", "tokens", "namespace", "priority", "not a request", "another cache's request"]))
    def bad_call(self, data: st.DataObject, which: str) -> None:
        """A call with an argument the cache must refuse, changing nothing."""
        if which == "tokens":
            name, make, error = data.draw(st.sampled_from(BAD_TOKENS), label="bad tokens")
            call = data.draw(st.sampled_from(["admit", "peek", "extend"]), label="call")
            req = self._pick_req(data.draw(st.integers(0, 999), label="pick"))
            if call == "extend":
                if req is None or not self._mine(req):
                    return
                out = self._call("extend", self.cache.extend, req, make())
            else:
                out = self._call(call, getattr(self.cache, call), make())
            assert isinstance(out, Failed) and isinstance(out.error, error), f"{call}({name}): {out}"
        elif which == "namespace":
            bad = data.draw(st.sampled_from(BAD_NAMESPACES), label="namespace")
            call = data.draw(st.sampled_from(["admit", "peek", "forget_namespace"]), label="call")
            args = (bad,) if call == "forget_namespace" else (np.arange(5, dtype=np.int32), bad)
            out = self._call(call, getattr(self.cache, call), *args)
            assert isinstance(out, Failed) and isinstance(out.error, TypeError)
        elif which == "priority":
            priority = data.draw(st.sampled_from([1.5, True, "1", None, np.int64(1)]), label="priority")
            out = self._call("admit", self.cache.admit, np.arange(5, dtype=np.int32), Namespace(), priority)
            assert isinstance(out, Failed) and isinstance(out.error, TypeError)
        else:
            call = data.draw(st.sampled_from(["reserve", "commit", "extend", "release"]), label="call")
            handle: Any = self.foreign
            if which == "not a request":
                handle = data.draw(st.sampled_from(["req-1", None, 3]), label="handle")
            args = (handle,) if call == "release" else (handle, [1] if call == "extend" else 1)
            out = self._call(call, getattr(self.cache, call), *args)
            assert isinstance(out, Failed), f"{call} accepted {handle!r}"

    @rule(fields=ODD_NAMESPACE)
    def odd_namespace(self, fields: tuple[Any, Any, Any, Any]) -> None:
        """Refused at construction (naming the field), or used by the cache."""
        try:
            ns = Namespace(*(unmark(f) for f in fields))
        except (TypeError, ValueError) as exc:
            assert any(f in str(exc) for f in ("salt", "lora_id", "lora_name", "extra_keys", "too large"))
            event("odd namespace refused")
            return
        if ns not in self.namespaces and len(self.namespaces) < 12:
            self.namespaces.append(ns)
            self.incarnations.append(0)
            event("odd namespace used")

    @rule(n=st.one_of(st.integers(-2, 12), st.sampled_from([1.5, None, "3", True])))
    def evict(self, n: Any) -> None:
        out = self._call("evict", self.cache.evict, n, expect_ok=type(n) is int and n >= 0)
        if not isinstance(out, Failed):
            assert isinstance(out, int)

    @rule(pick=st.integers(0, 999))
    def forget(self, pick: int) -> None:
        ns = self._ns_index(pick)
        out = self._call("forget_namespace", self.cache.forget_namespace, self.namespaces[ns], expect_ok=True)
        if not isinstance(out, Failed):
            self.incarnations[ns] += 1
            event("forget")

    @rule(pick=st.integers(0, 99), force=st.sampled_from([False, True, 1, None]))
    def reset(self, pick: int, force: Any) -> None:
        if force is True and pick >= 10:
            return  # rarely: it ends every live request
        live = bool(self.cache.live_requests)
        out = self._call("reset", self.cache.reset, force)
        if type(force) is not bool or (live and not force):
            assert isinstance(out, Failed), "reset should have refused"

    # -------------------------------------------------------------- rules: views
    @rule(which=st.sampled_from(["poll", "drain", "stats", "tier_stats", "check_integrity"]))
    def views(self, which: str) -> None:
        self._call(which, getattr(self.cache, which), expect_ok=True)

    @rule(pick=st.integers(0, 999), body=st.lists(st.integers(0, 2), max_size=18))
    def peek(self, pick: int, body: list[int]) -> None:
        tokens = self._tokens(body, pick)
        out = self._call("peek", self.cache.peek, tokens, self.namespaces[self._ns_index(pick)], expect_ok=True)
        assert 0 <= out <= max(tokens.size - 1, 0)

    @rule()
    def take_events(self) -> None:
        events = self._call("take_events", self.cache.take_events, expect_ok=True)
        if not events:
            return
        check_events(events)
        for media in ("sglang", "vllm"):
            payload = BatchEncoder(media).encode(events, 1.0, None)
            assert len(decode_batch(payload).events) == len(events)
            assert len(VLLM.decode(payload).events) == len(events)
            assert len(SGLANG.decode(payload).events) == len(events)

    # -------------------------------------------------------------- rules: tiers
    @rule(write=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
          prefetch=st.sampled_from(["wait_complete", "best_effort"]))
    def switch_policies(self, write: str, prefetch: str) -> None:
        self.tiers.write = (
            make_write_policy(write, threshold=2) if write == "write_through_selective" else make_write_policy(write)
        )
        self.tiers.prefetch = make_prefetch_policy(prefetch)

    @rule(pick=st.integers(0, 99), fail=st.booleans())
    def finish_a_copy(self, pick: int, fail: bool) -> None:
        if self.engine.pending:
            _, _, ticket = self.engine.pending[pick % len(self.engine.pending)]
            self.engine.complete(ticket, fail=fail and pick % 4 == 0)

    @rule(pick=st.integers(0, 99), mode=st.sampled_from(["ok", "ok", "fail", "short"]))
    def finish_a_storage_op(self, pick: int, mode: str) -> None:
        if self.storage.pending:
            kind, _, ticket = self.storage.pending[pick % len(self.storage.pending)]
            self.storage.complete(ticket, mode, short=pick % 3)
            event(f"storage {kind} {mode}")

    @rule(copies=st.booleans(), calls=st.sets(st.sampled_from(STORAGE_CALLS)))
    def tiers_down(self, copies: bool, calls: set[str]) -> None:
        """The copy engine (``copies``) and chosen storage calls raise at once
        (an engine, a connection down); none: everything is back up."""
        self.engine.raising = copies
        self.storage.raising = set(calls)

    # -------------------------------------------------------------- rules: close
    @rule(pick=st.integers(0, 999))
    def close_and_reopen(self, pick: int) -> None:
        """Close (live requests are released), check every call is refused
        and changes nothing, close again, then a new cache on the same store
        (one time in four: a restart costs an LMDB open and its threads)."""
        if pick % 4:
            return
        live = list(self.cache.live_requests)
        self._shut()
        assert all(r.released for r in live)
        req = self._pick_req(pick) or self.foreign
        tokens = np.arange(9, dtype=np.int32)
        for name, args in (
            ("admit", (tokens,)), ("admit", ("bad",)), ("peek", (tokens,)), ("reserve", (req, 1)),
            ("extend", (req, [1])), ("commit", (req, 0)), ("release", (req,)), ("evict", (1,)),
            ("forget_namespace", (Namespace(),)), ("reset", (True,)), ("poll", ()), ("drain", ()),
            ("take_events", ()), ("stats", ()), ("tier_stats", ()), ("check_integrity", ()),
        ):
            out = self._call(name, getattr(self.cache, name), *args)
            assert isinstance(out, Failed) and isinstance(out.error, CacheClosedError), (name, out)
        self._call("close", self.cache.close, expect_ok=True)  # twice is fine
        self._open()
        event("close and reopen")

    # -------------------------------------------------------------- checks
    @invariant()
    def integrity(self) -> None:
        STEPS[0] += 1  # (invariants run once after every step)
        if not self.cache.closed:
            self.cache.check_integrity()

    @invariant()
    def kv_is_right(self) -> None:
        for req in self.cache.live_requests:
            if req.ready and id(req) in self.meta:
                problem = kv_problem(self.cache, req, self._want(req, req.num_computed))
                assert problem is None, problem

    def teardown(self) -> None:
        c = self.tiers.counters
        for what, n in (("host hits", c.host_hit_tokens), ("storage hits", c.storage_hit_tokens),
                        ("loads landed for their request", c.loaded_tokens),
                        ("loads abandoned or failed", c.abandoned_tokens), ("failed jobs", c.failed_jobs)):
            if n:
                event(f"last cache: {what}")
        self._shut()
        self.other.release(self.foreign)
        self._dir.cleanup()
        steps_file = os.environ.get("RADIXCACHE_API_STEPS_FILE")
        if steps_file:
            Path(steps_file).write_text(f"{STEPS[0]} steps {CALLS[0]} calls {EXAMPLES[0]} examples\n")


LONG = os.environ.get("RADIXCACHE_API_PROFILE") == "long"
ApiMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RADIXCACHE_API_EXAMPLES", 12_000 if LONG else 25)),
    stateful_step_count=100 if LONG else 40,
    deadline=None,
    database=None,
    print_blob=True,  # a failure prints @reproduce_failure(...): rerun exactly that example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
TestApiMachine = ApiMachine.TestCase

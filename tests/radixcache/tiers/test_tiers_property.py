"""Random cache operations with tier jobs of every kind finishing, failing or
coming back short in random order.

The machine drives a tiered cache (device, host, a tiny LMDB store whose LRU
evicts records under load) through admit / reserve / commit / extend /
release, ``forget_namespace``, ``reset`` and ``evict``, while a manual copy
engine and a manual storage hold every copy, read and write until a rule
finishes it (succeeding, failing, or, for a read, returning fewer pages).
After every step: ``check_integrity()`` (which compares every node's holds
with the live jobs); every ready request's KV is bit-exact, where the KV of
a position depends on its whole prefix, its namespace and the namespace's
incarnation (the number of forgets before the request was admitted), so a
page served for another prefix, tenant or a forgotten incarnation is caught;
and no ``OutOfPagesError`` while free plus evictable pages covered the
request. Recent prompts are asked again (also after a restart), so their
pages come back from host or storage while other jobs are in flight. A
failure prints its example's blob (``@reproduce_failure``) to replay it.
``RADIXCACHE_TIER_PROFILE=long`` selects the long profile (and
``RADIXCACHE_TIER_EXAMPLES`` its number of runs); the steps run are written
to ``RADIXCACHE_TIER_STEPS_FILE`` when set."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import os
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

from radixcache import CacheConfig, Namespace, Node, OutOfPagesError, RadixCache, Request
from radixcache.offload import (
    HostPoolConfig,
    StorageConfig,
    make_prefetch_policy,
    make_write_policy,
)
from radixcache.offload.storage import record_size
from radixcache.tiers import HostTiers, TierConfig
from tests.radixcache.tiers.manual import ManualCopyEngine, ManualStorage
from tests.radixcache.tiers.tierkit import P, SPEC


def path_tokens(node: Node) -> list[int]:
    """All tokens from the root down to the end of ``node``."""
    parts = []
    n: Node | None = node
    while n is not None and n.parent is not None:
        parts.append(n.key)
        n = n.parent
    return np.concatenate(parts[::-1]).tolist()


NAMESPACES = [Namespace(), Namespace(salt="tenant-b"), Namespace(lora_id=3)]
STEPS = [0]  # rules run, over every example


def kv_value(ns: int, incarnation: int, prefix: np.ndarray) -> float:
    """What a deterministic model would write for the last token of ``prefix``."""
    head = bytes([ns, incarnation % 256])
    return float(zlib.crc32(head + prefix.astype("<i4").tobytes()) % 100_003)


class TieredMachine(RuleBasedStateMachine):
    requests = Bundle("requests")
    sealed = False  # the store's records encrypted at rest (SealedTieredMachine)
    quotas: dict[str | None, object] | None = None  # CacheConfig.quotas (tests/radixcache/tenants)

    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory(
            dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        self.forgets = [0] * len(NAMESPACES)  # incarnation of each namespace
        self.meta: dict[int, tuple[int, int]] = {}  # rid -> (namespace, incarnation)
        # Recent prompts per namespace (kept across restarts): asked again, they
        # find their pages evicted to host or storage, so loads and fetches run.
        self.prompts: list[list[list[int]]] = [[] for _ in NAMESPACES]
        self.clock: Callable[[], float] = time.time  # what TTLs are measured with
        self._open()

    def _open(self) -> None:
        """A cache on the machine's store (a restart keeps the store)."""
        record = record_size(24, 0, P, SPEC.page_bytes)
        keys = Path(self._dir.name) / "rx.key"
        if self.sealed and not keys.exists():
            keys.write_text(bytes(range(32)).hex() + "\n")
            keys.chmod(0o600)
        tiers = TierConfig(
            host=HostPoolConfig(pages=8),
            write_policy="write_through",
            prefetch_policy="wait_complete",
            storage=StorageConfig(
                path=Path(self._dir.name) / "s", capacity_bytes=6 * record, durability="fast",
                key_file=str(keys) if self.sealed else None, clock=self.clock,
            ),
            model_id="property",
        )
        self.cache = RadixCache(CacheConfig(spec=SPEC, device_pages=16, tiers=tiers,
                                            quotas=None if self.quotas is None else dict(self.quotas)),  # type: ignore[arg-type]
                                clock=self.clock)
        t = self.cache.tiers
        assert isinstance(t, HostTiers) and self.cache.kv is not None
        t.controller.copy.close()
        self.engine = ManualCopyEngine(self.cache.kv, t.host.buffer)
        t.controller.copy = self.engine  # type: ignore[assignment]
        self.storage = ManualStorage(t.controller.storage)
        t.controller.storage = self.storage  # type: ignore[assignment]
        self.tiers = t
        self.meta.clear()

    def _close(self) -> None:
        self.engine.close()
        self.cache.drain()
        self.cache.check_integrity()
        self.cache.close()

    def _step(self) -> None:
        STEPS[0] += 1

    # -------------------------------------------------------------- the runner
    def _expected(self, req: Request, start: int, end: int) -> torch.Tensor:
        ns, inc = self.meta[req.rid]
        toks = req.tokens
        return torch.tensor([kv_value(ns, inc, toks[: pos + 1]) for pos in range(start, end)])

    def _write(self, req: Request, n: int) -> None:
        """Reserve (checking the no-spurious-failure rule), write, commit."""
        need = -(-(req.num_computed + n) // P) - req.num_pages
        cover = self.cache.pool.free_count + self.cache.tree.evictable_pages
        try:
            self.cache.reserve(req, n)
        except OutOfPagesError as err:
            assert need > cover, f"{err} although {cover} pages were free or evictable"
            return
        self._put_kv(req, n)
        self.cache.commit(req, n)

    def _put_kv(self, req: Request, n: int) -> None:
        """The runner's KV for the next ``n`` positions of ``req`` (reserved)."""
        kv = self.cache.kv
        assert kv is not None
        start = req.num_computed
        slots = kv.slots(req.page_table, start, n)
        vals = self._expected(req, start, start + n)
        for layer in range(SPEC.num_layers):
            k, v = kv.layer_slots(layer)
            k[slots] = (vals + layer).view(-1, 1, 1)
            v[slots] = (-vals - layer).view(-1, 1, 1)

    def _check_kv(self, req: Request) -> None:
        kv = self.cache.kv
        assert kv is not None
        n = req.num_computed
        if n == 0:
            return
        slots = kv.slots(req.page_table, 0, n)
        want = self._expected(req, 0, n)
        for layer in range(SPEC.num_layers):
            k, v = kv.layer_slots(layer)
            got_k, got_v = k[slots].reshape(n, -1), v[slots].reshape(n, -1)
            assert torch.equal(got_k, (want + layer)[:, None].expand_as(got_k)), (
                f"{req!r}: wrong K in layer {layer}"
            )
            assert torch.equal(got_v, (-want - layer)[:, None].expand_as(got_v))

    def _tokens(self, ns: int, body: list[int], pick: int) -> np.ndarray:
        nodes = [n for n in self.cache.tree.nodes() if n.namespace == NAMESPACES[ns]]
        old = self.prompts[ns]
        if old and pick % 2 == 0:
            body = old[pick % len(old)] + body[:2]
        elif nodes and pick % 3:
            body = path_tokens(nodes[pick % len(nodes)]) + body[:4]
        return np.asarray(body, dtype=np.int32)

    def _admit(self, ns: int, tokens: np.ndarray) -> Request:
        self.prompts[ns] = (self.prompts[ns] + [tokens.tolist()])[-6:]
        req = self.cache.admit(tokens, NAMESPACES[ns])
        self.meta[req.rid] = (ns, self.forgets[ns])
        if req.pending:
            event("admitted with a load or fetch in flight")
        return req

    # -------------------------------------------------------------- rules
    @rule(
        write=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
        prefetch=st.sampled_from(["wait_complete", "best_effort"]),
    )
    def switch_policies(self, write: str, prefetch: str) -> None:
        self._step()
        self.tiers.write = (
            make_write_policy(write, threshold=2)
            if write == "write_through_selective"
            else make_write_policy(write)
        )
        self.tiers.prefetch = make_prefetch_policy(prefetch)

    @rule(target=requests, ns=st.integers(0, 2), body=st.lists(st.integers(0, 2), min_size=1,
          max_size=18), pick=st.integers(0, 99))
    def admit(self, ns: int, body: list[int], pick: int) -> Request:
        self._step()
        return self._admit(ns, self._tokens(ns, body, pick))

    @rule(ns=st.integers(0, 2), body=st.lists(st.integers(0, 2), min_size=1, max_size=14),
          pick=st.integers(0, 99))
    def serve(self, ns: int, body: list[int], pick: int) -> None:
        """A whole request: admit (often a cached prefix), resolve, compute, release."""
        self._step()
        req = self._admit(ns, self._tokens(ns, body, pick))
        self._write(req, 0)
        self._check_kv(req)
        self._write(req, req.num_tokens - req.num_computed)
        self._check_kv(req)
        self.cache.release(req)

    @rule(req=requests, n=st.integers(0, 8))
    def compute(self, req: Request, n: int) -> None:
        self._step()
        if req.released:
            return
        self._write(req, min(n, req.num_tokens - req.num_computed))

    @rule(req=requests, extra=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def extend(self, req: Request, extra: list[int]) -> None:
        self._step()
        if not req.released:
            self.cache.extend(req, extra)

    @rule(req=consumes(requests))
    def release(self, req: Request) -> None:
        self._step()
        if not req.released:
            self.cache.release(req)

    @rule(n=st.integers(1, 6))
    def evict(self, n: int) -> None:
        self._step()
        self.cache.evict(n)

    @rule(ns=st.integers(0, 2))
    def forget(self, ns: int) -> None:
        self._step()
        self.cache.forget_namespace(NAMESPACES[ns])
        self.forgets[ns] += 1
        event("forget")

    @rule(pick=st.integers(0, 99))
    def reset(self, pick: int) -> None:
        self._step()
        if pick < 10:  # rarely: it ends every live request
            self.cache.reset(force=True)
            event("reset")

    @rule(pick=st.integers(0, 99), fail=st.booleans())
    def finish_a_copy(self, pick: int, fail: bool) -> None:
        self._step()
        if self.engine.pending:
            _, _, ticket = self.engine.pending[pick % len(self.engine.pending)]
            self.engine.complete(ticket, fail=fail and pick % 4 == 0)

    @rule(pick=st.integers(0, 99), mode=st.sampled_from(["ok", "ok", "fail", "short"]))
    def finish_a_storage_op(self, pick: int, mode: str) -> None:
        self._step()
        if self.storage.pending:
            kind, _, ticket = self.storage.pending[pick % len(self.storage.pending)]
            self.storage.complete(ticket, mode, short=pick % 3)
            event(f"storage {kind} {mode}")

    @rule()
    def restart(self) -> None:
        """Every request ends; a new cache opens the same store."""
        self._step()
        for req in self.cache.live_requests:
            self.cache.release(req)
        self._close()
        self._open()
        event("restart")

    @rule()
    def poll(self) -> None:
        self._step()
        self.cache.poll()

    # -------------------------------------------------------------- checks
    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()

    @invariant()
    def kv_is_right(self) -> None:
        for req in self.cache.live_requests:
            if req.ready:
                self._check_kv(req)

    def teardown(self) -> None:
        c = self.tiers.counters
        if c.loaded_tokens:
            event("some load-back completed for its request")
        if c.storage_hit_tokens:
            event("some prompt was found in storage")
        if c.abandoned_tokens:
            event("some load was abandoned, failed or short")
        if self.storage.stats().evicted:
            event("storage evicted records")
        self._close()
        self._dir.cleanup()
        steps_file = os.environ.get("RADIXCACHE_TIER_STEPS_FILE")
        if steps_file:
            Path(steps_file).write_text(f"{STEPS[0]}\n")


LONG = os.environ.get("RADIXCACHE_TIER_PROFILE") == "long"
TieredMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RADIXCACHE_TIER_EXAMPLES", 20_000 if LONG else 300)),
    stateful_step_count=100 if LONG else 50,
    deadline=None,
    database=None,
    print_blob=True,  # a failure prints @reproduce_failure(...): rerun exactly that example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestTieredMachine = TieredMachine.TestCase


class SealedTieredMachine(TieredMachine):
    """The same machine on a store encrypted at rest (tenants' keys, sealed
    records): the same invariants, the KV served checked the same way."""

    sealed = True


SealedTieredMachine.TestCase.settings = settings(
    TieredMachine.TestCase.settings,
    max_examples=int(os.environ.get("RADIXCACHE_TIER_EXAMPLES", 20_000 if LONG else 60)),
)
TestSealedTieredMachine = SealedTieredMachine.TestCase

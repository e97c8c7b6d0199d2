"""Random admit/reserve/extend/commit/release/evict/forget sequences.

Checked after every step against a plain reference model (a set of cached
page prefixes per namespace) and ``check_integrity()``. The "runner" writes,
for every position, a KV value derived from the whole token prefix, so any
page served for the wrong prefix shows up as a wrong value.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from radixcache import CacheConfig, KVSpec, Namespace, OutOfPagesError, RadixCache, Request

P = 4
POOL = 24
NAMESPACES = [Namespace(), Namespace(salt="t1"), Namespace(lora_id=2)]
Prefix = tuple[int, tuple[int, ...]]  # (namespace index, tokens up to the end of a page)


def kv_value(ns: int, prefix: np.ndarray) -> float:
    """What a deterministic model would write for the last token of ``prefix``."""
    return float(zlib.crc32(bytes([ns]) + prefix.astype("<i4").tobytes()) % 100_003)


class CacheMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float64, page_size=P)
        self.cache = RadixCache(CacheConfig(spec=spec, device_pages=POOL))
        self.ref: set[Prefix] = set()  # reference model: cached page prefixes
        self.ns_of: dict[int, int] = {}  # rid -> namespace index
        self.stale: set[int] = set()  # rids whose cached prefix was forgotten: nothing more is cached

    # -------------------------------------------------------------- helpers
    def tree_prefixes(self) -> set[Prefix]:
        out: set[Prefix] = set()
        for node in self.cache.tree.nodes():
            if not self.cache.tree.below.is_attached(node):
                continue  # a forgotten namespace's page still held: never matched
            parts = []
            n = node
            while n.parent is not None:
                parts.append(n.key)
                n = n.parent
            full = np.concatenate(parts[::-1])
            base = full.size - node.key.size
            ns = NAMESPACES.index(node.namespace)
            for end in range(base + P, full.size + 1, P):
                out.add((ns, tuple(full[:end].tolist())))
        return out

    def locked_prefixes(self) -> set[Prefix]:
        out: set[Prefix] = set()
        for req in self.cache.live_requests:
            if req.rid in self.stale:
                continue  # it holds forgotten pages: the same prefix cached again is not its own
            ns = self.ns_of[req.rid]
            toks = req.tokens
            for end in range(P, req.shared_pages * P + 1, P):
                out.add((ns, tuple(toks[:end].tolist())))
        return out

    def sync_evictions(self) -> None:
        now = self.tree_prefixes()
        assert now <= self.ref, f"pages appeared from nowhere: {sorted(now - self.ref)[:3]}"
        gone = self.ref - now
        assert not (gone & self.locked_prefixes()), "a locked page was evicted"
        self.ref = now

    def write_kv(self, req: Request, n: int) -> None:
        """The runner's KV for the next ``n`` positions of ``req`` (reserved)."""
        kv = self.cache.kv
        assert kv is not None
        ns, toks, start = self.ns_of[req.rid], req.tokens, req.num_computed
        slots = kv.slots(req.page_table, start, n)
        values = [kv_value(ns, toks[: pos + 1]) for pos in range(start, start + n)]
        k_flat, _ = kv.layer_slots(0)
        k_flat[slots] = torch.tensor(values, dtype=torch.float64).view(-1, 1, 1)

    # -------------------------------------------------------------- rules
    @rule(
        target=requests,
        ns=st.integers(0, len(NAMESPACES) - 1),
        body=st.lists(st.integers(0, 2), min_size=1, max_size=22),
        reuse=st.sampled_from(["none", "cached", "live"]),
    )
    def admit(self, ns: int, body: list[int], reuse: str) -> Request:
        live = self.cache.live_requests
        if reuse == "cached" and self.ref:
            ns, prefix = sorted(self.ref)[len(body) % len(self.ref)]
            body = list(prefix) + body[:5]
        elif reuse == "live" and live:
            other = live[len(body) % len(live)]  # same tokens as a request in flight
            ns = self.ns_of[other.rid]
            body = other.tokens.tolist()[: 4 + len(body)]
        tokens = np.asarray(body, dtype=np.int32)
        usable = (tokens.size - 1) // P
        expect = 0
        while expect < usable and (ns, tuple(body[: (expect + 1) * P])) in self.ref:
            expect += 1
        req = self.cache.admit(tokens, NAMESPACES[ns])
        assert req.cached_len == expect * P, (req.cached_len, expect)
        self.ns_of[req.rid] = ns
        return req

    @rule(req=requests, n=st.integers(0, 9))
    def reserve_and_commit(self, req: Request, n: int) -> None:
        if req.released:
            return
        n = min(n, req.num_tokens - req.num_computed)
        free_before = self.cache.pool.free_count + self.cache.tree.evictable_pages
        try:
            self.cache.reserve(req, n)
        except OutOfPagesError as err:
            assert err.requested > free_before - 0 or err.evictable == 0
            assert err.free < err.requested
            self.sync_evictions()
            return
        self.sync_evictions()
        self.write_kv(req, n)
        self.cache.commit(req, n)
        ns, toks = self.ns_of[req.rid], req.tokens
        full = req.num_computed // P
        if req.rid in self.stale:
            return
        for end in range(P, full * P + 1, P):
            self.ref.add((ns, tuple(toks[:end].tolist())))

    @rule(req=requests, extra=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def extend(self, req: Request, extra: list[int]) -> None:
        if not req.released:
            self.cache.extend(req, extra)

    @rule(req=consumes(requests))
    def release(self, req: Request) -> None:
        if req.released:
            return
        self.cache.release(req)
        self.sync_evictions()  # a forgotten namespace's pages may go now

    @rule(n=st.integers(1, 8))
    def evict(self, n: int) -> None:
        evictable = self.cache.tree.evictable_pages
        freed = self.cache.evict(n)
        assert freed >= min(n, evictable)
        self.sync_evictions()

    @precondition(lambda self: bool(self.ref))
    @rule(ns=st.integers(0, len(NAMESPACES) - 1))
    def forget(self, ns: int) -> None:
        self.cache.forget_namespace(NAMESPACES[ns])
        self.stale |= {r.rid for r in self.cache.live_requests if self.ns_of[r.rid] == ns}
        self.ref = {p for p in self.ref if p[0] != ns}  # nothing of it is served any more
        assert self.tree_prefixes() == self.ref

    # -------------------------------------------------------------- checks
    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()
        assert self.tree_prefixes() == self.ref

    @invariant()
    def pages_hold_the_right_kv(self) -> None:
        kv = self.cache.kv
        assert kv is not None
        k_flat, _ = kv.layer_slots(0)
        for req in self.cache.live_requests:
            n = req.num_computed
            if n == 0:
                continue
            ns = self.ns_of[req.rid]
            toks = req.tokens
            got = k_flat[kv.slots(req.page_table, 0, n)].view(-1).tolist()
            want = [kv_value(ns, toks[: pos + 1]) for pos in range(n)]
            assert got == want, f"request {req.rid} reads KV of another prefix"


CacheMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCacheMachine = CacheMachine.TestCase


def test_a_forgotten_prefix_cached_again_is_not_the_stale_holders() -> None:
    """A case the machine found: a request holds a forgotten namespace's
    page, another caches the same prefix again and releases it; that new
    page is unlocked and may be evicted (the old one stays held)."""
    state = CacheMachine()
    holder = state.admit(body=[0], ns=1, reuse="none")
    state.extend(extra=[0, 0, 0], req=holder)
    state.reserve_and_commit(n=4, req=holder)
    state.forget(ns=1)
    again = state.admit(body=[0], ns=0, reuse="live")  # the holder's tokens, in namespace 1
    assert state.ns_of[again.rid] == 1 and again.cached_len == 0
    state.reserve_and_commit(n=4, req=again)
    state.release(req=again)
    state.integrity()
    assert state.cache.evict(1) == 1  # the page cached again: the holder's stays
    state.sync_evictions()
    state.pages_hold_the_right_kv()
    assert not holder.released and holder.shared_pages == 1
    state.teardown()

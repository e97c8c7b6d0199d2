"""Random cache operations with tier copies finishing, or failing, in random
order; ``check_integrity()`` and a KV-content check after every step."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from radixcache import Node, OutOfPagesError, Request
from radixcache.tiers import HostTiers
from tests.radixcache.tierkit import P, assert_kv_correct, compute, make_tiered
from radixcache.transfer import DeviceKVBuffer, FutureTicket
from radixcache.transfer.convert import PagePairs, copy_device_to_host, copy_host_to_device
from radixcache.transfer.host import HostKVBuffer


def path_tokens(node: Node) -> list[int]:
    """All tokens from the root down to the end of ``node``."""
    parts = []
    n: Node | None = node
    while n is not None and n.parent is not None:
        parts.append(n.key)
        n = n.parent
    return np.concatenate(parts[::-1]).tolist()


class ManualTicket(FutureTicket):
    """Done only when the test (or a waiting caller) completes it."""

    __slots__ = ("engine",)

    def __init__(self, engine: ManualCopyEngine) -> None:
        super().__init__()
        self.engine = engine

    def wait(self, timeout: float | None = None) -> bool:
        if not self.done():
            self.engine.complete(self)
        return True


class ManualCopyEngine:
    def __init__(self, device: DeviceKVBuffer, host: HostKVBuffer) -> None:
        self.device, self.host = device, host
        self.pending: list[tuple[str, PagePairs, ManualTicket]] = []
        self.fail_next = False

    def _submit(self, kind: str, src: np.ndarray, dst: np.ndarray) -> ManualTicket:
        ticket = ManualTicket(self)
        pairs = PagePairs(np.asarray(src, np.int64), np.asarray(dst, np.int64))
        self.pending.append((kind, pairs, ticket))
        return ticket

    def device_to_host(self, device_pages: np.ndarray, host_pages: np.ndarray) -> ManualTicket:
        return self._submit("d2h", device_pages, host_pages)

    def host_to_device(self, host_pages: np.ndarray, device_pages: np.ndarray) -> ManualTicket:
        return self._submit("h2d", host_pages, device_pages)

    def complete(self, ticket: ManualTicket, fail: bool = False) -> None:
        for i, (kind, pairs, t) in enumerate(self.pending):
            if t is ticket:
                del self.pending[i]
                if fail:
                    t.fail(RuntimeError("injected copy failure"))
                elif kind == "d2h":
                    copy_device_to_host(self.device, self.host, pairs)
                    t.finish()
                else:
                    copy_host_to_device(self.host, self.device, pairs)
                    t.finish()
                return

    def close(self) -> None:
        while self.pending:
            self.complete(self.pending[0][2])


class TieredMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.cache = make_tiered(device_pages=16, host_pages=8, write_policy="write_through")
        tiers = self.cache.tiers
        assert isinstance(tiers, HostTiers) and self.cache.kv is not None
        tiers.controller.copy.close()
        self.engine = ManualCopyEngine(self.cache.kv, tiers.host.buffer)
        tiers.controller.copy = self.engine  # type: ignore[assignment]
        self.tiers = tiers

    @rule(
        policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
        prefetch=st.sampled_from(["wait_complete", "best_effort"]),
    )
    def switch_policies(self, policy: str, prefetch: str) -> None:
        from radixcache.offload.policy import make_prefetch_policy, make_write_policy

        self.tiers.write = (
            make_write_policy(policy, threshold=2)
            if policy == "write_through_selective"
            else make_write_policy(policy)
        )
        self.tiers.prefetch = make_prefetch_policy(prefetch)

    @rule(target=requests, body=st.lists(st.integers(0, 2), min_size=1, max_size=18),
          reuse=st.booleans())
    def admit(self, body: list[int], reuse: bool) -> Request:
        nodes = list(self.cache.tree.nodes())
        if reuse and nodes:
            body = path_tokens(nodes[len(body) % len(nodes)]) + body[:3]
        req = self.cache.admit(np.asarray(body, dtype=np.int32))
        if req.pending:
            event("admitted with a load-back in flight")
        return req

    @rule(body=st.lists(st.integers(0, 2), min_size=1, max_size=14), pick=st.integers(0, 99))
    def serve(self, body: list[int], pick: int) -> None:
        """A whole request: admit (often a cached prefix), resolve, compute, release."""
        nodes = list(self.cache.tree.nodes())
        if nodes and pick % 3:
            body = path_tokens(nodes[pick % len(nodes)]) + body[:4]
        req = self.cache.admit(np.asarray(body, dtype=np.int32))
        if req.pending:
            event("served with a load-back in flight")
        try:
            self.cache.reserve(req, 0)
            assert_kv_correct(self.cache, req)
            compute(self.cache, req, req.num_tokens - req.num_computed)
            assert_kv_correct(self.cache, req)
        except OutOfPagesError:
            pass
        self.cache.release(req)

    @rule(req=requests, n=st.integers(0, 8))
    def compute(self, req: Request, n: int) -> None:
        if req.released:
            return
        try:
            self.cache.reserve(req, 0)  # resolves pending loads first
            n = min(n, req.num_tokens - req.num_computed)
            compute(self.cache, req, n)
        except OutOfPagesError:
            pass

    @rule(req=consumes(requests))
    def release(self, req: Request) -> None:
        if not req.released:
            self.cache.release(req)

    @rule(n=st.integers(1, 6))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(pick=st.integers(0, 50), fail=st.booleans())
    def finish_a_copy(self, pick: int, fail: bool) -> None:
        if self.engine.pending:
            _, _, ticket = self.engine.pending[pick % len(self.engine.pending)]
            self.engine.complete(ticket, fail=fail and pick % 4 == 0)

    @rule()
    def poll(self) -> None:
        self.cache.poll()

    def teardown_stats(self) -> None:
        c = self.tiers.counters
        if c.loaded_tokens:
            event("some load-back completed for its request")
        if c.abandoned_tokens:
            event("some load was abandoned or failed")
        if c.host_evicted_pages:
            event("host eviction happened")

    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()

    @invariant()
    def kv_is_right(self) -> None:
        for req in self.cache.live_requests:
            if req.ready:
                assert_kv_correct(self.cache, req)

    def teardown(self) -> None:
        self.teardown_stats()
        self.engine.close()
        self.cache.poll()
        self.cache.check_integrity()
        self.cache.close()


TieredMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestTieredMachine = TieredMachine.TestCase
assert P == 4

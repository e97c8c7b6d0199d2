"""The tiered quota machine (tests/radixcache/tenants/test_tier_quota_property.py:
device, host and a tiny LMDB store, every copy, read and write held until a
rule finishes, fails or shortens it, restarts, forgets, resets, KV checked
bit-exact, device and host limits and floors checked after every step, quota
changes at run time) run with retention and tags as well: both tenants have a
TTL under a fake clock that rules move forward (the cache's and the store's),
every namespace is admitted with tags, and a rule invalidates a tag. After every admission: no page it was served (device,
host or storage) was last computed longer ago than its tenant's TTL. An
invalidation counts as a forget of every namespace carrying the tag (the KV
of a position depends on the namespace's incarnation), so a page served from
before an invalidation is wrong KV, caught by the machine's KV check.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from radixcache import Namespace, Request
from radixcache.tenants import TenantQuota
from tests.radixcache.tenants.test_tier_quota_property import START, QuotaTieredMachine
from tests.radixcache.tiers.test_tiers_property import NAMESPACES, P

# The machine's namespaces, as its requests carry them: tags are not part of a
# namespace's identity, so these equal NAMESPACES one for one.
TAGS = [("all", "default"), ("all", "tenant-b"), ("all", "lora")]
TAGGED = [Namespace(ns.salt, ns.lora_id, ns.lora_name, ns.extra_keys, tags)
          for ns, tags in zip(NAMESPACES, TAGS)]
TTL = {None: 7.0, "tenant-b": 3.0}  # by salt; the lora namespace is the default tenant's


class FakeClock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


class RetentionMachine(QuotaTieredMachine):
    quotas = {salt: replace(START[salt], ttl_s=ttl) for salt, ttl in TTL.items()}  # type: ignore[assignment]

    def __init__(self) -> None:
        self.fake = FakeClock()
        # (namespace, incarnation, tokens up to the end of a page) -> when it was last computed
        self.computed: dict[tuple[int, int, bytes], float] = {}
        super().__init__()

    def _open(self) -> None:
        self.clock = self.fake
        super()._open()
        set_quota = self.cache.tenants.set_quota

        def keeping_the_ttl(salt: str | None, quota: TenantQuota | None) -> int:
            """The quota rule's changes, each tenant's TTL kept (what is checked)."""
            return set_quota(salt, None if quota is None else replace(quota, ttl_s=TTL[salt]))

        self.cache.tenants.set_quota = keeping_the_ttl  # type: ignore[method-assign]

    def held(self) -> dict[tuple[str, object], int]:
        """Pages per tier and tenant, after what is due now expired (what the
        next admit or poll would remove first): expiry is nobody's pressure,
        so the floor and quota-change checks look at what is left."""
        assert self.cache._retention is not None
        self.cache._retention.expire()
        return super().held()

    def _admit(self, ns: int, tokens: np.ndarray) -> Request:
        self.prompts[ns] = (self.prompts[ns] + [tokens.tolist()])[-6:]
        req = self.cache.admit(tokens, TAGGED[ns])
        self.meta[req.rid] = (ns, self.forgets[ns])
        ttl = TTL[NAMESPACES[ns].salt]  # type: ignore[index]
        now = self.fake.now
        for end in range(P, req.cached_len + 1, P):
            key = (ns, self.forgets[ns], tokens[:end].tobytes())
            when = self.computed.get(key)
            assert when is not None, f"served page ending at {end} was never computed"
            assert now - when < ttl, (
                f"namespace {ns}: the page ending at {end} was served {now - when:.1f} s "
                f"after it was last computed; its TTL is {ttl} s"
            )
        if req.cached_len:
            event("served a page under a TTL")
        return req

    def _put_kv(self, req: Request, n: int) -> None:
        super()._put_kv(req, n)
        ns, inc = self.meta[req.rid]
        start, end = req.num_computed, req.num_computed + n
        tokens = req.tokens
        for page_end in range((start // P + 1) * P, end + 1, P):
            self.computed[ns, inc, tokens[:page_end].tobytes()] = self.fake.now

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
    def advance(self, dt: float) -> None:
        self._step()
        self.fake.now += dt

    @rule(tag=st.sampled_from(["all", "default", "tenant-b", "lora", "unused"]))
    def invalidate(self, tag: str) -> None:
        self._step()
        self.cache.invalidate(tag)
        for i, tags in enumerate(TAGS):
            if tag in tags:
                self.forgets[i] += 1
        event(f"invalidate {tag}")


RetentionMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RADIXCACHE_TIER_EXAMPLES", 120)),
    stateful_step_count=50,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRetentionMachine = RetentionMachine.TestCase

"""Random puts with and without deadlines and tags, reads, clock advances,
invalidations, forgets, sweeps and restarts on one LMDB store, checked
against a model of what it must serve and what it must announce removed."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixcache.offload import LmdbStorage
from radixcache.offload.storage import PutMeta
from tests.offload.lmdb.test_lmdb_retention import T0, FakeClock
from tests.offload.storekit import StoreKit

NAMESPACES = (b"ns-0", b"ns-1", b"ns-2")
TAGS = ("t0", "t1", "t2")
PAGES = 3  # page keys per namespace


def page_key(ns: bytes, i: int) -> bytes:
    return StoreKit.keys(i + 1, ns)[i]


class RetentionMachine(RuleBasedStateMachine):
    """Model: page key -> (namespace, deadline or None); namespace -> tags."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="rx-retention-"))
        self.kit = StoreKit(self.root)
        self.clock = FakeClock()
        self.store = self._open()
        self.records: dict[bytes, tuple[bytes, float | None]] = {}
        self.tags: dict[bytes, set[str]] = {}

    def _open(self) -> LmdbStorage:
        return self.kit.open(clock=self.clock)

    def _live(self, key: bytes) -> bool:
        deadline = self.records[key][1]
        return deadline is None or deadline > self.clock.now

    def _sweep_model(self) -> set[bytes]:
        """What the next write step's sweep removes (the model's expired records)."""
        expired = {k for k in self.records if not self._live(k)}
        for key in expired:
            del self.records[key]
        return expired

    def _removed(self, expected: set[bytes]) -> None:
        self.kit.barrier(self.store)  # every removal of the steps before is filed
        assert sorted(self.store.take_removed()) == sorted(expected)

    def _drop(self, namespaces: set[bytes]) -> set[bytes]:
        gone = {k for k, (ns, _d) in self.records.items() if ns in namespaces}
        for key in gone:
            del self.records[key]
        for ns in namespaces:
            self.tags.pop(ns, None)
        return gone

    @rule(
        ns=st.sampled_from(NAMESPACES),
        first=st.integers(0, PAGES - 1),
        n=st.integers(1, PAGES),
        ttl=st.one_of(st.none(), st.sampled_from([-1.0, 1.0, 5.0, 30.0])),
        tags=st.sets(st.sampled_from(TAGS), max_size=2),
    )
    def put(self, ns: bytes, first: int, n: int, ttl: float | None, tags: set[str]) -> None:
        keys = [page_key(ns, i) for i in range(first, min(PAGES, first + n))]
        deadline = None if ttl is None else self.clock.now + ttl
        meta = PutMeta(list(range(len(keys))), None, first, expires_at=deadline,
                       tags=tuple(sorted(tags)))
        ticket = self.store.put(keys, self.kit.tokens(len(keys), first), self.kit.host(len(keys)),
                                np.arange(len(keys), dtype=np.int32), ns, meta=meta)
        stored = self.kit.done(ticket)
        swept = self._sweep_model()
        if deadline is not None and deadline <= self.clock.now:
            assert stored == 0  # lapsed: nothing written, no tag listed
        else:
            assert stored == len(keys)
            for key in keys:
                self.records.setdefault(key, (ns, deadline))  # a stored record keeps its own
            if tags:
                self.tags.setdefault(ns, set()).update(tags)
        self._removed(swept)

    @rule(ns=st.sampled_from(NAMESPACES))
    def read(self, ns: bytes) -> None:
        """A get serves the leading live pages (an expired one is a miss that
        asks for a sweep, which the writer runs after the get)."""
        keys = [page_key(ns, i) for i in range(PAGES)]
        served = self.kit.done(self.store.get(
            keys, self.kit.tokens(PAGES), self.kit.host(PAGES, seed=1),
            np.arange(PAGES, dtype=np.int32)))
        expected = 0
        while expected < PAGES and keys[expected] in self.records and self._live(keys[expected]):
            expected += 1
        assert served == expected
        if expected < PAGES and keys[expected] in self.records:  # met an expired record
            self._removed(self._sweep_model())  # the sweep it asked for ran

    @rule(dt=st.sampled_from([0.5, 2.0, 10.0, 40.0]))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule(tag=st.sampled_from(TAGS))
    def invalidate(self, tag: str) -> None:
        result = self.kit.done(self.store.invalidate_tag(tag))
        swept = self._sweep_model()
        gone = self._drop({ns for ns, tags in self.tags.items() if tag in tags})
        assert result == len(gone)
        self._removed(swept | gone)

    @rule(ns=st.sampled_from(NAMESPACES))
    def forget(self, ns: bytes) -> None:
        result = self.kit.done(self.store.forget_namespace(ns))
        swept = self._sweep_model()
        gone = self._drop({ns})
        assert result == len(gone)
        self._removed(swept | gone)

    @rule()
    def sweep(self) -> None:
        result = self.kit.done(self.store.sweep_expired())
        swept = self._sweep_model()
        assert result == len(swept)
        self._removed(swept)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()

    @invariant()
    def serves_exactly_the_live_records(self) -> None:
        for ns in NAMESPACES:
            for i in range(PAGES):
                key = page_key(ns, i)
                expected = key in self.records and self._live(key)
                assert self.store.longest_prefix([key]) == int(expected), (ns, i)
        self.store.check_integrity()

    def teardown(self) -> None:
        self.kit.close_all()
        shutil.rmtree(self.root, ignore_errors=True)


RetentionMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRetentionMachine = RetentionMachine.TestCase

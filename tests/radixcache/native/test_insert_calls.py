"""The calls an insert makes in C (radixcache/native/insert.pxi: ``_attach``,
radixcache/native/victims.pxi: ``_record_stored``) against the methods they
stand for: a ``RadixTree`` and an ``EventRecorder`` get those methods'
bodies without a method call, any subclass keeps its own methods, and both
ways leave the same tree, ledger counts and event records."""

from __future__ import annotations

from typing import Any

import numpy as np

from radixcache.namespace import Namespace
from radixcache.recorder import EventRecorder
from radixcache.tenants import QuotaBook
from radixcache.tenants.ledger import TenantLedger
from radixcache.tree import policies
from radixcache.tree.radix_tree import RadixTree

P = 4
TENANTS = [Namespace(), Namespace(salt="s1", extra_keys=("img-1",)), Namespace(lora_id=7, lora_name="ad")]


class MethodTree(RadixTree):
    """A subclass: the insert calls its ``attach_pages`` as a method."""

    calls = 0

    def attach_pages(self, node: Any, pages: Any) -> None:
        MethodTree.calls += 1
        super().attach_pages(node, pages)


class MethodRecorder(EventRecorder):
    """A subclass: the insert calls its ``stored`` as a method."""

    calls = 0

    def stored(self, node: Any, start: int, count: int, medium: str) -> None:
        MethodRecorder.calls += 1
        super().stored(node, start, count, medium)


def _tree(kind: type[RadixTree], recorder: type[EventRecorder], quotas: bool) -> RadixTree:
    tree = kind(P, policies.make_eviction_policy("lru"))
    tree.recorder = recorder(tree)
    tree.ledger = TenantLedger(QuotaBook() if quotas else None)
    return tree


def _workload(tree: RadixTree, rng: np.random.Generator) -> list[Any]:
    """Inserts that make new leaves, extend leaves in place, split nodes and
    share prefixes, in three namespaces; every event, and the ledger's counts."""
    events: list[Any] = []
    next_page = 0
    prompts: list[tuple[Namespace, np.ndarray]] = []
    for step in range(40):
        ns = TENANTS[int(rng.integers(len(TENANTS)))]
        if prompts and rng.random() < 0.6:
            old_ns, old = prompts[int(rng.integers(len(prompts)))]
            ns = old_ns
            keep = int(rng.integers(0, old.size // P + 1)) * P
            tokens = np.concatenate([old[:keep], rng.integers(0, 5, P * int(rng.integers(1, 4)), dtype=np.int32)])
        else:
            tokens = rng.integers(0, 5, P * int(rng.integers(1, 5)), dtype=np.int32)
        pages = np.arange(next_page, next_page + tokens.size // P, dtype=np.int32)
        next_page += pages.size
        result = tree.insert(ns, tokens, pages)
        prompts.append((ns, tokens))
        events.append((result.existing_pages, result.inserted_pages))
        if step % 5 == 4:
            events += [(type(e).__name__, e.medium, list(e.block_hashes), e.parent_block_hash,
                        list(np.asarray(e.token_ids)), e.block_size, e.cache_salt, e.lora_id, e.lora_name,
                        e.extra_keys)
                       for e in tree.recorder.take()]  # type: ignore[attr-defined]
    ledger = tree.ledger
    assert ledger is not None
    tree.check_integrity()
    return events + [dict(ledger.device), dict(ledger.evictable), tree.node_count]


def test_subclasses_keep_their_own_methods() -> None:
    MethodTree.calls = MethodRecorder.calls = 0
    tree = _tree(MethodTree, MethodRecorder, quotas=False)
    tree.insert(Namespace(), np.arange(8, dtype=np.int32), np.arange(2, dtype=np.int32))
    tree.insert(Namespace(), np.arange(12, dtype=np.int32) * 2, np.arange(2, 5, dtype=np.int32))
    assert MethodTree.calls == 2 and MethodRecorder.calls == 2
    plain = _tree(RadixTree, EventRecorder, quotas=False)
    plain.insert(Namespace(), np.arange(8, dtype=np.int32), np.arange(2, dtype=np.int32))
    assert MethodTree.calls == 2 and MethodRecorder.calls == 2  # (the plain tree calls neither)
    assert plain.device_pages == 2 and plain.evictable_pages == 2


def test_both_ways_leave_the_same_tree_counts_and_records() -> None:
    for seed in range(6):
        for quotas in (False, True):
            sides = [_workload(_tree(kind, recorder, quotas), np.random.default_rng(seed))
                     for kind, recorder in ((RadixTree, EventRecorder), (MethodTree, MethodRecorder))]
            assert sides[0] == sides[1], (seed, quotas)
            stores = [x for x in sides[0] if isinstance(x, tuple) and len(x) == 10]
            assert any(x[9] is not None for x in stores) and any(x[7] == 7 for x in stores)

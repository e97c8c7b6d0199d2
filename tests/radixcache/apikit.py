"""Helpers for the fuzzer of the public API (test_api_fuzz.py): what each
call may raise, a snapshot of everything a call may change, the KV a
deterministic model writes, and token containers of every kind.

The snapshot reads the cache's parts directly (never through a public call
and never through the storage wrapper, which may be failing on purpose), so
taking it changes nothing and works on a closed cache too."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixcache import CacheClosedError, OutOfPagesError, RadixCache, Request, RequestStateError
from radixcache.events.types import BlockRemoved, BlockStored
from radixcache.stats import CacheStats, snapshot as stats_snapshot

# What each public call may raise besides CacheClosedError (the docstrings' lists).
DOCUMENTED: dict[str, tuple[type[BaseException], ...]] = {
    "admit": (TypeError, ValueError),
    "peek": (TypeError, ValueError),
    "reserve": (TypeError, ValueError, RequestStateError, OutOfPagesError),
    "extend": (TypeError, ValueError, RequestStateError),
    "commit": (TypeError, ValueError, RequestStateError),
    "release": (TypeError, RequestStateError),
    "evict": (ValueError,),
    "forget_namespace": (TypeError,),
    "reset": (TypeError, RequestStateError),
    "poll": (),
    "drain": (),
    "take_events": (),
    "stats": (),
    "tier_stats": (),
    "check_integrity": (),
    "close": (),
}


def _b(pages: np.ndarray | None) -> bytes | None:
    return None if pages is None else pages.tobytes()


@dataclass(frozen=True)
class Snapshot:
    """Everything a public call may change, read without changing anything."""

    stats: CacheStats
    nodes: tuple[Any, ...]  # per node: identity, tokens, residency, locks, holds, stamps
    requests: tuple[Any, ...]  # per live request: its whole state
    events: tuple[Any, ...]  # the events recorded and not taken
    device_pool: bytes  # allocated device page ids
    host_pool: bytes | None  # allocated host page ids
    tiers: tuple[Any, ...]  # tier counters, jobs, host pages, forgets owed
    busy: bool  # jobs in flight or stores deferred (what a short allocation may apply)
    cache_state: tuple[Any, ...]  # next request id, forgets, refusal, clock


def _event(e: object) -> tuple[Any, ...]:
    if isinstance(e, BlockStored):
        return ("S", tuple(e.block_hashes), e.parent_block_hash, e.medium, len(e.token_ids))
    if isinstance(e, BlockRemoved):
        return ("R", tuple(e.block_hashes), e.medium)
    return ("C",)


def take_snapshot(cache: RadixCache) -> Snapshot:
    tree = cache.tree
    nodes = tuple(
        sorted(
            (
                id(n), n.key.tobytes(), _b(n.device), _b(n.host), n.stored, n.lock_ref, n.holds,
                n.loading, n.last_access, n.hit_count, n.priority, n.forgotten, n.device_children,
            )
            for n in tree.nodes()
        )
    )
    requests = tuple(
        (
            r.rid, r.tokens.tobytes(), r.cached_len, r.num_computed, r.reserved_tokens,
            r.page_table.tobytes(), r.shared_pages, id(r.locked_node), r.released,
            tuple(id(j) for j in r.pending), r.hit_device, r.hit_host, r.hit_storage,
        )
        for r in cache._live.values()
    )
    events = tuple(_event(e) for e in getattr(cache._recorder, "_events", ()))
    t: Any = cache.tiers
    tiers: tuple[Any, ...] = ()
    host: bytes | None = None
    busy = False
    if hasattr(t, "controller"):
        c = t.controller.counters
        # (not the store's own counters: a deletion a forget still owes runs
        # on its writer thread and may land between two snapshots)
        tiers = (
            dataclasses.astuple(t.counters), dict(c.pages), dict(c.failed), t.controller.in_flight,
            len(t.jobs), t.index.host_pages, tuple(sorted(map(repr, t.forgets.owed))),
            tuple(id(n) for n in t._deferred_stores), len(getattr(t.controller.storage, "pending", ())),
        )
        host = t.host.allocated_ids().tobytes()
        busy = t.busy()
    stats = stats_snapshot(cache.counters, len(cache._live), cache.pool, tree)
    return Snapshot(
        stats, nodes, requests, events, cache.pool.allocated_ids().tobytes(), host, tiers, busy,
        (cache._next_rid, dict(cache._forgets), cache._refusal, tree.tick, tree.node_count),
    )


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """The fields of two snapshots that differ (for messages)."""
    return [f.name for f in dataclasses.fields(Snapshot) if getattr(before, f.name) != getattr(after, f.name)]


# ----------------------------------------------------------------- the model's KV


class ExpectedKV:
    """The KV a deterministic model writes at each position: a function of
    the whole prefix, the namespace and its incarnation (forgets before the
    request was admitted), so a page served for another prefix, tenant or a
    forgotten incarnation is caught. Values are cached per request and
    extended as it grows (crc32 chains: no rehash of the prefix)."""

    def __init__(self) -> None:
        self._vals: dict[int, tuple[list[float], list[int]]] = {}  # rid -> (values, crc states)

    def values(self, rid: int, ns: int, incarnation: int, tokens: np.ndarray, end: int) -> torch.Tensor:
        vals, crcs = self._vals.setdefault(rid, ([], []))
        if len(vals) < end:
            raw = tokens.astype("<i4").tobytes()
            crc = crcs[-1] if crcs else zlib.crc32(bytes([ns, incarnation % 256]))
            for pos in range(len(vals), end):
                crc = zlib.crc32(raw[4 * pos : 4 * pos + 4], crc)
                crcs.append(crc)
                vals.append(float(crc % 100_003))
        return torch.tensor(vals[:end])

    def forget(self, rid: int) -> None:
        self._vals.pop(rid, None)


def write_kv(cache: RadixCache, req: Request, start: int, vals: torch.Tensor) -> None:
    """Write ``vals`` (positions ``start`` on) as K, and -K as V, in every layer."""
    kv = cache.kv
    assert kv is not None
    slots = kv.slots(req.page_table, start, int(vals.numel()))
    for layer in range(cache.spec.num_layers):
        k, v = kv.layer_slots(layer)
        k[slots] = (vals + layer).view(-1, 1, 1)
        v[slots] = (-vals - layer).view(-1, 1, 1)


def kv_problem(cache: RadixCache, req: Request, want: torch.Tensor) -> str | None:
    """Why the KV of ``req``'s computed positions is not ``want``, or None."""
    kv = cache.kv
    assert kv is not None
    n = int(want.numel())
    if n == 0:
        return None
    slots = kv.slots(req.page_table, 0, n)
    for layer in range(cache.spec.num_layers):
        k, v = kv.layer_slots(layer)
        got_k = k[slots].reshape(n, -1)[:, 0]
        got_v = v[slots].reshape(n, -1)[:, 0]
        if not torch.equal(got_k, want + layer) or not torch.equal(got_v, -want - layer):
            bad = int(torch.nonzero(got_k != want + layer)[0]) if not torch.equal(got_k, want + layer) else -1
            return f"{req!r}: wrong KV in layer {layer} (first wrong position {bad})"
    return None


# ----------------------------------------------------------------- token containers

# name -> tokens as that container (holding its own memory or a view: the
# fuzzer rewrites it after the call either way)
Container = Callable[[np.ndarray], Any]


def _strided(a: np.ndarray) -> np.ndarray:
    return np.repeat(a.astype(np.int32), 2)[::2]


CONTAINERS: dict[str, Container] = {
    "list": lambda a: a.tolist(),
    "tuple": lambda a: tuple(a.tolist()),
    "numpy int32": lambda a: a.astype(np.int32),
    "numpy int64": lambda a: a.astype(np.int64),
    "numpy uint16": lambda a: a.astype(np.uint16),
    "numpy big-endian": lambda a: a.astype(">i4"),
    "numpy strided view": _strided,
    "torch int32": lambda a: torch.from_numpy(a.astype(np.int32)),
    "torch int64 strided": lambda a: torch.from_numpy(a.astype(np.int64)).repeat_interleave(2)[::2],
}

# Inputs that are no token ids: (make, error type)
BAD_TOKENS: list[tuple[str, Callable[[], Any], type[BaseException]]] = [
    ("masked", lambda: np.ma.array([1, 2, -1, 3], mask=[0, 0, 1, 0]), TypeError),
    ("masked, nothing masked", lambda: np.ma.array(np.arange(9, dtype=np.int32)), TypeError),
    ("negative", lambda: np.array([1, -2, 3], dtype=np.int32), ValueError),
    ("too large", lambda: np.array([1, 2**31], dtype=np.int64), ValueError),
    ("huge int in a list", lambda: [1, 2**80], ValueError),
    ("float", lambda: np.array([1.0, 2.0]), TypeError),
    ("float in a list", lambda: [1, 2.5], TypeError),
    ("bool", lambda: np.array([True, False]), TypeError),
    ("bool in a list", lambda: [1, True], TypeError),
    ("2-D", lambda: np.zeros((2, 4), dtype=np.int32), ValueError),
    ("object", lambda: np.array([1, 2], dtype=object), TypeError),
    ("str", lambda: "tokens", TypeError),
    ("bytes", lambda: b"\x01\x02", TypeError),
    ("None", lambda: None, TypeError),
    ("numpy scalar", lambda: np.int32(3), TypeError),
    ("float tensor", lambda: torch.tensor([1.0]), TypeError),
    ("2-D tensor", lambda: torch.zeros((2, 2), dtype=torch.int32), ValueError),
    ("negative tensor", lambda: torch.tensor([3, -1]), ValueError),
]

__all__ = [
    "BAD_TOKENS", "CONTAINERS", "CacheClosedError", "DOCUMENTED", "ExpectedKV", "Snapshot",
    "differences", "kv_problem", "take_snapshot", "write_kv",
]

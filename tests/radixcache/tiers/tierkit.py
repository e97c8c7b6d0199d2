"""Helpers for tier tests: a tiny tiered cache and a runner that writes
prefix-derived KV so a page served for the wrong prefix is detectable."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch

from radixcache.offload import HostPoolConfig, StorageConfig
from radixcache import CacheConfig, KVSpec, Namespace, RadixCache, Request
from radixcache.tiers import TierConfig

P = 4
SPEC = KVSpec(num_layers=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, page_size=P)


def make_tiered(
    device_pages: int = 8,
    host_pages: int = 16,
    write_policy: str = "write_through",
    prefetch: str = "wait_complete",
    storage: Path | None = None,
    threshold: int = 2,
    on_open_error: str = "recover",
) -> RadixCache:
    store = None
    if storage is not None:
        store = StorageConfig(path=storage, capacity_bytes=1 << 20, on_open_error=on_open_error)
    tiers = TierConfig(
        host=HostPoolConfig(pages=host_pages),
        write_policy=write_policy,
        write_threshold=threshold,
        prefetch_policy=prefetch,
        storage=store,
        model_id="test-model",
    )
    return RadixCache(CacheConfig(spec=SPEC, device_pages=device_pages, tiers=tiers))


def kv_value(prefix: np.ndarray) -> float:
    return float(zlib.crc32(prefix.astype("<i4").tobytes()) % 100_003)


def compute(cache: RadixCache, req: Request, n: int) -> None:
    """Reserve, write K (and V = -K) for the next n positions, commit."""
    cache.reserve(req, n)
    kv = cache.kv
    assert kv is not None
    start = req.num_computed
    slots = kv.slots(req.page_table, start, n)
    toks = req.tokens
    vals = torch.tensor([kv_value(toks[: pos + 1]) for pos in range(start, start + n)])
    for layer in range(cache.spec.num_layers):
        k, v = kv.layer_slots(layer)
        k[slots] = (vals + layer).view(-1, 1, 1)
        v[slots] = (-vals - layer).view(-1, 1, 1)
    cache.commit(req, n)


def prefill(cache: RadixCache, tokens: np.ndarray, ns: Namespace = Namespace()) -> Request:
    req = cache.admit(tokens, ns)
    compute(cache, req, tokens.size - req.num_computed)
    return req


def assert_kv_correct(cache: RadixCache, req: Request) -> None:
    """Every computed position of ``req`` holds the KV of its own prefix."""
    kv = cache.kv
    assert kv is not None
    n = req.num_computed
    if n == 0:
        return
    slots = kv.slots(req.page_table, 0, n)
    toks = req.tokens
    want = torch.tensor([kv_value(toks[: pos + 1]) for pos in range(n)])
    for layer in range(cache.spec.num_layers):
        k, v = kv.layer_slots(layer)
        got_k, got_v = k[slots].reshape(n, -1), v[slots].reshape(n, -1)
        assert torch.equal(got_k, (want + layer)[:, None].expand_as(got_k)), f"layer {layer}: wrong K"
        assert torch.equal(got_v, (-want - layer)[:, None].expand_as(got_v)), f"layer {layer}: wrong V"


def residency(cache: RadixCache) -> list[tuple[int, bool, bool, bool]]:
    """(tokens, on device, on host, stored) per node, parents first, sorted."""
    return sorted(
        (int(n.key.size), n.device is not None, n.host is not None, n.stored)
        for n in cache.tree.nodes()
    )


def seq(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


class GatedStorage:
    """A real storage backend whose reads (and, with ``gate_puts``, writes)
    wait for ``gate`` before they start: a test holds a fetch or a store in
    flight deterministically, and may change the store meanwhile. Everything
    else goes straight to the backend."""

    def __init__(self, inner: object, gate_puts: bool = False) -> None:
        import threading

        self.inner = inner
        self.gate = threading.Event()
        self.gate_puts = gate_puts

    def _later(self, start: object) -> object:
        import threading

        from radixcache.transfer import FutureTicket

        ticket = FutureTicket()

        def run() -> None:
            self.gate.wait(30)
            try:
                inner = start()  # type: ignore[operator]
                inner.wait()
                if inner.error is not None:
                    ticket.fail(inner.error)
                else:
                    ticket.finish(inner.result())
            except BaseException as exc:  # noqa: BLE001 - handed to the ticket
                ticket.fail(exc)

        threading.Thread(target=run, daemon=True).start()
        return ticket

    def get(self, *args: object, **kwargs: object) -> object:
        return self._later(lambda: self.inner.get(*args, **kwargs))  # type: ignore[attr-defined]

    def put(self, *args: object, **kwargs: object) -> object:
        if not self.gate_puts:
            return self.inner.put(*args, **kwargs)  # type: ignore[attr-defined]
        return self._later(lambda: self.inner.put(*args, **kwargs))  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def gate_storage(cache: RadixCache, gate_puts: bool = False) -> GatedStorage:
    """Put a ``GatedStorage`` in front of ``cache``'s storage tier."""
    controller = cache.tiers.controller  # type: ignore[attr-defined]
    gated = GatedStorage(controller.storage, gate_puts)
    controller.storage = gated
    return gated


def gate_copies(cache: RadixCache) -> object:
    """Replace ``cache``'s copy engine by the CPU engine whose copies wait for
    the returned event (its ``before_copy`` seam)."""
    import threading

    from radixcache.transfer.engine import CpuCopyEngine

    gate = threading.Event()
    controller = cache.tiers.controller  # type: ignore[attr-defined]
    controller.copy.close()
    assert cache.kv is not None
    controller.copy = CpuCopyEngine(
        cache.kv, controller.host.buffer, before_copy=lambda request: gate.wait(30)
    )
    return gate


def page_record_keys(cache: RadixCache, tokens: np.ndarray) -> list[bytes]:
    """The storage page keys of the cached pages of ``tokens`` (default namespace)."""
    from radixcache.keys.hashing import split_keys

    match = cache.tree.match(Namespace(), tokens)
    nodes = []
    node = match.last_device_node
    while node is not None and node.parent is not None:
        nodes.append(node)
        node = node.parent
    return split_keys(b"".join(cache.tree.page_keys(n) for n in reversed(nodes)))


def rewrite_record(path: Path, page_key: bytes, change: object) -> None:
    """Replace the stored value of the record whose key ends with ``page_key``
    by ``change(value)``, with a raw LMDB write (the store must be closed)."""
    import lmdb

    env = lmdb.open(str(path), max_dbs=3)
    try:
        db = env.open_db(b"pages")
        with env.begin(write=True, db=db) as txn:
            hits = [bytes(k) for k, _ in txn.cursor() if bytes(k).endswith(page_key)]
            assert len(hits) == 1, f"{len(hits)} records end with the page key"
            value = txn.get(hits[0])
            txn.put(hits[0], change(bytes(value)))  # type: ignore[operator]
    finally:
        env.close()

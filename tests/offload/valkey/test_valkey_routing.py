"""Routing that counts the shared pool: ``KvIndex(pool_lookup=PoolLookup(...))``.

The router computes the engines' page keys from a request's tokens and
namespace as the wire names it (``radixcache.keys.routing_keys.request_keys``:
``chain_keys`` under the namespace digest, as the tree does), asks the pool how many leading pages it holds, and discounts
the prefill of the pages past each worker's own overlap (Dynamo's
``hits_beyond(overlap) * shared_cache_multiplier``). A failed pool query
falls back to index-only scoring with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache import Namespace
from radixcache.events.index.kv_index import IndexConfig, KvIndex
from radixcache.events.types import GPU, BlockStored
from radixcache.keys.hashing import chain_keys, split_keys
from radixcache.offload import PoolLookup, ValkeyConfig
from radixcache.keys.routing_keys import pool_lookup, request_keys

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyServer

BS = 4  # tokens per block (the conftest's page size)


def engine_keys(tokens: Sequence[int], block_size: int, lora_id: int | None, lora_name: str | None) -> list[bytes]:
    """The engines' page keys of a request's full blocks, computed here
    independently of ``request_keys`` (the tree's chained keys)."""
    ns = Namespace(lora_id=lora_id, lora_name=lora_name)
    full = len(tokens) // block_size * block_size
    return split_keys(chain_keys(ns.digest(), np.asarray(tokens[:full], dtype=np.int32), block_size))


def test_request_keys_are_the_engines_keys_for_every_namespace_field() -> None:
    tokens = list(range(7, 7 + 3 * BS + 1))
    assert request_keys(tokens, BS) == engine_keys(tokens, BS, None, None)
    assert request_keys(tokens, BS, 2, "adapter") == engine_keys(tokens, BS, 2, "adapter")
    salted = Namespace(salt="acme", extra_keys=("img-1",))
    want = split_keys(chain_keys(salted.digest(), np.asarray(tokens[: 3 * BS], dtype=np.int32), BS))
    assert request_keys(tokens, BS, cache_salt="acme", extra_keys=["img-1"]) == want
    assert request_keys(tokens, BS, cache_salt="acme") != want
    assert request_keys(tokens[: BS - 1], BS) == []
    with pytest.raises(ValueError, match="token ids"):
        request_keys([-1] * BS, BS)
    with pytest.raises(TypeError, match="cache_salt"):
        request_keys(tokens, BS, cache_salt=b"acme")  # type: ignore[arg-type]


def stored(tokens: list[int], hashes: list[int]) -> BlockStored:
    return BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=BS,
        lora_id=None, medium=GPU, lora_name=None,
    )  # fmt: skip


def test_the_pool_lets_an_idle_worker_with_no_local_overlap_win(pool_kit: PoolKit) -> None:
    """4 blocks, multiplier 0.5; W0 holds 2 on GPU but is busier, the pool holds all 4."""
    tokens = list(range(100, 100 + 4 * BS))
    pool = pool_kit.pool()
    keys = engine_keys(tokens, BS, None, None)
    host = pool_kit.host(4)
    toks = np.asarray(tokens, dtype=np.int32).reshape(4, BS)
    assert pool_kit.done(pool.put(keys, toks, host, np.arange(4, dtype=np.int32), Namespace().digest())) == 4

    lookup = PoolLookup(pool_kit.config(), pool_kit.fingerprint, request_keys, pool_kit.spec.page_bytes)
    try:
        index = KvIndex(IndexConfig(block_size=BS, w_pool=0.5), pool_lookup=lookup)
        index.apply_event("w0", stored(tokens[: 2 * BS], [1, 2]))
        index.clear_worker("w1")
        loads = {"w0": 1.5, "w1": 0.0}
        decision = index.choose(tokens, loads)
        assert decision.pool_blocks == 4
        # W0: 2 device blocks + 2 pool blocks past them; W1: 4 pool blocks
        assert decision.costs == {"w0": 4 - 2 - 0.5 * 2 + 1.5, "w1": 4 - 0.5 * 4}
        assert decision.worker == "w1"
        # counting only the index, W0's local overlap wins despite its load
        plain = KvIndex(IndexConfig(block_size=BS))
        plain.apply_event("w0", stored(tokens[: 2 * BS], [1, 2]))
        assert plain.choose(tokens, loads).costs == {"w0": 2 + 1.5, "w1": 4.0}
        # another namespace (a LoRA) has nothing in the pool
        assert index.choose(tokens, loads, lora_id=3).pool_blocks == 0
    finally:
        lookup.close()


def test_a_failed_pool_query_falls_back_to_the_index(caplog: pytest.LogCaptureFixture) -> None:
    from tests.offload.valkey.valkey_servers import free_port

    config = ValkeyConfig.from_url(f"valkey://127.0.0.1:{free_port()}/0", connect_timeout_s=0.2)
    from radixcache.offload import ModelFingerprint

    lookup = PoolLookup(config, ModelFingerprint("m", "spec", 0), request_keys, 1024)
    try:
        index = KvIndex(IndexConfig(block_size=BS), pool_lookup=lookup)
        tokens = list(range(4 * BS))
        index.apply_event("w0", stored(tokens[:BS], [7]))
        with caplog.at_level(logging.WARNING):
            decision = index.choose(tokens, {"w0": 0.0, "w1": 0.0})
        assert decision.pool_blocks is None and decision.worker == "w0"
        assert decision.costs == {"w0": 3.0, "w1": 4.0}
        assert "routing on the index alone" in caplog.text

        def broken(*_args: object) -> int:
            raise RuntimeError("boom")

        fallback = KvIndex(IndexConfig(block_size=BS), pool_lookup=broken)
        fallback.apply_event("w0", stored(tokens[:BS], [7]))
        assert fallback.choose(tokens, {"w0": 0.0, "w1": 0.0}).pool_blocks is None
    finally:
        lookup.close()


def test_router_keys_match_what_an_engine_wrote(valkey_server: ValkeyServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine (the public RadixCache API) prefills a prompt through to the
    pool, once in the default namespace and once for a salted tenant; the
    router's lookup, computing keys from tokens and the wire's namespace
    fields, finds every page of each and none across them."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tests.offload.valkey.test_valkey_engines import make_engine

    from tests.radixcache.tiers.tierkit import P, prefill

    valkey_server.flush()
    cache = make_engine(valkey_server.url, monkeypatch)
    try:
        prompt = np.arange(500, 500 + 3 * P + 2, dtype=np.int32)
        cache.release(prefill(cache, prompt))
        tenant = np.arange(900, 900 + 2 * P + 1, dtype=np.int32)
        cache.release(prefill(cache, tenant, Namespace(salt="acme")))
        cache.drain()
    finally:
        cache.close()
    from radixcache.offload import ModelFingerprint

    lookup = pool_lookup(valkey_server.url, model_id="shared-model", spec=cache.spec)  # make_engine's
    try:
        assert lookup(prompt.tolist(), P) == 3
        assert lookup(prompt.tolist(), P, lora_id=1) == 0
        assert lookup(prompt.tolist(), P, cache_salt="acme") == 0
        assert lookup(tenant.tolist(), P, cache_salt="acme") == 2
        assert lookup(tenant.tolist(), P) == 0
        assert lookup(tenant.tolist(), P, cache_salt="globex") == 0
        # the router passes the request's namespace fields on to the pool
        index = KvIndex(IndexConfig(block_size=P), pool_lookup=lookup)
        loads = {"w0": 0.0}
        assert index.choose(tenant.tolist(), loads, cache_salt="acme").pool_blocks == 2
        assert index.choose(tenant.tolist(), loads).pool_blocks == 0
        assert index.choose(prompt.tolist(), loads).pool_blocks == 3
    finally:
        lookup.close()


def test_the_router_lookup_takes_the_password_as_the_engines_do(
    pool_kit_at: Callable[[str], PoolKit], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 5: ``pool_lookup(url)`` ignored RADIXCACHE_VALKEY_PASSWORD and
    answered None on a protected pool; it reads the URL as engines do."""
    from radixcache.offload.backends import PASSWORD_ENV, open_backend
    from tests.offload.valkey.valkey_servers import ValkeyServer

    secret = "r0uter-s3cret"
    server = ValkeyServer(password=secret)
    try:
        monkeypatch.setenv(PASSWORD_ENV, secret)
        kit = pool_kit_at(server.url)  # the URL carries no password
        tokens = list(range(40, 40 + 3 * BS))
        keys = engine_keys(tokens, BS, None, None)
        engine = open_backend(server.url, kit.spec, kit.fingerprint).storage
        try:
            toks = np.asarray(tokens, dtype=np.int32).reshape(3, BS)
            ticket = engine.put(keys, toks, kit.host(3), kit.ids(0, 1, 2), Namespace().digest())
            assert kit.done(ticket) == 3
        finally:
            engine.close()
        lookup = pool_lookup(server.url, model_id="tiny-model", spec=kit.spec)
        try:
            assert lookup(tokens, BS) == 3
            assert secret not in repr(lookup)
        finally:
            lookup.close()
    finally:
        server.stop()

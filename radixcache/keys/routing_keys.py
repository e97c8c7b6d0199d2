"""The engines' storage keys of a request, as a router computes them from the wire.

A router that counts a shared pool (``KvIndex(pool_lookup=...)``) asks the
pool how many leading pages of a request it holds. The pool names pages by
the engines' chained storage keys (``radixcache.keys.hashing.chain_keys``, seeded
with ``Namespace.digest()``), so the router needs the request's namespace in
the engines' terms. It has what events and requests carry: ``lora_id``,
``lora_name``, ``cache_salt`` and the namespace's ``extra_keys``.

``Namespace.from_wire`` maps those back. One case cannot be mapped: an engine
whose namespace salt is ``bytes`` publishes it as ``"hex:<hex>"``, and that
string is read back as a string salt, so such tenants get no pool discount
(the router still scores them on its index). Use string salts where a router
counts the pool.

    lookup = pool_lookup("valkey://pool:6379/0", model_id="llama-3-8b", spec=spec)
    index = KvIndex(IndexConfig(block_size=spec.page_size), pool_lookup=lookup)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixcache.keys.hashing import chain_keys, split_keys
from radixcache.namespace import ExtraKey, Namespace
from radixcache.offload import ModelFingerprint, PoolLookup, ValkeyConfig, storage_config
from radixcache.tokens import as_tokens
from radixcache.transfer.layout import KVSpec


def request_keys(
    tokens: Sequence[int] | np.ndarray,
    block_size: int,
    lora_id: int | None = None,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    extra_keys: Sequence[ExtraKey] | None = None,
) -> list[bytes]:
    """Storage keys of the full pages of ``tokens`` under the namespace the
    wire fields name (what an engine with page size ``block_size`` wrote)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    ns = Namespace.from_wire(lora_id, lora_name, cache_salt, extra_keys)
    full = len(tokens) // block_size * block_size
    if full == 0:
        return []
    return split_keys(chain_keys(ns.digest(), as_tokens(tokens[:full], "token ids"), block_size))


def pool_lookup(
    pool: str | ValkeyConfig,
    *,
    model_id: str,
    spec: KVSpec,
    tp_rank: int = 0,
    rank_shared: bool = False,
) -> PoolLookup:
    """A router's lookup into the shared pool of engines serving ``model_id``
    with KV layout ``spec`` on tensor-parallel rank ``tp_rank`` (the
    fingerprint the engines use: ``TierConfig.model_id``, ``tp_rank`` and
    ``kv_shared_across_ranks``). ``pool`` is read as the engines read it
    (``storage_config``): the password from ``RADIXCACHE_VALKEY_PASSWORD``
    when the URL has none, TLS files and pages per value from the URL's
    options. Close it when done."""
    config = storage_config(pool)
    if not isinstance(config, ValkeyConfig):
        raise ValueError(f"a pool lookup needs a Valkey pool URL, got {type(config).__name__}")
    fingerprint = ModelFingerprint(model_id, spec.describe(), tp_rank, rank_shared)
    return PoolLookup(config, fingerprint, request_keys, spec.page_bytes)

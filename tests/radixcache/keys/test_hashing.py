"""Storage keys and event block ids: fixed values, chaining, salting, range."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from radixcache.keys.hashing import (
    ID_LIMIT,
    KEY_BYTES,
    block_id_of_sequence,
    block_ids,
    chain_keys,
    namespace_seed,
)
from radixcache.namespace import Namespace

P = 16
# 64 tokens, 4 pages of 16: 7919 * k mod 151000
FIXED = ((np.arange(1, 65, dtype=np.int64) * 7919) % 151_000).astype(np.int32)


def test_values_are_fixed_across_processes_and_releases() -> None:
    """Pinned values: a change here breaks every router's and store's ids."""
    seed = namespace_seed(Namespace().digest())
    assert seed == 6973083667350322005
    assert namespace_seed(Namespace(salt="tenant-a").digest()) == 2470979346919632373
    assert block_ids(FIXED, P, None, seed).tolist() == [
        2613788791700168748,
        8279411414530459680,
        8111336762027651880,
        1552795024667720551,
    ]
    assert chain_keys(Namespace().digest(), FIXED[:32], P).hex() == (
        "33cbe4ccdf50976667b5005a8761db00c1a9387e0e803fa513856e098522b3e3"
    )


token_runs = st.integers(0, 12).flatmap(
    lambda n: arrays(np.int32, n * P, elements=st.integers(0, 2**31 - 1))
)


@settings(max_examples=60, deadline=None)
@given(tokens=token_runs, parent=st.none() | st.integers(0, ID_LIMIT - 1), seed=st.integers(0, ID_LIMIT - 1))
def test_vectorized_ids_equal_the_page_by_page_definition(
    tokens: np.ndarray, parent: int | None, seed: int
) -> None:
    got = block_ids(tokens, P, parent, seed)
    assert got.dtype == np.int64 and got.size == tokens.size // P
    assert got.tolist() == block_id_of_sequence(tokens, P, parent, seed)
    assert ((got >= 0) & (got < ID_LIMIT)).all()


@settings(max_examples=40, deadline=None)
@given(tokens=token_runs, cut=st.integers(0, 12), seed=st.integers(0, ID_LIMIT - 1))
def test_a_run_continues_from_its_parents_id(tokens: np.ndarray, cut: int, seed: int) -> None:
    n = tokens.size // P
    cut = min(cut, n)
    whole = block_ids(tokens, P, None, seed)
    head = block_ids(tokens[: cut * P], P, None, seed)
    tail = block_ids(tokens[cut * P :], P, int(head[-1]) if cut else None, seed)
    assert np.concatenate([head, tail]).tolist() == whole.tolist()


def test_same_page_after_different_prefixes_differs() -> None:
    seed = namespace_seed(Namespace().digest())
    page = FIXED[:P]
    a = block_ids(np.concatenate([FIXED[P : 2 * P], page]), P, None, seed)
    b = block_ids(np.concatenate([FIXED[2 * P : 3 * P], page]), P, None, seed)
    c = block_ids(np.concatenate([FIXED[2 * P : 3 * P], FIXED[P : 2 * P], page]), P, None, seed)
    assert len({int(a[1]), int(b[1]), int(c[2])}) == 3
    # order matters: the same two pages swapped
    x, y = FIXED[:P], FIXED[P : 2 * P]
    assert block_ids(np.concatenate([x, y]), P, None, seed)[1] != block_ids(np.concatenate([y, x]), P, None, seed)[1]


def test_every_token_position_counts() -> None:
    seed = 12345
    base = block_ids(FIXED[:P], P, None, seed)[0]
    for j in range(P):
        t = FIXED[:P].copy()
        t[j] += 1
        assert block_ids(t, P, None, seed)[0] != base, j


def test_namespaces_salt_every_page() -> None:
    spaces = [Namespace(), Namespace(salt="a"), Namespace(salt=b"a"), Namespace(lora_id=3), Namespace(extra_keys=("img",))]
    seeds = [namespace_seed(ns.digest()) for ns in spaces]
    assert len(set(seeds)) == len(spaces)
    per_page = [block_ids(FIXED, P, None, s).tolist() for s in seeds]
    for i in range(4):
        assert len({ids[i] for ids in per_page}) == len(spaces)


def test_many_pages_get_distinct_ids() -> None:
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 50, 20_000 * P, dtype=np.int32)  # small vocabulary: many near-equal pages
    ids = block_ids(tokens, P, None, 1)
    assert np.unique(ids).size == ids.size
    firsts = [int(block_ids(tokens[i * P : (i + 1) * P], P, None, 1)[0]) for i in range(2000)]
    distinct_pages = np.unique(tokens[: 2000 * P].reshape(-1, P), axis=0).shape[0]
    assert len(set(firsts)) == distinct_pages


def test_page_size_changes_ids() -> None:
    assert block_ids(FIXED, 16, None, 1)[1] != block_ids(FIXED, 32, None, 1)[0]


def test_storage_keys_chain_and_split() -> None:
    digest = Namespace(salt="t").digest()
    whole = chain_keys(digest, FIXED, P)
    assert len(whole) == 4 * KEY_BYTES
    head = chain_keys(digest, FIXED[: 2 * P], P)
    assert head + chain_keys(head[-KEY_BYTES:], FIXED[2 * P :], P) == whole
    assert chain_keys(Namespace().digest(), FIXED, P) != whole

"""Event block ids cached on tree nodes equal the ids of the whole sequence."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import DEFAULT_NAMESPACE as NS
from radixcache import Namespace, RadixTree, make_eviction_policy
from radixcache.keys.event_ids import EventIds
from radixcache.keys.hashing import block_ids, namespace_seed
from radixcache.tree.node import Node
from tests.radixcache.conftest import P


def path_ids(ids: EventIds, node: Node) -> list[int]:
    parts = []
    n: Node | None = node
    while n is not None and n.parent is not None:
        parts.append(ids.node_ids(n).tolist())
        n = n.parent
    return [x for part in reversed(parts) for x in part]


def reference(tokens: np.ndarray, ns: Namespace = NS) -> list[int]:
    return block_ids(tokens, P, None, namespace_seed(ns.digest())).tolist()


sequences = st.lists(
    st.lists(st.integers(0, 3), min_size=1, max_size=6).map(
        lambda pages: np.repeat(np.asarray(pages, dtype=np.int32), P)
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(seqs=sequences, ask_between=st.booleans())
def test_node_ids_match_the_whole_sequence_through_splits_and_extends(
    seqs: list[np.ndarray], ask_between: bool
) -> None:
    tree = RadixTree(P, make_eviction_policy("lru"))
    ids = EventIds(P)
    next_page = 0
    for tokens in seqs:
        pages = np.arange(next_page, next_page + tokens.size // P, dtype=np.int32)
        next_page += pages.size
        res = tree.insert(NS, tokens, pages)
        if ask_between:  # cache ids now; later inserts split and extend the nodes
            assert path_ids(ids, res.last_node) == reference(tokens)
    for tokens in seqs:
        m = tree.match(NS, tokens)
        assert m.last_device_node is not None and m.device_len == tokens.size
        assert path_ids(ids, m.last_device_node) == reference(tokens)
        node = m.last_device_node
        parent = ids.parent_id(node)
        before = tokens[: tokens.size - node.key.size]
        assert parent == (reference(before)[-1] if before.size else None)
    tree.check_integrity()


def test_namespaces_get_their_own_ids() -> None:
    tree = RadixTree(P, make_eviction_policy("lru"))
    ids = EventIds(P)
    tokens = np.arange(3 * P, dtype=np.int32)
    salted = Namespace(salt="t")
    a = tree.insert(NS, tokens, np.arange(3, dtype=np.int32)).last_node
    b = tree.insert(salted, tokens, np.arange(3, 6, dtype=np.int32)).last_node
    assert ids.node_ids(a).tolist() == reference(tokens)
    assert ids.node_ids(b).tolist() == reference(tokens, salted)
    assert not set(ids.node_ids(a).tolist()) & set(ids.node_ids(b).tolist())

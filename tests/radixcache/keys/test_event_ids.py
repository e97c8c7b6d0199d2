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


@settings(max_examples=60, deadline=None)
@given(seqs=sequences, picks=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99)), min_size=1, max_size=12))
def test_any_run_of_a_node_gets_the_ids_of_the_whole_sequence(
    seqs: list[np.ndarray], picks: list[tuple[int, int]]
) -> None:
    """``run_ids`` of any pages of any node, asked in any order (each ask
    keeps an id that later asks chain from): the slice of the whole
    sequence's ids, and the id before it (None at the sequence's start)."""
    tree = RadixTree(P, make_eviction_policy("lru"))
    ids = EventIds(P)
    for i, tokens in enumerate(seqs):
        tree.insert(NS, tokens, np.arange(i * 100, i * 100 + tokens.size // P, dtype=np.int32))
    for a, b in picks:
        tokens = seqs[a % len(seqs)]
        node = tree.match(NS, tokens).last_device_node
        assert node is not None
        for _ in range(b % 3):  # some ask an ancestor
            node = node.parent if node.parent.parent is not None else node
        offset = 0  # pages before the node
        up = node.parent
        while up is not None:
            offset += up.key.size // P
            up = up.parent
        whole = reference(tokens)
        size = node.key.size // P
        first = b % size
        count = 1 + a % (size - first)
        before, run = ids.run_ids(node, first, count)
        assert run.tolist() == whole[offset + first : offset + first + count]
        assert before == (whole[offset + first - 1] if offset + first else None)
        assert 0 < node.id_pages <= size and node.last_id == whole[offset + node.id_pages - 1]


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


def test_a_split_keeps_an_id_for_each_piece_once_ids_were_asked_for() -> None:
    """The kept id goes down with its page; the upper piece gets its own
    last id at once (what its children chain from), so removing the lower
    piece later hashes nothing above it."""
    tree = RadixTree(P, make_eviction_policy("lru"))
    ids = EventIds(P)
    tokens = np.arange(6 * P, dtype=np.int32)
    leaf = tree.insert(NS, tokens, np.arange(6, dtype=np.int32)).last_node
    whole = reference(tokens)
    assert ids.node_ids(leaf).tolist() == whole and leaf.id_pages == 6
    other = np.concatenate([tokens[: 2 * P], np.full(P, 99, np.int32)])
    tree.insert(NS, other, np.arange(6, 9, dtype=np.int32))
    upper = leaf.parent
    assert upper is not None and upper.key.size == 2 * P
    assert (upper.id_pages, upper.last_id) == (2, whole[1])
    assert (leaf.id_pages, leaf.last_id) == (4, whole[5])
    assert tree.ids.chain_start(leaf) == whole[1]
    untouched = RadixTree(P, make_eviction_policy("lru"))  # nobody asked: splits hash nothing
    first = untouched.insert(NS, tokens, np.arange(6, dtype=np.int32)).last_node
    untouched.insert(NS, other, np.arange(6, 9, dtype=np.int32))
    assert first.parent is not None and first.parent.id_pages == 0 and first.id_pages == 0

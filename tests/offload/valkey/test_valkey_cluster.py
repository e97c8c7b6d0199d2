"""The pool on a cluster an operator runs: nodes die, stall, move slots; the
other nodes' pages are still served, and nothing "not now" is taken for corrupt.

Each test starts its own 3-node cluster of real ``valkey-server`` processes
(tests/offload/valkey/valkey_servers.py), because it kills, stops or
reconfigures nodes. Pages are put under keys chosen by the node that serves
them, so each figure says exactly which pages a dead node costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest
from tests.offload.valkey.valkey_servers import ValkeyCluster

if TYPE_CHECKING:
    from radixcache.offload import ValkeyStorage
    from tests.offload.conftest import PoolKit

KitAt = Callable[[str], "PoolKit"]
PER_NODE = 12  # pages of each node's own prompt


@pytest.fixture
def cluster() -> Iterator[ValkeyCluster]:
    """A cluster whose live nodes serve their slots while one is dead."""
    c = ValkeyCluster(full_coverage=False, node_timeout_ms=1000)
    yield c
    c.stop()


def _keys_by_node(
    kit: PoolKit, pool: ValkeyStorage, cluster: ValkeyCluster, n: int, salt: bytes = b"by-node"
) -> list[list[bytes]]:
    """``n`` page keys per node, each stored (as a one-page value) on that node."""
    out: list[list[bytes]] = [[] for _ in cluster.nodes]
    for key in kit.keys(40 * n, salt):
        node = cluster.node_of(pool.pool_keys([key])[0])
        if len(out[node]) < n:
            out[node].append(key)
        if all(len(keys) == n for keys in out):
            return out
    raise AssertionError("not enough keys per node")


def _put(kit: PoolKit, pool: ValkeyStorage, keys: list[bytes], seed: int):  # type: ignore[no-untyped-def]
    host = kit.host(len(keys), seed=seed)
    tokens = kit.tokens(len(keys), start=seed * 1000)
    ids = np.arange(len(keys), dtype=np.int32)
    assert kit.done(pool.put(keys, tokens, host, ids, b"ns")) == len(keys)
    return tokens, host


def _read(kit: PoolKit, pool: ValkeyStorage, keys: list[bytes], tokens, host) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(pages served, pages served whose bytes differ from what was put)."""
    dst = kit.host(len(keys), seed=99)
    served = kit.done(pool.get(keys, tokens, dst, np.arange(len(keys), dtype=np.int32)))
    wrong = sum(not np.array_equal(dst.as_bytes()[i], host.as_bytes()[i]) for i in range(served))
    return served, wrong


@pytest.mark.parametrize("dead", [0, 1, 2], ids=["seed-node", "node-1", "node-2"])
def test_killing_any_one_node_keeps_the_other_nodes_pages_served(
    cluster: ValkeyCluster, pool_kit_at: KitAt, dead: int
) -> None:
    kit = pool_kit_at(cluster.url)  # the URL names node 0 only
    pool = kit.pool(socket_timeout_s=0.5, retry_after_s=0.3)
    by_node = _keys_by_node(kit, pool, cluster, PER_NODE)
    stored = [_put(kit, pool, keys, seed=i) for i, keys in enumerate(by_node)]
    mixed = [k for trio in zip(*_keys_by_node(kit, pool, cluster, 4, b"mixed")) for k in trio]
    mixed_tokens, mixed_host = _put(kit, pool, mixed, seed=7)
    before = [_read(kit, pool, keys, *stored[i]) for i, keys in enumerate(by_node)]
    assert before == [(PER_NODE, 0)] * 3

    cluster.nodes[dead].kill()
    after: list[tuple[int, int]] = []
    for _ in range(3):  # the first calls find the node gone; later ones skip it at once
        after = [_read(kit, pool, keys, *stored[i]) for i, keys in enumerate(by_node)]
    for i, (served, wrong) in enumerate(after):
        assert wrong == 0
        assert served == (0 if i == dead else PER_NODE), (dead, after)
    # a prompt over every node is served up to its first page on the dead node
    served, wrong = _read(kit, pool, mixed, mixed_tokens, mixed_host)
    assert (served, wrong) == (dead, 0)
    assert pool.longest_prefix(mixed) == dead
    assert [pool.longest_prefix(keys) for keys in by_node] == [0 if i == dead else PER_NODE for i in range(3)]
    stats = pool.stats()
    assert stats.corrupt == 0 and stats.deleted == 0
    assert pool.pool_stats().unavailable > 0 and pool.pool_stats().nodes_up == 2
    # puts go on for the live nodes' keys; a put over the dead node's stops there
    fresh = _keys_by_node(kit, pool, cluster, 2, b"fresh")
    live = next(i for i in range(3) if i != dead)
    _put(kit, pool, fresh[live], seed=20)
    host = kit.host(2)
    assert kit.done(pool.put(fresh[dead], kit.tokens(2), host, kit.ids(0, 1), b"ns")) == 0


def test_a_client_reaches_the_cluster_through_any_seed_node(cluster: ValkeyCluster, pool_kit_at: KitAt) -> None:
    """Defect 2: the client (re)connected only through the node its URL named."""
    kit = pool_kit_at(cluster.seeds_url)
    cluster.nodes[0].kill()  # the first seed is dead before the client ever connects
    pool = kit.pool(socket_timeout_s=0.5, retry_after_s=0.3)
    by_node = _keys_by_node(kit, pool, cluster, 4)
    tokens, host = _put(kit, pool, by_node[1] + by_node[2], seed=3)
    assert _read(kit, pool, by_node[1] + by_node[2], tokens, host) == (8, 0)
    assert pool.pool_stats().nodes == 3 and pool.pool_stats().nodes_up == 2


def test_a_client_that_knew_the_cluster_reconnects_through_the_nodes_it_learnt(
    cluster: ValkeyCluster, pool_kit_at: KitAt
) -> None:
    """Defect 2 as probed: the URL names the seed node only; the seed dies and
    every client (re)connection must go through the other nodes."""
    kit = pool_kit_at(cluster.url)
    pool = kit.pool(socket_timeout_s=0.5, retry_after_s=0.3)
    by_node = _keys_by_node(kit, pool, cluster, 4)
    tokens, host = _put(kit, pool, by_node[1], seed=4)
    cluster.nodes[0].kill()
    cluster.wait_state("ok", [1, 2])  # partial coverage allowed: the live nodes stay ok
    for node in (1, 2):  # their connections are lost too: every node must be reconnected
        with cluster.nodes[node].client() as admin:
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
    time.sleep(0.4)
    assert _read(kit, pool, by_node[1], tokens, host) == (4, 0)
    assert pool.longest_prefix(by_node[1]) == 4


def test_clusterdown_is_unavailability_not_corruption(pool_kit_at: KitAt) -> None:
    """Defect 1: with full coverage required (the server's default), a dead node
    makes the others answer CLUSTERDOWN; those replies are misses, counted as
    unavailable, and no record is counted corrupt or deleted."""
    c = ValkeyCluster(node_timeout_ms=1000)
    try:
        kit = pool_kit_at(c.url)
        pool = kit.pool(socket_timeout_s=0.5, retry_after_s=0.2)
        keys = _keys_by_node(kit, pool, c, 8)[0]  # all on node 0, which stays up
        tokens, host = _put(kit, pool, keys, seed=5)
        c.nodes[1].kill()
        c.wait_state("fail", [0, 2])
        for _ in range(5):
            assert _read(kit, pool, keys, tokens, host) == (0, 0)
            kit.done(pool.delete([]))  # after any deletion a read may have queued
            time.sleep(0.25)
        stats = pool.stats()
        assert stats.corrupt == 0 and stats.deleted == 0
        assert pool.pool_stats().unavailable >= 1
        c.nodes[1].start()  # the node returns (empty): the cluster is whole again
        c.wait_state("ok", [0, 1, 2])
        time.sleep(0.3)
        assert _read(kit, pool, keys, tokens, host) == (8, 0)  # nothing was deleted
    finally:
        c.stop()


def test_a_stalled_node_costs_one_timeout_per_call(cluster: ValkeyCluster, pool_kit_at: KitAt) -> None:
    """Defect 6 (timeouts): a node that stops answering (SIGSTOP) makes a get
    or a put return within the documented bound (``connect_timeout_s +
    socket_timeout_s``), not a multiple of it, and the other nodes serve theirs."""
    kit = pool_kit_at(cluster.url)
    timeout, connect = 0.5, 0.25
    pool = kit.pool(socket_timeout_s=timeout, connect_timeout_s=connect, retry_after_s=5.0)
    by_node = _keys_by_node(kit, pool, cluster, 4)
    prompt = by_node[0] + by_node[1] + by_node[2]
    tokens, host = _put(kit, pool, prompt, seed=6)
    cluster.nodes[1].pause()
    try:
        started = time.monotonic()
        served, wrong = _read(kit, pool, prompt, tokens, host)
        get_s = time.monotonic() - started
        started = time.monotonic()
        more = kit.keys(12, b"more")
        kit.done(pool.put(more, kit.tokens(12), kit.host(12), np.arange(12, dtype=np.int32), b"ns"))
        put_s = time.monotonic() - started
        started = time.monotonic()
        assert pool.longest_prefix(by_node[2]) == 4  # node 2 still answers
        lookup_s = time.monotonic() - started
    finally:
        cluster.nodes[1].resume()
    assert (served, wrong) == (4, 0)  # node 0's pages, then node 1's: not now
    bound = connect + timeout + 0.5  # the documented bound, plus slack for a loaded machine
    assert max(get_s, put_s, lookup_s) < bound, (get_s, put_s, lookup_s)


def test_moved_slots_are_misses_then_found_where_they_went(cluster: ValkeyCluster, pool_kit_at: KitAt) -> None:
    """A slot reassigned behind the client's back (MOVED): that read is a miss,
    not corrupt; the client learns the new map and uses the new owner."""
    kit = pool_kit_at(cluster.url)
    pool = kit.pool(socket_timeout_s=0.5, retry_after_s=0.2)
    keys = _keys_by_node(kit, pool, cluster, 2)[0]
    tokens, host = _put(kit, pool, keys, seed=8)
    from redis.crc import key_slot

    slots = {key_slot(k) for k in pool.pool_keys(keys)}
    ids = []
    for node in cluster.nodes:
        with node.client() as c:
            ids.append(c.execute_command("CLUSTER", "MYID").decode())
    with cluster.nodes[0].client() as c:  # a node gives up slots only once it holds no keys there
        for key in pool.pool_keys(keys):
            c.delete(key)
    for node in cluster.nodes:  # node 2 takes the slots over
        with node.client() as c:
            for slot in slots:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[2])
    assert _read(kit, pool, keys, tokens, host) == (0, 0)
    kit.done(pool.delete([]))
    assert pool.stats().corrupt == 0
    time.sleep(0.3)
    assert kit.done(pool.put(keys, tokens, host, kit.ids(0, 1), b"ns")) == 2
    assert _read(kit, pool, keys, tokens, host) == (2, 0)
    with cluster.nodes[2].client() as c:  # written where the slots went
        assert [c.exists(key) for key in pool.pool_keys(keys)] == [1, 1]

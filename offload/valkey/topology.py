"""Where each key lives: one server, or the slot map of a cluster learnt from any live node.

A cluster spreads its 16,384 hash slots over its primaries; a key's slot is
the CRC16 of the key (``redis.crc.key_slot``). ``Layout`` is one snapshot of
that map (or, for one server, "every key on the one node"); the link routes
each command by it and never waits for a redirect.

Discovery (``discover``) asks the nodes it knows, in order, for
``CLUSTER SLOTS`` until one answers: first the primaries of the layout it
had (those that are up first), then the seeds the configuration names. So a
client keeps (re)connecting while any node it has seen lives, whichever
node the URL named. Slots nobody serves (a dead primary without a replica,
in a cluster that allows partial coverage) map to no node: their keys are
misses, the other slots are served.

``PoolNode`` objects (offload/valkey/nodes.py) are kept across discoveries,
so a node's health (down, and until when) survives a refresh of the map.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from redis.crc import key_slot

from radixcache.offload.valkey.config import Node, ValkeyConfig
from radixcache.offload.valkey.nodes import PoolNode

SLOTS = 16384
NO_NODE = -1  # a slot nobody serves


@dataclass(frozen=True, slots=True)
class Layout:
    """Which node serves each key (a snapshot; a refresh makes a new one)."""

    nodes: tuple[PoolNode, ...]  # the primaries
    owner: npt.NDArray[np.int16] | None  # [SLOTS] index into nodes, NO_NODE; None: one server

    def node_index(self, key: bytes) -> int:
        """Index into ``nodes`` of the node serving ``key``, or ``NO_NODE``."""
        if self.owner is None:
            return 0
        return int(self.owner[key_slot(key)])

    def group(self, keys: Sequence[bytes]) -> dict[int, list[int]]:
        """Positions of ``keys`` per node index (``NO_NODE``: slots nobody
        serves), each list in key order."""
        if self.owner is None:
            return {0: list(range(len(keys)))} if keys else {}
        out: dict[int, list[int]] = {}
        owner = self.owner
        for i, key in enumerate(keys):
            out.setdefault(int(owner[key_slot(key)]), []).append(i)
        return out

    def slots_of(self, node: PoolNode) -> int:
        """How many slots ``node`` serves in this layout."""
        if self.owner is None:
            return SLOTS
        index = self.nodes.index(node) if node in self.nodes else NO_NODE
        return int(np.count_nonzero(self.owner == index)) if index != NO_NODE else 0


def single(node: PoolNode) -> Layout:
    """The layout of one server: every key on ``node``."""
    return Layout((node,), None)


def discover(
    config: ValkeyConfig,
    candidates: Sequence[Node],
    node_at: Callable[[Node], PoolNode],
    deadline: float,
) -> tuple[Layout | None, str]:
    """Ask ``candidates`` in turn for ``CLUSTER SLOTS`` until one answers or
    ``deadline`` (monotonic) passes. Returns the layout (None if no node
    answered) and the last error seen (for messages)."""
    error = "no node to ask"
    for addr in candidates:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        node = node_at(addr)
        if not node.available():
            error = f"{node.name}: {node.last_error}"
            continue
        try:
            conn = node.take(min(config.connect_timeout_s, remaining))
        except Exception as exc:  # refused, timed out, TLS or login failure
            error = f"{node.name}: {type(exc).__name__}: {exc}"
            continue
        ok = False
        try:
            if conn._sock is not None:
                conn._sock.settimeout(max(0.001, deadline - time.monotonic()))
            conn.send_command("CLUSTER", "SLOTS")
            reply = conn.read_response()
            ok = True
        except Exception as exc:
            error = f"{node.name}: {type(exc).__name__}: {exc}"
            continue
        finally:
            node.give(conn, ok)
        layout = _layout(reply, addr, node_at)
        if layout is not None:
            return layout, ""
        error = f"{node.name}: an empty or unreadable slot map"
    return None, error


def _layout(reply: object, asked: Node, node_at: Callable[[Node], PoolNode]) -> Layout | None:
    """A ``Layout`` from a ``CLUSTER SLOTS`` reply given by the node at ``asked``."""
    if not isinstance(reply, list) or not reply:
        return None
    owner = np.full(SLOTS, NO_NODE, dtype=np.int16)
    nodes: list[PoolNode] = []
    index: dict[Node, int] = {}
    for entry in reply:
        try:
            start, end, primary = int(entry[0]), int(entry[1]), entry[2]
            host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
            addr = (host or asked[0], int(primary[1]))
        except (TypeError, ValueError, IndexError, UnicodeDecodeError):
            return None
        if not 0 <= start <= end < SLOTS:
            return None
        if addr not in index:
            index[addr] = len(nodes)
            nodes.append(node_at(addr))
        owner[start : end + 1] = index[addr]
    return Layout(tuple(nodes), owner)

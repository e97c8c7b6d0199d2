"""Tags in a Mooncake pool: which namespaces a tag names, for ``invalidate_tag``.

Mooncake cannot list keys, so a tag's namespaces live in a fixed set of
``TAG_SLOTS`` small objects per tag (offload/mooncake/keys.py), each holding
one namespace tag (16 bytes), hard-pinned so that the pool's eviction never
drops them. A put that carries tags registers its namespace under each tag
before it writes any value (index before records), unless this process
registered it already:

    1. batch_is_exist(the tag's slots); batch_get_into(the existing ones)
    2. the namespace is listed: done; else batch_put_from(the first free slot)
    3. read that slot back: another engine may have taken it at the same
       time (a put of an existing name writes nothing); then try the next

A tag whose slots are all taken lists no more namespaces: such a put writes
nothing (it could not be invalidated), counted in
``MooncakePoolStats.tag_full``. ``invalidate_tag`` reads the slots, forgets
each namespace listed (``remove_by_regex`` of its markers, as
``forget_namespace``), then removes the slots.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from radixcache.offload.mooncake.keys import TAG_SLOTS, PoolKeys
from radixcache.offload.mooncake.link import RPC_FAIL, MooncakeLink, PoolUnavailable
from radixcache.offload.storage import record as rec


class TagFull(Exception):
    """Every slot of a tag lists another namespace."""


class TagSlots:
    """Registers and reads tags' namespaces (the writer thread calls it)."""

    def __init__(self, link: MooncakeLink, keys: PoolKeys, replicate: object) -> None:
        self._link = link
        self._keys = keys
        self._replicate = replicate
        self._buf = np.zeros(TAG_SLOTS * rec.NS_TAG_BYTES, dtype=np.uint8)
        self._known: set[tuple[str, bytes]] = set()  # (tag, ns tag) registered by this process

    def _run(self, call: Callable[..., object]) -> object:
        self._link.register(self._buf)
        return self._link.run(call)

    def listed(self, tag: str) -> dict[int, bytes]:
        """Slot -> namespace tag of every slot of ``tag`` in use. Raises PoolUnavailable."""
        names = self._keys.tag_slots(tag)
        exist = self._run(lambda store: store.batch_is_exist(names))
        assert isinstance(exist, list)
        if RPC_FAIL in exist:
            self._link.mark_down("a tag lookup found the master unreachable")
            raise PoolUnavailable("the master is unreachable")
        used = [j for j, e in enumerate(exist) if e == 1]
        if not used:
            return {}
        size = rec.NS_TAG_BYTES
        base = self._buf.ctypes.data
        got = self._run(lambda store: store.batch_get_into(
            [names[j] for j in used], [base + j * size for j in used], [size] * len(used)
        ))  # fmt: skip
        assert isinstance(got, list)
        if RPC_FAIL in got:
            raise PoolUnavailable("the master is unreachable")
        return {j: self._buf[j * size : (j + 1) * size].tobytes() for j, n in zip(used, got) if n == size}

    def register(self, tag: str, ns_tag: bytes) -> None:
        """List ``ns_tag`` under ``tag`` (see the module docstring). Raises
        PoolUnavailable, or TagFull when every slot lists another namespace."""
        if (tag, ns_tag) in self._known:
            return
        names = self._keys.tag_slots(tag)
        size = rec.NS_TAG_BYTES
        for _attempt in range(3):
            listed = self.listed(tag)
            if ns_tag in listed.values():
                self._known.add((tag, ns_tag))
                return
            free = [j for j in range(TAG_SLOTS) if j not in listed]
            if not free:
                raise TagFull(tag)
            j = free[0]
            self._buf[j * size : (j + 1) * size] = np.frombuffer(ns_tag, dtype=np.uint8)
            rc = self._run(lambda store: store.batch_put_from(
                [names[j]], [self._buf.ctypes.data + j * size], [size], self._replicate
            ))  # fmt: skip
            if isinstance(rc, list) and RPC_FAIL in rc:
                raise PoolUnavailable("the master is unreachable")
        if ns_tag in self.listed(tag).values():
            self._known.add((tag, ns_tag))
            return
        raise TagFull(tag)

    def clear(self, tag: str, slots: list[int]) -> None:
        """Remove ``slots`` of ``tag`` (after their namespaces were forgotten)."""
        names = self._keys.tag_slots(tag)
        self._run(lambda store: store.batch_remove([names[j] for j in slots], True))
        self._known = {(t, ns) for t, ns in self._known if t != tag}


def pinned(replicate: object) -> object:
    """A copy of a ReplicateConfig with hard pinning (tag slots are never evicted)."""
    from mooncake.store import ReplicateConfig

    out = ReplicateConfig()
    out.replica_num = getattr(replicate, "replica_num", 1)
    out.with_hard_pin = True
    return out


"""What the tree asks of, and tells, the tiers below the device.

The tree indexes pages and owns device residency, device eviction and locks.
Whether a node also has a copy below the device (host memory, storage) and
whether a tier job holds it are the tiers' business: the tree asks through
``LowerTiers`` (given at construction) and tells it when a node is split or
leaves the tree. ``NoLowerTiers`` is the device-only tree.
"""

from __future__ import annotations

from typing import Protocol

from radixcache.tree.node import Node
from radixcache.native import compiled as native_core  # None on the pure-Python path


class LowerTiers(Protocol):
    """What the tree asks of, and tells, the tiers below the device.

    The tiers own every node's ``host``, ``stored``, ``holds`` and
    ``loading`` fields; the tree reads none of them. Owner thread only.
    """

    def resident(self, node: Node) -> bool:
        """``node`` has a copy below the device that a match can load back:
        it stays in the tree without device pages."""
        ...

    def adoptable(self, node: Node) -> bool:
        """An insert may give device pages to ``node`` (which has none): no
        load is writing them."""
        ...

    def bare(self, node: Node) -> bool:
        """Nothing below the device refers to ``node`` (it may grow in place)."""
        ...

    def held(self, node: Node) -> bool:
        """A job in flight holds ``node``'s pages: it must stay in the tree."""
        ...

    def split(self, upper: Node, lower: Node, pages: int) -> None:
        """``lower`` was cut after ``pages`` pages; ``upper`` is the new first
        piece: share the lower tiers' fields between the two."""
        ...

    def discard(self, node: Node) -> None:
        """``node`` left the tree: release what it holds below the device."""
        ...

    def forgotten(self, node: Node) -> None:
        """``node``'s namespace was forgotten while something still holds it:
        report now that its pages left the media below the device (it stays
        allocated, silent, until it is discarded)."""
        ...


class NoLowerTiers:
    """A device-only tree: nothing lives below the device."""

    def resident(self, node: Node) -> bool:
        return False

    def adoptable(self, node: Node) -> bool:
        return True

    def bare(self, node: Node) -> bool:
        return True

    def held(self, node: Node) -> bool:
        return False

    def split(self, upper: Node, lower: Node, pages: int) -> None:
        pass

    def discard(self, node: Node) -> None:
        pass

    def forgotten(self, node: Node) -> None:
        pass


if native_core is not None:  # eviction answers its ``resident`` in C (radixcache/native/victims.pxi)
    native_core.bind_lower(NoLowerTiers)

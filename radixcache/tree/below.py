"""What the tiers below the device do to the radix tree.

``BelowDevice`` belongs to one ``RadixTree`` (built by it, driven by its
owner thread). Tier jobs (radixcache/tiers/write_jobs.py, load_jobs.py) and host
eviction (radixcache/tiers/host_tiers.py) change the tree only through it:

* a load back from the host lands: ``attach_device`` gives a host-only node
  its device pages again;
* a fetch from storage lands: ``add_leaf`` hangs a leaf with no device pages
  (the caller makes it resident below the device at once);
* host eviction drops the last copy of a node without device pages:
  ``remove_leaf``;
* a landing job checks that its node is still in the tree: ``is_attached``.

What it mutates: the tree's live roots (``add_leaf`` may create one), the
nodes it adds or removes, the tree's ``node_count`` and logical clock, and,
through the tree, device residency, its counters and the eviction candidates.
"""

from __future__ import annotations

from typing import Final, Protocol

from radixcache.namespace import Namespace
from radixcache.tree.node import Node, PageIds, TokenArray
from radixcache.tree.recording import Recorder
from radixcache.tree.removal import Candidates, NodeRemoval

GPU: Final = "GPU"  # the device medium, as the recorder names it


class GraftedTree(Protocol):
    """What the tiers' edits use of the tree they belong to (``RadixTree``)."""

    page_size: int
    recorder: Recorder
    node_count: int
    tick: int  # logical clock: +1 per match/insert/added leaf

    @property
    def eviction(self) -> Candidates: ...

    @property
    def removal(self) -> NodeRemoval: ...

    def attach_pages(self, node: Node, pages: PageIds) -> None: ...


class BelowDevice:
    """The tree edits of the tiers below the device. Owner thread only."""

    def __init__(self, tree: GraftedTree, roots: dict[Namespace, Node]) -> None:
        self.tree = tree
        self.roots = roots  # the tree's live roots (the same dict)

    def attach_device(self, node: Node, pages: PageIds) -> None:
        """Record that a ``node`` without device pages is back on the device
        in ``pages`` (a load from below finished).

        Its parent must be on the device already (load back in path order).
        """
        tree = self.tree
        parent = node.parent
        assert parent is not None and (parent.parent is None or parent.device is not None), (
            "device residency must stay prefix-closed"
        )
        assert pages.size * tree.page_size == node.key.size, "device pages do not cover the node"
        tree.attach_pages(node, pages)
        tree.recorder.stored(node, 0, int(pages.size), GPU)

    def add_leaf(self, namespace: Namespace, parent: Node | None, tokens: TokenArray) -> Node | None:
        """Add a leaf of whole pages ``tokens`` with no device pages under
        ``parent`` (None: the namespace's root, created if missing). The caller
        makes it resident below the device at once. Returns None, changing
        nothing, if ``parent`` already has a child for the first page.
        """
        tree = self.tree
        p = tree.page_size
        assert tokens.size % p == 0 and tokens.size > 0
        if parent is None:
            parent = self.roots.get(namespace)
            if parent is None:
                parent = Node(tokens[:0].copy(), None, namespace, -1)
                self.roots[namespace] = parent
        first = tokens[:p].tobytes()
        if first in parent.children:
            return None
        tree.tick += 1
        leaf = Node(tokens.copy(), parent, namespace, tree.tick)
        leaf.forgotten = parent.forgotten
        parent.children[first] = leaf
        tree.node_count += 1
        return leaf

    def remove_leaf(self, node: Node) -> None:
        """Remove a childless node without device pages whose copy below the
        device is gone (the lower tiers dropped it)."""
        assert node.device is None and not node.children and node.lock_ref == 0
        self.tree.removal.unlink(node)
        parent = node.parent
        assert parent is not None
        self.tree.eviction.update(parent)

    def is_attached(self, node: Node) -> bool:
        """True if ``node`` is still part of the tree, under a live (not
        forgotten) root."""
        parent = node.parent
        if parent is None:
            return self.roots.get(node.namespace) is node
        return (
            parent.children.get(node.key[: self.tree.page_size].tobytes()) is node
            and self.is_attached(parent)
        )

"""How nodes leave the radix tree: one leaf, whole subtrees, whole namespaces.

``NodeRemoval`` belongs to one ``RadixTree`` (built by it, driven by its
owner thread). It unlinks nodes, settles the tree's counters for what left
(``discount``: the device pages are handed back to the caller, the lower
tiers release the rest), and forgets namespaces.

Forgetting a namespace detaches its root: pages that requests or jobs still
hold stay allocated under the detached root, invisible to ``match`` and
``insert``, until ``sweep_detached`` finds them free. Their removal is
recorded at the forget; marked ``forgotten``, they report nothing after::

    live roots  {ns: root}          match/insert see these
    detached    [root(ns, forgotten) -- held nodes only]   swept when free

What it mutates: the tree's live roots (the dict it shares with the tree)
and its own list of detached roots; ``children``, ``device_children`` and
``forgotten`` of the nodes it removes or detaches; the tree's
``node_count``/``device_pages``/``evictable_pages`` counters; the eviction
candidates (a removed node leaves them, a parent left childless may join).
Nothing is removed that a lock or a job holds, except by ``remove_all``
(``RadixTree.reset``: everything goes, locks included).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Protocol

from radixcache.tree.lower import LowerTiers
from radixcache.namespace import Namespace
from radixcache.tree.node import EMPTY_PAGES, ForgetResult, Node, PageIds, concat_pages
from radixcache.tree.recording import Recorder

GPU: Final = "GPU"  # the device medium, as the recorder names it


class Candidates(Protocol):
    """The tree's eviction candidates (``DeviceEviction``)."""

    candidates: set[Node]

    def update(self, node: Node) -> None: ...

    def clear(self) -> None: ...


class PageLedger(Protocol):
    """Per-tenant device page counts a tree keeps exact when it has one
    (``radixcache.tenants.TenantLedger``); the tree only reports to it."""

    def add_device(self, namespace: Namespace, n: int, evictable: bool) -> None: ...
    def sub_device(self, namespace: Namespace, n: int, evictable: bool) -> None: ...
    def clear_device(self) -> None: ...


class RemovedTree(Protocol):
    """What removal uses of the tree it belongs to (``RadixTree``)."""

    page_size: int
    lower: LowerTiers
    recorder: Recorder
    node_count: int  # counters removal keeps exact
    device_pages: int
    evictable_pages: int
    ledger: PageLedger | None

    @property
    def eviction(self) -> Candidates: ...

    def nodes(self) -> Iterator[Node]: ...


class NodeRemoval:
    """Removal of nodes and namespaces from one tree. Owner thread only."""

    def __init__(self, tree: RemovedTree, roots: dict[Namespace, Node]) -> None:
        self.tree = tree
        self.roots = roots  # the tree's live roots (the same dict)
        self.detached: list[Node] = []  # roots of forgotten namespaces still holding pages

    # ------------------------------------------------------------------ nodes
    def unlink(self, node: Node) -> None:
        """Take a childless ``node`` out of its parent; a root left empty goes."""
        parent = node.parent
        assert parent is not None and not node.children, "removing an inner node"
        del parent.children[node.key[: self.tree.page_size].tobytes()]
        self.tree.node_count -= 1
        if parent.parent is None and not parent.children:
            if self.roots.get(parent.namespace) is parent:
                del self.roots[parent.namespace]
            elif parent in self.detached:
                self.detached.remove(parent)

    def discount(self, node: Node, dev: list[PageIds]) -> None:
        """Forget an (unlocked) node's pages in the counters; collect its
        device pages; the lower tiers release the rest."""
        tree = self.tree
        tree.node_count -= 1
        tree.eviction.candidates.discard(node)
        if node.device is not None:
            tree.recorder.removed(node, GPU)
            tree.device_pages -= node.device.size
            tree.evictable_pages -= node.device.size
            if tree.ledger is not None:
                tree.ledger.sub_device(node.namespace, int(node.device.size), True)
            dev.append(node.device)
        tree.lower.discard(node)

    def held_below(self, node: Node) -> bool:
        """True if a job in flight holds ``node`` or any descendant."""
        held = self.tree.lower.held
        return any(held(n) for n in self.subtree(node))

    @staticmethod
    def subtree(node: Node) -> Iterator[Node]:
        """``node`` and every descendant, parents before children."""
        stack = [node]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def cut(self, top: Node, dev: list[PageIds]) -> bool:
        """Remove ``top`` (a non-root node) and everything below it that no
        lock or job holds, collecting their device pages in ``dev`` (the
        caller frees them); True if all of it went. What is held stays in
        place (the caller keeps it from being served and cuts it again later)."""
        parent = top.parent
        assert parent is not None, "cutting a namespace root"
        if top.lock_ref > 0 or self.held_below(top):
            self._prune(top, dev)
            return False
        del parent.children[top.key[: self.tree.page_size].tobytes()]
        if top.device is not None:
            parent.device_children -= 1
        for gone in self.subtree(top):
            self.discount(gone, dev)
        if parent.parent is not None:
            self.tree.eviction.update(parent)  # it may have become a leaf
        elif not parent.children:
            if self.roots.get(parent.namespace) is parent:
                del self.roots[parent.namespace]
            elif parent in self.detached:
                self.detached.remove(parent)
        return True

    # ------------------------------------------------------------------ namespaces
    def forget(self, namespace: Namespace) -> ForgetResult:
        """Remove every node of ``namespace`` that no lock or job holds.

        Held nodes (and so their ancestors) stay, under the namespace's root,
        which is detached: from now on ``match`` and ``insert`` see a fresh,
        empty namespace, and ``sweep_detached`` removes the held nodes once
        nothing holds them any more. Every page of the namespace is reported
        removed (from every medium) now, held ones included; the held nodes
        are marked ``forgotten`` and report nothing more, so a later removal
        cannot contradict the namespace's new pages (same keys).
        """
        root = self.roots.pop(namespace, None)
        if root is None:
            return ForgetResult(0, 0, EMPTY_PAGES.copy())
        tree = self.tree
        dev: list[PageIds] = []
        pending = self._prune(root, dev)
        if root.children:
            self.detached.append(root)
            for kept in root.children.values():
                for node in self.subtree(kept):
                    if node.device is not None:
                        tree.recorder.removed(node, GPU)
                    tree.lower.forgotten(node)
                    node.forgotten = True
        root.forgotten = True
        d = concat_pages(dev)
        return ForgetResult(int(d.size), pending, d)

    def sweep_detached(self) -> PageIds:
        """Remove what no lock or job holds any more under forgotten roots;
        returns the device pages released (the caller frees them)."""
        if not self.detached:
            return EMPTY_PAGES
        dev: list[PageIds] = []
        for root in list(self.detached):
            self._prune(root, dev)
            if not root.children:
                self.detached.remove(root)
        return concat_pages(dev)

    def remove_all(self) -> PageIds:
        """Everything leaves, locks included (``RadixTree.reset``): returns the
        device page ids the tree held; the lower tiers clear their own side."""
        tree = self.tree
        dev = [n.device for n in tree.nodes() if n.device is not None]
        self.roots.clear()
        self.detached.clear()
        tree.eviction.clear()
        tree.recorder.cleared()
        tree.device_pages = tree.evictable_pages = tree.node_count = 0
        if tree.ledger is not None:
            tree.ledger.clear_device()
        return concat_pages(dev)

    def all_roots(self) -> list[Node]:
        """Every namespace root, live ones first, then detached (forgotten) ones."""
        return [*self.roots.values(), *self.detached]

    def namespaces(self) -> list[Namespace]:
        """The live namespaces."""
        return list(self.roots)

    @property
    def detached_count(self) -> int:
        """Roots of forgotten namespaces that still hold pages."""
        return len(self.detached)

    def _prune(self, root: Node, dev: list[PageIds]) -> int:
        """Remove every unheld subtree below ``root``; returns the device pages kept."""
        update = self.tree.eviction.update
        pending = 0
        stack = [root]
        while stack:
            node = stack.pop()
            for first, child in list(node.children.items()):
                if child.lock_ref > 0 or self.held_below(child):
                    if child.device is not None:
                        pending += child.device.size
                    stack.append(child)
                    continue
                del node.children[first]
                if child.device is not None:
                    node.device_children -= 1
                for gone in self.subtree(child):
                    self.discount(gone, dev)
            if node.parent is not None:
                update(node)  # it may have become a leaf
        return pending

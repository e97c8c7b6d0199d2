"""What the ids and keys of pages need of a tree node: its run of tokens,
its parent, its namespace, and what the two keep on it.

A page's event id and storage key both chain through its whole prefix, so
they are computed walking up to the root: storage keys are cached on every
node passed, event ids keep one id a node (``radixcache.keys.event_ids``).
The tree's ``Node`` is one; this package names the shape instead of
importing the tree, which imports it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from radixcache.namespace import Namespace


class ChainNode(Protocol):
    """A run of whole pages in a prefix tree (``radixcache.tree.node.Node``)."""

    key: npt.NDArray[np.int32]  # the run's tokens, length a multiple of the page size
    namespace: Namespace  # the partition the run belongs to
    id_pages: int  # leading pages of the run whose last event id is kept (0: none)
    last_id: int  # the event id of page ``id_pages - 1``
    keys: bytes | None  # cached 16-byte storage keys of the run's pages, concatenated

    @property
    def parent(self) -> ChainNode | None:
        """The node before this run; None at a namespace's root."""
        ...

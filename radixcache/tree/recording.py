"""What the tree and the tiers report about page residency: the
``Recorder`` contract, and ``NullRecorder`` for a cache with events off.

The tree knows no event types: a medium is its name (``"GPU"``,
``"CPU_PINNED"``, ``"DISK"``, ``"EXTERNAL"``), and the recorder given at
construction (``radixcache.recorder.EventRecorder`` when events are on) turns
reports into event records. Callers report in the order things happen: a
page's store on a new medium before its removal from the old one (invariant 5
of ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from radixcache.namespace import Namespace
from radixcache.tree.node import Node

class Recorder(Protocol):
    """What the tree and the tiers report. Owner thread only.

    A ``forgotten`` node (left under a forgotten namespace's detached root
    because something still holds it) was reported removed from every medium
    when its namespace was forgotten: reports about it are dropped.
    """

    unknown_removals: int  # storage removals of pages never announced here (not announced)

    def stored(self, node: Node, start: int, count: int, medium: str) -> None:
        """Pages ``[start, start+count)`` of ``node`` became resident on
        ``medium``. On a storage medium (DISK, EXTERNAL) their storage keys
        are those the store or read used (``tree.page_keys``, cached on the
        node): the recorder keeps them to announce the pages' removal."""
        ...

    def removed(self, node: Node, medium: str) -> None:
        """Every page of ``node`` left ``medium``."""
        ...

    def removed_keys(self, keys: Sequence[bytes], medium: str) -> None:
        """Pages known only by their 16-byte storage keys left ``medium``
        (announced under the ids they were stored with; unknown keys are not
        announced)."""
        ...

    def cleared(self) -> None:
        """Everything is gone, on every medium."""
        ...

    def stored_ids(
        self,
        block_ids: list[int],
        parent_id: int | None,
        tokens: npt.NDArray[np.int32],
        namespace: Namespace,
        medium: str,
        keys: bytes = b"",
    ) -> None:
        """Pages known by their event ids (not by a node) became resident on
        ``medium``: consecutive pages chaining from ``parent_id``, ``tokens``
        all their token ids, ``keys`` their concatenated storage keys (for
        a storage medium; storage survivors announced at start)."""
        ...



class NullRecorder:
    """Events disabled: every report is dropped."""

    unknown_removals = 0

    def stored(self, node: Node, start: int, count: int, medium: str) -> None:
        pass

    def removed(self, node: Node, medium: str) -> None:
        pass

    def removed_keys(self, keys: Sequence[bytes], medium: str) -> None:
        pass

    def cleared(self) -> None:
        pass

    def stored_ids(
        self,
        block_ids: list[int],
        parent_id: int | None,
        tokens: npt.NDArray[np.int32],
        namespace: Namespace,
        medium: str,
        keys: bytes = b"",
    ) -> None:
        pass

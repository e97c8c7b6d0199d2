"""The token radix tree: page-granular nodes, lookup, insert, split, locks,
device eviction (policies and victims), removal, and its integrity check.

The tree knows no tiers, devices, storage or events: page ids are opaque
arrays, what lives below the device is asked of the ``LowerTiers`` it is
built with (``lower.py``), and residency changes are reported to the
``Recorder`` it is given (``recording.py``).

    node.py        Node and the typed records the tree returns
    radix_tree.py  RadixTree: match, peek, insert, split, locks
    policies.py    eviction policies (which unlocked leaf goes first), registry
    eviction.py    device eviction: candidates, the heap, page-granular victims
    removal.py     nodes leaving: one leaf, subtrees, forgotten namespaces
    below.py       what the tiers below the device add to and remove from the tree
    lower.py       what the tree asks of the tiers below it (a contract)
    recording.py   what the tree reports (a contract), and the null recorder
    check.py       the integrity check
"""

from __future__ import annotations

from radixcache.tree.lower import LowerTiers, NoLowerTiers
from radixcache.tree.node import EvictResult, InsertResult, MatchResult, Node
from radixcache.tree.policies import (
    EvictionPolicy,
    eviction_policy_names,
    make_eviction_policy,
    register_eviction_policy,
)
from radixcache.tree.radix_tree import RadixTree
from radixcache.tree.recording import NullRecorder, Recorder

__all__ = [
    "EvictResult",
    "EvictionPolicy",
    "InsertResult",
    "LowerTiers",
    "MatchResult",
    "NoLowerTiers",
    "Node",
    "NullRecorder",
    "RadixTree",
    "Recorder",
    "eviction_policy_names",
    "make_eviction_policy",
    "register_eviction_policy",
]

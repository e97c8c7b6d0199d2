"""What the cache calls on its tiers below the device: the ``Tiers``
contract, and ``NullTiers``, the device-only cache where every hook does
nothing. ``HostTiers`` (radixcache/tiers/host_tiers.py) is the one with a host pool and
optional storage.

Every hook runs on the owner thread. The cache calls ``on_admit`` /
``wait_for_loads`` when it admits a request, ``on_insert`` after a commit's
insert, ``before_device_drop`` for each eviction victim, ``resolve`` /
``abandon`` when a request with pending loads steps or ends, ``poll`` every
step (the only place async results enter the tree), ``busy``,
``settle_copies`` and ``drain`` when an allocation is short, and the rest for
bulk operations and checks. No hook raises for a failing tier (it degrades
to a miss); the cache relies on that to keep every public call atomic.
"""

from __future__ import annotations

from typing import Protocol

from radixcache.namespace import Namespace
from radixcache.tree.node import EMPTY_PAGES, InsertResult, MatchResult, Node, PageIds
from radixcache.request import Request
from radixcache.tiers.config import TierStats
from radixcache.tiers.survivors import DateFetched, PutExtras


class Tiers(Protocol):
    """What the cache calls; see HostTiers for the behaviour. Owner thread only."""

    def on_admit(self, req: Request, match: MatchResult, tokens: PageIds) -> None: ...
    def wait_for_loads(self, match: MatchResult) -> bool: ...
    def on_insert(self, result: InsertResult) -> None: ...
    def before_device_drop(self, node: Node) -> None: ...
    def resolve(self, req: Request) -> None: ...
    def abandon(self, req: Request) -> None: ...
    def poll(self) -> int: ...
    def forget(self, namespace: Namespace) -> None: ...
    def invalidate_tag(self, tag: str) -> None: ...
    def busy(self) -> bool: ...
    def settle_copies(self) -> bool: ...
    def drain(self) -> bool: ...
    def reset(self) -> None: ...
    def job_device_pages(self) -> PageIds: ...
    def job_locks(self) -> dict[Node, int]: ...
    def stats(self) -> TierStats | None: ...
    def check_integrity(self) -> None: ...
    def close(self) -> None: ...
    def bind_records(self, put_extras: PutExtras, date_fetched: DateFetched | None) -> None: ...


class NullTiers:
    """The device-only cache: no host, no storage."""

    def on_admit(self, req: Request, match: MatchResult, tokens: PageIds) -> None:
        pass

    def wait_for_loads(self, match: MatchResult) -> bool:
        return False

    def on_insert(self, result: InsertResult) -> None:
        pass

    def before_device_drop(self, node: Node) -> None:
        pass

    def resolve(self, req: Request) -> None:
        pass

    def abandon(self, req: Request) -> None:
        pass

    def poll(self) -> int:
        return 0

    def forget(self, namespace: Namespace) -> None:
        pass

    def invalidate_tag(self, tag: str) -> None:
        pass

    def busy(self) -> bool:
        return False

    def settle_copies(self) -> bool:
        return False

    def drain(self) -> bool:
        return False

    def reset(self) -> None:
        pass

    def job_device_pages(self) -> PageIds:
        return EMPTY_PAGES

    def job_locks(self) -> dict[Node, int]:
        return {}

    def stats(self) -> TierStats | None:
        return None

    def check_integrity(self) -> None:
        pass

    def close(self) -> None:
        pass

    def bind_records(self, put_extras: PutExtras, date_fetched: DateFetched | None) -> None:
        pass  # nothing is stored

"""The pool's object names: records, namespace markers, and what a forget removes.

Mooncake keys are text, and the store can remove keys by regular expression
(``remove_by_regex``, evaluated by the master) but cannot list them. So::

    record  <prefix><fingerprint hex>/<page key hex>
              -> the storage record of one page (offload/storage/record.py)
    marker  <prefix><fingerprint hex>/ns/<namespace tag hex>/<page key hex>
              -> 16 bytes (the tag); "this page is live in its namespace"
    tag     <prefix><fingerprint hex>/tag/<tag id hex>/<slot 00..3f>
              -> 16 bytes: a namespace tag a put tagged with the tag (one
                 of TAG_SLOTS slots; offload/mooncake/tags.py)

Lookups and reads need only the page key (the tree does not pass the
namespace), so records carry no namespace in their name; the marker does,
so forgetting a namespace is one server-side removal of its markers
(``^<prefix><fingerprint hex>/ns/<tag hex>/``), for every engine's pages at
once. A read serves a record only while its marker exists: a record whose
marker is gone was forgotten (or its marker evicted) and is a miss, and the
reader deletes it. The fingerprint in every name binds the model (invariant
8) and scopes every removal: nothing here ever removes another model's or
another program's keys (never ``remove_all``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from radixcache.offload.storage import record


TAG_SLOTS = 64  # namespaces one tag can list in a Mooncake pool


class PoolKeys:
    """Object names of one fingerprint under one key prefix."""

    __slots__ = ("_base", "_ns", "_digest")

    def __init__(self, prefix: str, digest: bytes) -> None:
        self._base = f"{prefix}{digest.hex()}/"  # every record name starts with it
        self._ns = f"{self._base}ns/"  # every marker name starts with it
        self._digest = digest

    def records(self, rkeys: Sequence[bytes]) -> list[str]:
        """Names of the records of record keys (fingerprint digest + page key)."""
        base = self._base
        cut = record.FINGERPRINT_BYTES
        return [base + rkey[cut:].hex() for rkey in rkeys]

    def markers(self, tags: Sequence[bytes], rkeys: Sequence[bytes]) -> list[str]:
        """Names of the namespace markers of record keys, one tag per key."""
        ns = self._ns
        cut = record.FINGERPRINT_BYTES
        return [f"{ns}{tag.hex()}/{rkey[cut:].hex()}" for tag, rkey in zip(tags, rkeys)]

    def forget_pattern(self, tag: bytes) -> str:
        """The regular expression matching every marker of namespace ``tag``."""
        return "^" + re.escape(f"{self._ns}{tag.hex()}/")

    def tag_slots(self, tag: str) -> list[str]:
        """Names of the ``TAG_SLOTS`` slots listing the namespaces of ``tag``
        (scoped to the fingerprint; the tag itself is hashed)."""
        tid = hashlib.blake2b(self._digest + tag.encode(), digest_size=16).hexdigest()
        return [f"{self._base}tag/{tid}/{slot:02x}" for slot in range(TAG_SLOTS)]

"""Tags in the pool: which namespaces a tag names, for ``invalidate_tag``.

    <key prefix>tag:<tag id (16)>  ->  set of the namespace tags (16 B each)
                                      of the puts that carried the tag

A tag id is a 16-byte BLAKE2b digest of the fingerprint digest and the tag:
it scopes the set to one model (as namespace tags are: an engine forgets
only its own model's namespaces), keeps the operator's label out of key
names, and bounds their length. One set per tag is one key on one cluster
node; it lists namespaces, not values, so it stays small.

A put that carries tags adds its namespace to each tag's set in the
pipeline of its first chunk, before any of its values (index before
records, as the namespace index): a put whose tag could not be recorded
stores nothing. ``invalidate_tag`` reads the set, forgets every namespace
in it (offload/valkey/lifetime/forget.py: the namespace index sets, on
every node), then takes exactly those members out of the set (a set left
empty is gone); when a forget fails the set is left as it was, so a later
call finds the namespaces again. A namespace a put adds while the call
runs stays listed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from radixcache.offload.valkey.link import Command

TAG_ID_BYTES = 16


class TagSets:
    """The tag sets of one fingerprint under one key prefix."""

    def __init__(self, key_prefix: bytes, digest: bytes) -> None:
        self._prefix = key_prefix + b"tag:"
        self._digest = digest

    def key(self, tag: str) -> bytes:
        """The set listing the namespaces tagged ``tag``."""
        tid = hashlib.blake2b(self._digest + tag.encode(), digest_size=TAG_ID_BYTES).digest()
        return self._prefix + tid

    def adds(self, tags: Sequence[str], ns_tag: bytes) -> list[Command]:
        """The commands recording namespace ``ns_tag`` under each of ``tags``."""
        return [("SADD", self.key(tag), ns_tag) for tag in tags]

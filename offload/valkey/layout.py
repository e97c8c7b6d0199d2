"""Where pages live in the pool: values of several pages, their keys, the namespace index.

Keys and values::

    <key prefix><record key of a value's LAST page>  ->  the records of 1 to 4N
                                                        consecutive pages of one
                                                        prefix (offload/storage/chunk.py)
    <key prefix>ns:<tag>:{<slot tag>}               ->  set of the value keys put
                                                        under one namespace (one
                                                        of ``namespace_shards``)

A record key binds the whole prefix up to its page (page keys are chained),
so the key of a value's last page names the value, and every record in it
is verified on its own: its full key, tokens and checksum.

**Where values are cut** (N = ``ValkeyConfig.pages_per_value``): after
every *boundary* page, a page whose key hashes to 0 modulo N (so one page
in N on average, decided by the key alone: every writer cuts a prefix at
the same places, and a second writer's put of the same pages finds the
value there), after 4N pages without a boundary, and at the end of a put.
Raw pages (keyed by a serving engine, looked up in any order) are one page
per value. With N = 1 every page is a boundary: one page per value, the
layout of pools written before values held several pages.

**Finding a page** (``leading``): a page is stored if the first value at or
after it (in prompt order) reaches back to it. A value never spans a
boundary, so a boundary page with no value ends the search: the pages up to
it are missing. A lookup asks, per key, how many records the value under it
holds (0: none) and stops at the first boundary key with none.

**The namespace index** is split into ``namespace_shards`` sets by the hash
slot of the value key (``IndexSets``), so no one set (one key on one
cluster node) holds a tenant's whole index, and each set lives with the
values it lists; removals this process sees are taken out of them again.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot

from radixcache.offload.storage import chunk
from radixcache.offload.valkey.topology import SLOTS

CHUNK_CAP = 4  # a value holds at most CHUNK_CAP * N pages (without a boundary)

# Per key, how many records the value under it holds (0: no value; 1: a bare
# record or a value of another type), up to the first boundary key without
# a value. ARGV[1] holds one flag per key ("1": a boundary), ARGV[2..] the keys.
COUNTS = """#!lua flags=no-writes,allow-cross-slot-keys
local flags = ARGV[1]
local out = {}
for i = 2, #ARGV do
  local v = redis.pcall('GETRANGE', ARGV[i], 0, 7)
  local n = 0
  if type(v) == 'table' then
    n = 1
  elseif #v > 0 then
    n = 1
    if #v == 8 and string.sub(v, 1, 4) == 'RXCK' and string.byte(v, 5) == 1
        and string.byte(v, 6) == 0 then
      local c = string.byte(v, 7) + 256 * string.byte(v, 8)
      if c >= 2 and c <= 4096 then n = c end
    end
  end
  out[#out + 1] = n
  if n == 0 and string.sub(flags, i - 1, i - 1) == '1' then break end
end
return out
"""


class IndexSets:
    """The sets a namespace's index is split into (see the module docstring).

    Set ``j`` lists the values whose hash slot lies in the j-th of
    ``shards`` equal slot ranges, and its key carries a hash tag that puts
    it in that same range: on a cluster it lives on the node of (nearly
    all) the values it lists, so a node that is down costs its own puts
    only, and a put's SADD reaches its node before the SETs it indexes."""

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self._tags = _slot_tags(shards)

    def key(self, key_prefix: bytes, ns_tag: bytes, value_key: bytes) -> bytes:
        """The set listing the value under pool key ``value_key``."""
        return self.nth(key_prefix, ns_tag, key_slot(value_key) * self.shards // SLOTS)

    def nth(self, key_prefix: bytes, ns_tag: bytes, j: int) -> bytes:
        return key_prefix + b"ns:" + ns_tag + b":{" + self._tags[j] + b"}"

    def every(self, key_prefix: bytes, ns_tag: bytes) -> list[bytes]:
        """Every set of a namespace, and the one set of pools written before
        the index was split."""
        sets = [self.nth(key_prefix, ns_tag, j) for j in range(self.shards)]
        return [*sets, key_prefix + b"ns:" + ns_tag]


def _slot_tags(shards: int) -> list[bytes]:
    """Per slot range j of ``shards``, a short hash tag whose slot lies in it."""
    tags: list[bytes | None] = [None] * shards
    left, i = shards, 0
    while left:
        tag = b"%x" % i
        j = key_slot(tag) * shards // SLOTS
        if tags[j] is None:
            tags[j] = tag
            left -= 1
        i += 1
    return [t for t in tags if t is not None]


class Cuts:
    """Where values are cut for N pages per value (see the module docstring)."""

    def __init__(self, pages_per_value: int) -> None:
        if pages_per_value < 1:
            raise ValueError(f"pages_per_value must be >= 1, got {pages_per_value}")
        self.n = pages_per_value
        self.cap = CHUNK_CAP * pages_per_value  # the most pages in one value

    def boundary(self, rkey: bytes) -> bool:
        """Whether a value must end at the page of record key ``rkey``."""
        return self.n == 1 or zlib.crc32(rkey) % self.n == 0

    def flags(self, rkeys: Sequence[bytes]) -> list[bool]:
        return [self.boundary(k) for k in rkeys]

    def runs(self, rkeys: Sequence[bytes], raw: bool) -> list[tuple[int, int]]:
        """The values a put of ``rkeys`` writes: ``[start, end)`` page ranges,
        in order, covering every page once. Raw pages: one page per value."""
        if raw or self.n == 1:
            return [(i, i + 1) for i in range(len(rkeys))]
        out: list[tuple[int, int]] = []
        start = 0
        for i, key in enumerate(rkeys):
            if self.boundary(key) or i + 1 - start >= self.cap or i + 1 == len(rkeys):
                out.append((start, i + 1))
                start = i + 1
        return out


def leading(counts: Sequence[int], flags: Sequence[bool]) -> int:
    """Leading pages stored, from each key's value record count (0: no
    value; a count past a key's reach covers pages before the first) and
    each key's boundary flag (see the module docstring)."""
    n = len(counts)
    i = 0
    while i < n:
        j = i
        while counts[j] == 0:
            if flags[j]:
                return i  # a boundary without a value: page i is not stored
            j += 1
            if j == n:
                return i  # the value holding page i ends past these keys, if any
        if j - counts[j] + 1 > i:
            return i  # the first value after page i does not reach back to it
        i = j + 1
    return n


def wrote(reply: Any) -> bool:
    """Whether a SET reply (unparsed: ``OK`` or nil) says it wrote."""
    return reply == b"OK" or reply is True


def value_pages(reply: Any) -> int:
    """Pages a value reaches back over, from its first bytes (a GETRANGE
    reply); 0 when there is no value (or the reply is no value)."""
    if not isinstance(reply, bytes) or not reply:
        return 0
    return chunk.value_count(reply)


def next_boundaries(flags: Sequence[bool]) -> list[int]:
    """Per position, the first boundary at or after it (``len(flags)``: none)."""
    out = [len(flags)] * len(flags)
    nxt = len(flags)
    for i in range(len(flags) - 1, -1, -1):
        if flags[i]:
            nxt = i
        out[i] = nxt
    return out

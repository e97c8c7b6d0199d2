"""Per-tenant byte quotas in the pool, kept by the server with every write.

The pool is shared by engines, so a tenant's bytes are counted where they
are: on the server. Per tenant and node, two keys::

    <key prefix>tq:{<node tag>}:<tenant id (16)>:s  ->  hash: value key -> its bytes;
                                                        field "#": their sum
    <key prefix>tq:{<node tag>}:<tenant id (16)>:o  ->  sorted set: value keys by
                                                        write order (the write seq)

The tenant id is a 16-byte BLAKE2b digest of the tenant (a salt may be a
secret; someone who reads the pool can still confirm a guessed one). A put
of a tenant with a limit writes its values through ``QUOTA_SET``, a Lua
script that, atomically with each SET: takes the value's old size off the
sum when it replaces one, evicts the tenant's *own* oldest values until the
new one fits (never another tenant's, never values of the same put), writes
it with its expiry, and records its size and order. A value that cannot fit
(larger than the limit, or than what the put's own earlier values leave)
is not written: the put stops there and keeps its leading pages; the pages
it did not write are counted per tenant (``dropped_pages``). Nothing is
raised into the caller.

Stale figures: a value that expires, that the server evicts under
``maxmemory``, or that a forget or another engine deletes, stays in the
tenant's figures until the script meets it as the oldest when it must make
room: it is then dropped from them without counting as an eviction. The sum
therefore never undercounts: a tenant never holds more than its limit, and
may hold less while stale entries wait. The accounting keys have no TTL, so
``volatile-lru`` never evicts them.

**Where the limit is kept.** A single server keeps one pair of keys per
tenant: the limit is exact. On a cluster a script runs on one node and may
touch only that node's keys, so each primary keeps the figures of the
tenant's values it holds, under a hash tag whose slot it serves (``{node
tag}``), and enforces its share of the limit: ``limit * slots it serves /
16384`` (values spread over slots evenly, so the shares add up to the
limit). A value larger than its node's share is dropped. When slots move
between nodes (resharding, a failover to a node that served others), the
figures of the moved values stay behind with the old tag until met as
stale, and a node whose tag moved starts counting again under a new one.

There is no floor: the server evicts under its own memory pressure
(``maxmemory``) whatever a tenant holds, so a floor could not be kept.
Limits are this engine's (``ValkeyConfig.tenant_quotas``,
``ValkeyStorage.set_tenant_quotas``); engines sharing a pool should give the
same ones. Values of tenants without a limit are not counted, so a limit
set later counts the values written from then on. The script needs
``EVAL`` (a user without it has its quota puts refused and counted as
failed).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from radixcache.offload.valkey.config import check_tenant_limits
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable
from radixcache.offload.valkey.topology import SLOTS, Layout

TenantKey = bytes | None
TOTAL = b"#"  # the field of the sizes hash holding their sum
WROTE, THERE, DROPPED = 1, 0, -1  # per value: written, one there already (NX), did not fit

# KEYS: the tenant's sizes hash and order set on this node. ARGV: the node's
# share of the limit, the put's first and last write seq (seqs stay strings:
# Lua would print them with 14 digits), then per value: "N" (unless one is
# there) or "R" (in place of it), its key, its bytes, PX ms (0: none), its seq.
# Returns {per value {outcome, head before}, evicted keys, stale entries dropped}.
QUOTA_SET = """#!lua flags=allow-cross-slot-keys
local sizes, order = KEYS[1], KEYS[2]
local limit, lo, hi = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local total = tonumber(redis.call('HGET', sizes, '#') or '0')
local own = 0
for _, key in ipairs(redis.call('ZRANGEBYSCORE', order, ARGV[2], ARGV[3])) do
  own = own + tonumber(redis.call('HGET', sizes, key) or '0')
end
local out, gone, stale = {}, {}, 0
for i = 4, #ARGV, 5 do
  local mode, key, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local px, seq = tonumber(ARGV[i + 3]), ARGV[i + 4]
  local head = redis.call('GETRANGE', key, 0, 7)
  if mode == 'N' and #head > 0 then
    out[#out + 1] = {0, head}
  else
    local old = tonumber(redis.call('HGET', sizes, key) or '0')
    local old_seq = redis.call('ZSCORE', order, key)
    if old_seq then
      redis.call('ZREM', order, key)
      redis.call('HDEL', sizes, key)
      total = total - old
    end
    local size = #value
    if own + size > limit then
      if old_seq then
        redis.call('HSET', sizes, key, old)
        redis.call('ZADD', order, old_seq, key)
        total = total + old
      end
      out[#out + 1] = {-1, head}
      break
    end
    while total + size > limit do
      local first = redis.call('ZRANGE', order, 0, 0, 'WITHSCORES')
      if #first == 0 or tonumber(first[2]) >= lo and tonumber(first[2]) <= hi then
        total = own
        break
      end
      local victim = first[1]
      total = total - tonumber(redis.call('HGET', sizes, victim) or '0')
      redis.call('ZREM', order, victim)
      redis.call('HDEL', sizes, victim)
      if redis.call('DEL', victim) == 1 then gone[#gone + 1] = victim else stale = stale + 1 end
    end
    if px > 0 then
      redis.call('SET', key, value, 'PX', px)
    else
      redis.call('SET', key, value)
    end
    redis.call('HSET', sizes, key, size)
    redis.call('ZADD', order, seq, key)
    total = total + size
    own = own + size
    out[#out + 1] = {1, head}
  end
end
redis.call('HSET', sizes, '#', total)
return {out, gone, stale}
"""


def tenant_id(tenant: TenantKey) -> bytes:
    """The id a tenant's accounting keys carry (see the module docstring)."""
    person = b"rxpool-none" if tenant is None else b"rxpool-tenant"
    return hashlib.blake2b(tenant or b"", digest_size=16, person=person).digest()


@dataclass(frozen=True, slots=True)
class QuotaValue:
    """One value a quota put writes."""

    key: bytes  # its pool key
    value: Any  # its bytes (a ``Scattered``)
    rewrite: bool  # replace what is there (else: only if nothing is)
    seq: int  # its place in the tenant's write order


@dataclass(frozen=True, slots=True)
class QuotaReply:
    """What the script did with one value."""

    outcome: int  # WROTE, THERE or DROPPED
    head: bytes  # the first bytes of the value that was there before (b"": none)


@dataclass(frozen=True, slots=True)
class TenantPoolStats:
    """One tenant's share of the pool (``ValkeyStorage.tenant_stats``)."""

    stored_bytes: int  # value bytes counted for it now, over every node (stale ones included)
    values: int  # values counted for it now
    limit_bytes: int | None  # its limit as this engine has it (None: none)
    quota_evicted: int  # its values this engine's puts evicted to keep it within its limit
    dropped_pages: int  # its pages this engine did not write: over its limit
    past_deadline: int  # its pages this engine did not write: their retention deadline had passed


class TenantLimits:
    """This engine's per-tenant limits and counts; thread-safe."""

    def __init__(self, quotas: Mapping[TenantKey, int | None], default: int | None) -> None:
        self._lock = threading.Lock()
        self._quotas, self._default = check_tenant_limits(quotas, default)
        self._counts: dict[TenantKey, list[int]] = {}  # [evicted, dropped, past deadline]

    def limit(self, tenant: TenantKey) -> int | None:
        """The bytes ``tenant`` may keep in the pool (None: no limit)."""
        return self._quotas.get(tenant, self._default)

    def replace(self, quotas: Mapping[TenantKey, int | None], default: int | None) -> None:
        """Use ``quotas`` and ``default`` from now on (checked first)."""
        checked = check_tenant_limits(quotas, default)
        with self._lock:
            self._quotas, self._default = checked

    def count(self, tenant: TenantKey, *, evicted: int = 0, dropped: int = 0, past: int = 0) -> None:
        with self._lock:
            counts = self._counts.setdefault(tenant, [0, 0, 0])
            counts[0] += evicted
            counts[1] += dropped
            counts[2] += past

    def tenants(self) -> list[TenantKey]:
        """Every tenant with a limit of its own or a count."""
        with self._lock:
            return list(dict.fromkeys([*self._quotas, *self._counts]))

    def counts(self, tenant: TenantKey) -> tuple[int, int, int]:
        with self._lock:
            evicted, dropped, past = self._counts.get(tenant, (0, 0, 0))
        return evicted, dropped, past


class QuotaBook:
    """Runs quota puts and reads tenants' figures (see the module docstring)."""

    def __init__(self, link: PoolLink) -> None:
        self._link = link
        self._prefix = link.config.key_prefix + b"tq:"
        self._tags: tuple[Layout | None, list[bytes]] = (None, [])  # node tags of a layout

    def keys(self, tenant: TenantKey, tag: bytes) -> tuple[bytes, bytes]:
        """The sizes hash and the order set of ``tenant`` under node tag ``tag``."""
        base = self._prefix + b"{" + tag + b"}:" + tenant_id(tenant)
        return base + b":s", base + b":o"

    def node_tags(self, layout: Layout) -> list[bytes]:
        """Per node of ``layout``, a hash tag whose slot it serves (``b"0"`` on one server)."""
        known, tags = self._tags
        if known is layout:
            return tags
        if layout.owner is None:
            tags = [b"0"]
        else:
            found: dict[int, bytes] = {}
            i = 0
            while len(found) < len(layout.nodes) and i < 1 << 20:
                tag = b"%x" % i
                found.setdefault(int(layout.owner[key_slot(tag)]), tag)
                i += 1
            tags = [found.get(k, b"-") for k in range(len(layout.nodes))]
        self._tags = (layout, tags)
        return tags

    def store(
        self,
        tenant: TenantKey,
        limit: int,
        values: list[QuotaValue],
        expiry_ms: int,
        seqs: tuple[int, int],
    ) -> tuple[list[QuotaReply | Exception], list[bytes], int]:
        """Write ``values`` of ``tenant`` within ``limit`` bytes, one script call
        per node, all in one round trip. ``seqs``: the put's first and last
        write seq (its own values are never evicted). Returns per value a
        ``QuotaReply`` or the error that stopped it (a ``PoolUnavailable``,
        a refused script; DROPPED for values after one that did not fit),
        the pool keys of the values evicted, and how many stale entries
        were dropped from the figures."""
        self._link.primaries()  # learns the slot map if it must
        layout = self._link.layout()
        if layout is None:
            down = PoolUnavailable(f"pool {self._link.config.describe()} unavailable")
            return [down] * len(values), [], 0
        tags = self.node_tags(layout)

        def command(positions: list[int]) -> tuple[Any, ...]:
            node = layout.node_index(values[positions[0]].key)
            share = limit if layout.owner is None else limit * layout.slots_of(layout.nodes[node]) // SLOTS
            sizes, order = self.keys(tenant, tags[node])
            args: list[Any] = [share, seqs[0], seqs[1]]
            for i in positions:
                v = values[i]
                args += ["R" if v.rewrite else "N", v.key, v.value, expiry_ms, v.seq]
            return ("EVAL", QUOTA_SET, 2, sizes, order, *args)

        nbytes = sum(getattr(v.value, "nbytes", 0) for v in values)
        replies = self._link.per_node([v.key for v in values], command, nbytes=nbytes)
        out: list[QuotaReply | Exception] = [QuotaReply(DROPPED, b"")] * len(values)
        gone: list[bytes] = []
        stale = 0
        for positions, reply in replies:
            if isinstance(reply, Exception) or not isinstance(reply, list) or len(reply) != 3:
                error = reply if isinstance(reply, Exception) else RuntimeError(f"quota script: {reply!r}")
                for i in positions:
                    out[i] = error
                continue
            for i, (outcome, head) in zip(positions, reply[0]):
                out[i] = QuotaReply(int(outcome), bytes(head))
            gone += reply[1]
            stale += int(reply[2])
        return out, gone, stale

    def figures(self, tenants: Iterable[TenantKey]) -> dict[TenantKey, tuple[int, int]]:
        """Per tenant, (bytes, values) counted on every node now, in one round
        trip; a node that is down counts nothing."""
        self._link.primaries()
        layout = self._link.layout()
        tenants = list(tenants)
        out: dict[TenantKey, tuple[int, int]] = dict.fromkeys(tenants, (0, 0))
        if layout is None or not tenants:
            return out
        commands: list[tuple[Any, ...]] = []
        for tenant in tenants:
            for tag in self.node_tags(layout):
                sizes, order = self.keys(tenant, tag)
                commands += [("HGET", sizes, TOTAL), ("ZCARD", order)]
        replies = self._link.run(commands)
        per = 2 * len(self.node_tags(layout))
        for t, tenant in enumerate(tenants):
            nbytes = values = 0
            for total, card in zip(replies[t * per : (t + 1) * per : 2], replies[t * per + 1 : (t + 1) * per : 2]):
                nbytes += int(total) if isinstance(total, (bytes, int)) else 0
                values += card if isinstance(card, int) else 0
            out[tenant] = (nbytes, values)
        return out

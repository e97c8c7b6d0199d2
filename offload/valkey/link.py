"""The connection to the pool: commands routed to their nodes, one round trip a call.

Every command this library sends goes through ``PoolLink``: a call groups
its commands by the node that serves each key (offload/valkey/topology.py),
writes every node's pipeline first and then reads every answer, so one
call is one round trip of wall time however the keys spread. Keys are not
hash-tagged: tagging a prompt's keys onto one node would put every prompt
that starts with the same system prompt on the same node.

What a reply is (``run``): a value, a command error (a ``ResponseError`` the
server gave this command alone: out of memory under ``noeviction``, a key
of another type), or a ``PoolUnavailable``: the command could not be served
now. Unavailable is never a verdict on the data:

* a node that cannot be reached, times out, refuses the login, is loading
  its data (``LOADING``), is a replica (``READONLY``), says its cluster is
  down (``CLUSTERDOWN``, ``MASTERDOWN``) or is busy (``BUSY``) is marked down
  for ``retry_after_s``; its keys are unavailable at once during that
  window, without a connection attempt; the other nodes serve theirs;
* ``MOVED`` (the slot map changed), ``ASK`` / ``TRYAGAIN`` (a slot being
  migrated) and slots nobody serves make that command unavailable; after a
  ``MOVED`` or a node's failure the slot map is learnt again (at most once
  per ``retry_after_s``), from any node that answers.

Time bound: a call returns within ``connect_timeout_s + socket_timeout_s``,
plus one second per 64 MiB it moves, however many nodes it touches, whether
they stall, and whether it (re)connects or learns the slot map first; a
node that has not answered by then is marked down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.connection import Connection

from radixcache.offload.rate_limit import RateLimitedLog
from radixcache.offload.storage import StorageUnavailable
from radixcache.offload.valkey.bulk import BulkReader, Destination, ErrorReply
from radixcache.offload.valkey.config import Node, ValkeyConfig
from radixcache.offload.valkey.nodes import PoolNode, connection_kwargs
from radixcache.offload.valkey.topology import NO_NODE, Layout, discover, single

log = logging.getLogger(__name__)

Command = tuple[Any, ...]  # (name, key, *args): every command here names one key first
MOVE_RATE = 64 << 20  # bytes per second a call is allowed on top of its timeouts

# Reply errors that say "not now" about the node, never about the data.
_NODE_DOWN = (
    redis.exceptions.BusyLoadingError,  # LOADING
    redis.exceptions.ReadOnlyError,  # READONLY: a replica now (a failover happened)
    redis.exceptions.MasterDownError,  # MASTERDOWN
)
_NODE_DOWN_TEXT = ("LOADING", "READONLY", "MASTERDOWN", "BUSY", "NOAUTH", "WRONGPASS")
_COMMAND_UNAVAILABLE_TEXT = ("MOVED", "ASK", "TRYAGAIN", "NOREPLICAS")


class PoolUnavailable(StorageUnavailable):
    """The pool (or the node serving a key) cannot be used now: down, timing
    out, refusing the credentials, loading, or its cluster reorganising."""


class PoolLink:
    """A thread-safe handle on the pool's nodes. Any thread may call it."""

    def __init__(self, config: ValkeyConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._nodes: dict[Node, PoolNode] = {}
        first = self._node(config.nodes[0])
        self._layout: Layout | None = None if config.cluster else single(first)
        self._stale = config.cluster  # the slot map must be learnt (again)
        self._learnt_at = float("-inf")  # monotonic time of the last discovery attempt
        self._learning = threading.Lock()
        self._closed = False
        self._last_error = ""
        self._listeners: list[Callable[[], None]] = []
        self._warn = RateLimitedLog(log, interval_s=30.0)
        self.round_trips = 0  # calls that reached at least one node
        self.unavailable_replies = 0  # commands answered "not now"
        self.discoveries = 0  # slot maps learnt

    # -- health and layout --------------------------------------------------------
    def _node(self, addr: Node) -> PoolNode:
        with self._lock:
            node = self._nodes.get(addr)
            if node is None:
                node = self._nodes[addr] = PoolNode(addr, self.config)
            return node

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the calling thread; keep it short) whenever a
        node answers after it was down or never reached, or the slot map changed."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def available(self) -> bool:
        """False while every node is down (or none was ever reached)."""
        layout = self._layout
        return layout is not None and any(n.available() for n in layout.nodes)

    @property
    def last_error(self) -> str:
        return self._last_error

    @property
    def connects(self) -> int:
        """Connections opened to any node (the first ones, then reconnects)."""
        with self._lock:
            return sum(n.connects for n in self._nodes.values())

    @property
    def failures(self) -> int:
        """Times a node was marked down."""
        with self._lock:
            return sum(n.failures for n in self._nodes.values())

    def primaries(self) -> tuple[PoolNode, ...]:
        """The nodes of the current layout (learning it first if needed)."""
        layout = self._current(self._deadline(0))
        return () if layout is None else layout.nodes

    def layout(self) -> Layout | None:
        """The current layout, without learning it (None before the first)."""
        return self._layout

    def _current(self, deadline: float) -> Layout | None:
        """The layout to route by; learnt first when it is stale (one thread at
        a time; the others go on with the old one, or none)."""
        if self._closed:
            return None
        layout = self._layout
        if not self._stale:
            return layout
        now = time.monotonic()
        if now - self._learnt_at < self.config.retry_after_s and layout is not None:
            return layout
        if not self._learning.acquire(timeout=max(0.0, deadline - now) if layout is None else 0):
            return layout
        try:
            if not self._stale or time.monotonic() - self._learnt_at < self.config.retry_after_s:
                return self._layout
            self._learnt_at = time.monotonic()
            candidates = [n.addr for n in layout.nodes if n.available()] if layout else []
            candidates += [n.addr for n in layout.nodes if not n.available()] if layout else []
            candidates += [a for a in self.config.nodes if a not in candidates]
            learnt, error = discover(self.config, candidates, self._node, deadline)
            if learnt is None:
                self._down_all(f"no node answered CLUSTER SLOTS ({error})")
                return layout
            before = set() if layout is None else {n.addr for n in layout.nodes}
            changed = before != {n.addr for n in learnt.nodes}
            self._layout, self._stale = learnt, False
            self.discoveries += 1
        finally:
            self._learning.release()
        if changed:
            self._notify()
        return learnt

    def _down_all(self, error: str) -> None:
        self._last_error = self._redact(error)
        self._warn.warning("pool %s unavailable (%s)", self.config.describe(), self._last_error)

    def _mark_down(self, node: PoolNode, exc: BaseException | str) -> None:
        text = self._redact(exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}")
        self._last_error = text
        if self.config.cluster:
            self._stale = True  # a failover may follow: learn the map again
        if node.mark_down(text, self.config.retry_after_s):
            log.warning(
                "pool %s: node %s unavailable (%s); its keys are misses for %.1f s",
                self.config.describe(), node.name, text, self.config.retry_after_s,
            )  # fmt: skip

    def _redact(self, text: str) -> str:
        password = self.config.password
        return text.replace(password, "***") if password else text

    def _unavailable(self, why: str) -> PoolUnavailable:
        self.unavailable_replies += 1
        return PoolUnavailable(f"pool {self.config.describe()} unavailable: {self._redact(why)}")

    # -- calls ------------------------------------------------------------------------
    def run(self, commands: Sequence[Command], *, nbytes: int = 0) -> list[Any]:
        """Send ``commands`` (each naming its key first) in one round trip;
        returns one reply per command (see the module docstring). Never raises
        for the pool's state: what could not be served is a ``PoolUnavailable``.
        ``nbytes``: about how many bytes the call moves (for its time bound)."""
        out: list[Any] = [None] * len(commands)

        def read(node: PoolNode, conn: Connection, positions: list[int]) -> list[Any]:
            return [self._judge(node, self._reply(conn)) for _ in positions]

        keys = [command[1] for command in commands]
        calls = self._call(keys, lambda ps: [commands[i] for i in ps], read, nbytes)
        for positions, replies in calls:
            for i, reply in zip(positions, replies):
                out[i] = reply
        return out

    def per_node(
        self, keys: Sequence[bytes], command: Callable[[list[int]], Command], *, nbytes: int = 0
    ) -> list[tuple[list[int], Any]]:
        """Send ``command(positions in keys of the keys a node serves)`` to
        every node serving some of ``keys``, all at once: one round trip.
        Returns ``(positions, reply)`` per node; a reply may be a command
        error or a ``PoolUnavailable``."""

        def read(node: PoolNode, conn: Connection, positions: list[int]) -> list[Any]:
            return [self._judge(node, self._reply(conn))]

        calls = self._call(keys, lambda ps: [command(ps)], read, nbytes)
        return [(positions, replies[0]) for positions, replies in calls]

    def get_into(
        self, keys: Sequence[bytes], dest: Callable[[int], Destination], *, nbytes: int = 0
    ) -> list[Any]:
        """GET ``keys`` in one round trip, every value parsed off the socket
        (offload/valkey/bulk.py): record ``r`` of the value of ``keys[i]`` lands
        where ``dest(i)(count, r, kv_bytes)`` says. Returns per key: None
        (missing), the value's record heads, an ``ErrorReply`` about the data
        (a key of another type), or a ``PoolUnavailable``."""
        out: list[Any] = [None] * len(keys)

        def read(node: PoolNode, conn: Connection, positions: list[int]) -> list[Any]:
            assert conn._sock is not None
            reader = BulkReader(conn._sock)
            replies: list[Any] = []
            for i in positions:
                got = reader.value_into(dest(i))
                if isinstance(got, ErrorReply) and not got.text.startswith("WRONGTYPE"):
                    got = self._error_text(got.text, node)
                replies.append(got)
            return replies

        calls = self._call(keys, lambda ps: [("GET", keys[i]) for i in ps], read, nbytes)
        for positions, replies in calls:
            for i, reply in zip(positions, replies):
                out[i] = reply
        return out

    def each_node(self, *command: Any) -> list[tuple[PoolNode, Any]]:
        """``command`` (not keyed: CONFIG GET, DBSIZE, INFO) on every primary at
        once; one reply per node (a ``PoolUnavailable`` for one that failed).
        Housekeeping: not counted in ``round_trips``."""
        deadline = self._deadline(0)
        layout = self._current(deadline)
        if layout is None:
            return []
        sent = [(node, self._send(node, [command], deadline)) for node in layout.nodes]
        out: list[tuple[PoolNode, Any]] = []
        for node, conn in sent:
            out.append((node, self._receive(node, conn, [0], deadline, self._read_one)[0]))
        return out

    def _read_one(self, node: PoolNode, conn: Connection, positions: list[int]) -> list[Any]:
        return [self._judge(node, self._reply(conn))]

    # -- the exchange ------------------------------------------------------------------
    def _deadline(self, nbytes: int) -> float:
        cfg = self.config
        return time.monotonic() + cfg.connect_timeout_s + cfg.socket_timeout_s + nbytes / MOVE_RATE

    def _call(
        self,
        keys: Sequence[bytes],
        commands_of: Callable[[list[int]], list[Command]],
        read: Callable[[PoolNode, Connection, list[int]], list[Any]],
        nbytes: int,
    ) -> list[tuple[list[int], list[Any]]]:
        """Route ``keys``' commands to their nodes, write every node's pipeline,
        then read each node's replies with ``read``. Returns (positions, replies)
        per node; a node that could not be used answers unavailable for all."""
        if not keys:
            return []
        deadline = self._deadline(nbytes)
        layout = self._current(deadline)
        if layout is None:
            why = self._last_error or "no node reached yet"
            return [(list(range(len(keys))), [self._unavailable(why)] * len(keys))]
        sent: list[tuple[PoolNode | None, Connection | None, list[int]]] = []
        for index, positions in layout.group(keys).items():
            node = layout.nodes[index] if index != NO_NODE else None
            conn = None
            if node is not None and node.available():
                conn = self._send(node, commands_of(positions), deadline)
            sent.append((node, conn, positions))
        if any(conn is not None for _n, conn, _p in sent):
            self.round_trips += 1
        out = []
        for node, conn, positions in sent:
            if node is None:
                unserved = self._unavailable("slot served by no node")
                out.append((positions, [unserved] * len(positions)))
            else:
                out.append((positions, self._receive(node, conn, positions, deadline, read)))
        return out

    def _receive(
        self,
        node: PoolNode,
        conn: Connection | None,
        positions: list[int],
        deadline: float,
        read: Callable[[PoolNode, Connection, list[int]], list[Any]],
    ) -> list[Any]:
        """``read`` the replies of a pipeline sent on ``conn`` (None: not sent)."""
        if conn is None:
            return [self._unavailable(f"node {node.name}: {node.last_error}")] * len(positions)
        ok = False
        try:
            self._settimeout(conn, deadline)
            replies = read(node, conn, positions)
            ok = True
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            self._mark_down(node, exc)
            return [self._unavailable(f"node {node.name}: {exc}")] * len(positions)
        finally:
            node.give(conn, ok)
        return replies

    def _send(self, node: PoolNode, commands: list[Command], deadline: float) -> Connection | None:
        """Write ``commands`` to ``node`` as one pipeline; the connection to read
        the replies from, or None (the node is then marked down)."""
        remaining = deadline - time.monotonic()
        if not node.available():
            return None
        if remaining <= 0:
            self._mark_down(node, "no time left in the call")
            return None
        try:
            conn = node.take(min(self.config.connect_timeout_s, remaining))
        except (redis.exceptions.RedisError, OSError) as exc:
            self._mark_down(node, exc)
            return None
        if node.came_up():
            self._notify()
        try:
            self._settimeout(conn, deadline)
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except (redis.exceptions.RedisError, OSError) as exc:
            node.give(conn, False)
            self._mark_down(node, exc)
            return None
        return conn

    @staticmethod
    def _settimeout(conn: Connection, deadline: float) -> None:
        if conn._sock is not None:
            conn._sock.settimeout(max(0.001, deadline - time.monotonic()))

    @staticmethod
    def _reply(conn: Connection) -> Any:
        """The next reply on ``conn``; an error reply as its exception object."""
        try:
            return conn.read_response()
        except redis.exceptions.ResponseError as exc:
            return exc

    def _judge(self, node: PoolNode, reply: Any) -> Any:
        """``reply`` as the caller sees it: a "not now" error is unavailable."""
        if isinstance(reply, redis.exceptions.ResponseError):
            code = getattr(reply, "status_code", None)
            text = f"{code} {reply}" if code else str(reply)
            return self._error_text(text, node, reply)
        return reply

    def _error_text(
        self, text: str, node: PoolNode | None, exc: BaseException | None = None
    ) -> Any:
        """Classify an error reply: node-level "not now" errors (see the module
        docstring) mark the node down; ``MOVED``, ``ASK``, ``TRYAGAIN`` and
        unserved slots make this command unavailable (``MOVED`` and those
        slots have the map learnt again); anything else is about this command."""
        upper = text.upper()
        node_down = isinstance(exc, _NODE_DOWN) or upper.startswith(_NODE_DOWN_TEXT) or (
            upper.startswith("CLUSTERDOWN") and "NOT SERVED" not in upper
        )
        if node_down:
            if node is not None:
                self._mark_down(node, text)
            return self._unavailable(text)
        if upper.startswith(_COMMAND_UNAVAILABLE_TEXT) or upper.startswith("CLUSTERDOWN"):
            if upper.startswith(("MOVED", "CLUSTERDOWN")) and self.config.cluster:
                self._stale = True
            return self._unavailable(text)
        return exc if exc is not None else ErrorReply(text)

    # -- plain clients, shutdown --------------------------------------------------------
    def node_clients(self) -> dict[str, redis.Redis]:
        """One plain client per primary, by node name (for subscriptions)."""
        tls: dict[str, Any] = {"ssl": True} if self.config.tls else {}
        kwargs = {**connection_kwargs(self.config), **tls, "db": self.config.db}
        return {
            n.name: redis.Redis(**kwargs, host=n.addr[0], port=n.addr[1]) for n in self.primaries()
        }

    def close(self) -> None:
        self._closed = True
        self._last_error = "closed"
        with self._lock:
            nodes = list(self._nodes.values())
        for node in nodes:
            node.close()

"""Pipelined GETs whose values land straight in host pages (one server).

redis-py hands every reply over as a new ``bytes`` object (the socket's bytes
are copied into its parser, then into the object); a page read that way is
copied once more into its host page. Here the replies of one pipeline of GETs
are parsed off the socket directly::

    $<n>\\r\\n <head: n - page_bytes bytes> <KV: page_bytes bytes> \\r\\n

the head into a small buffer and the KV bytes with ``recv_into`` straight
into the host page: no copy on the way in but the kernel's. The caller then
verifies the record in place (``record.verify_parts``).

Used on one server (a cluster's keys of one call live on several nodes: the
backend uses redis-py's cluster pipelines there). The connection is taken
from the client's pool and given back with nothing left unread, or closed.
"""

from __future__ import annotations

import socket
from typing import Any

SHORT = b""  # a value shorter than its page, or an error reply: not a record of this page


class BulkReader:
    """Parses GET replies (RESP2 or RESP3) off ``sock``, buffering only what it must."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._pos = 0

    def _fill(self) -> None:
        chunk = self._sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the pool closed the connection mid-reply")
        del self._buf[: self._pos]
        self._pos = 0
        self._buf += chunk

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n", self._pos)
            if end >= 0:
                line = bytes(self._buf[self._pos : end])
                self._pos = end + 2
                return line
            self._fill()

    def _exact(self, view: memoryview) -> None:
        """Fill ``view``: buffered bytes first, then straight from the socket."""
        take = min(len(view), len(self._buf) - self._pos)
        view[:take] = self._buf[self._pos : self._pos + take]
        self._pos += take
        got = take
        while got < len(view):
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the pool closed the connection mid-reply")
            got += n

    def bulk_into(self, kv: memoryview) -> bytes | None:
        """One GET reply: None if the key is missing; else the value's head
        (its last ``len(kv)`` bytes went into ``kv``); ``SHORT`` for a value
        shorter than ``kv`` or an error reply (nothing written to ``kv``)."""
        line = self._line()
        kind = line[:1]
        if kind == b"-":  # an error reply
            return SHORT
        if kind == b"!":  # a RESP3 blob error: skip its payload
            self._exact(memoryview(bytearray(int(line[1:]) + 2)))
            return SHORT
        if kind == b"_":  # RESP3 null
            return None
        if kind != b"$":
            raise ConnectionError(f"unexpected reply to GET: {line[:20]!r}")
        n = int(line[1:])
        if n < 0:  # RESP2 null
            return None
        if n < len(kv):
            self._exact(memoryview(bytearray(n + 2)))  # drop it and its CRLF
            return SHORT
        head = bytearray(n - len(kv))
        self._exact(memoryview(head))
        self._exact(kv)
        self._exact(memoryview(bytearray(2)))  # CRLF
        return bytes(head)


def get_into(client: Any, keys: list[bytes], kvs: list[memoryview]) -> list[bytes | None]:
    """GET ``keys`` in one pipeline on a connection of ``client`` (a
    ``redis.Redis``); see ``BulkReader.bulk_into`` for each answer. Socket and
    protocol errors propagate (the connection is closed first)."""
    pool = client.connection_pool
    conn = pool.get_connection()
    ok = False
    try:
        conn.send_packed_command(conn.pack_commands([("GET", key) for key in keys]))
        reader = BulkReader(conn._sock)
        out = [reader.bulk_into(kv) for kv in kvs]
        ok = True
        return out
    finally:
        if not ok:
            conn.disconnect()  # replies may be left unread on it
        pool.release(conn)

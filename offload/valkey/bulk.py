"""GET replies parsed off the socket, each page's KV bytes received straight into its host page.

redis-py hands every reply over as a new ``bytes`` object (the socket's bytes
are copied into its parser, then into the object); a page read that way is
copied once more into its host page. Here the replies of one pipeline of
GETs are parsed off the socket directly. A value is one record or a chunk
of records (offload/storage/chunk.py)::

    $<n>\\r\\n [chunk head] { <record head> <KV bytes> }... \\r\\n

Each record's head goes into a small buffer and its KV bytes, with
``recv_into``, straight into the page the caller names for it (or into a
scratch buffer when it names none): no copy on the way in but the kernel's.
The caller then verifies every record in place (``record.verify_parts``).
Nothing in a value is trusted beyond its length: a count or record length
that does not add up ends the value's records there (the rest is read and
dropped), and those records fail verification.

The connection is left with nothing unread, or the error propagates (the
link then closes the connection).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import NamedTuple

from radixcache.offload.storage import chunk
from radixcache.offload.storage import record as rec

SHORT = b""  # a record that could not be read whole or placed: it fails verification
Destination = Callable[[int, int, int], "memoryview | None"]
# (records in the value, record index, its KV bytes) -> where its KV bytes go; None: dropped


class Value(NamedTuple):
    """A value as read: how many records it claims, and the heads of those read."""

    records: int  # records the value claims (1 for a bare record or a non-record)
    heads: list[bytes]  # one per record read, in order; SHORT: unreadable or not placed


class ErrorReply:
    """A GET answered with an error (e.g. ``WRONGTYPE``, ``LOADING``, ``MOVED``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"ErrorReply({self.text!r})"


class BulkReader:
    """Parses GET replies (RESP2 or RESP3) off ``sock``, buffering only what it must."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._pos = 0
        self._scratch = bytearray(1 << 16)

    def _fill(self) -> None:
        chunk_ = self._sock.recv(1 << 16)
        if not chunk_:
            raise ConnectionError("the pool closed the connection mid-reply")
        del self._buf[: self._pos]
        self._pos = 0
        self._buf += chunk_

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

    def _skip(self, n: int) -> None:
        """Read and drop ``n`` bytes."""
        while n > 0:
            step = min(n, len(self._scratch))
            self._exact(memoryview(self._scratch)[:step])
            n -= step

    def value_into(self, dest: Destination) -> Value | ErrorReply | None:
        """One GET reply: None if the key is missing, an ``ErrorReply``, or the
        value: how many records it claims and the heads of those it holds,
        in order (``SHORT`` for one that could not be read whole or whose KV
        bytes had nowhere to go; records past one that does not add up are
        not listed)."""
        line = self._line()
        kind = line[:1]
        if kind == b"-":
            return ErrorReply(line[1:].decode(errors="replace"))
        if kind == b"!":  # a RESP3 blob error
            body = bytearray(int(line[1:]) + 2)
            self._exact(memoryview(body))
            return ErrorReply(bytes(body[:-2]).decode(errors="replace"))
        if kind == b"_":  # RESP3 null
            return None
        if kind != b"$":
            raise ConnectionError(f"unexpected reply to GET: {line[:20]!r}")
        n = int(line[1:])
        if n < 0:  # RESP2 null
            return None
        value = self._records(n, dest)
        self._skip(2)  # CRLF
        return value

    def _records(self, n: int, dest: Destination) -> Value:
        """Read a value of ``n`` bytes, record by record (see the module docstring)."""
        first = bytearray(min(n, chunk.PREFIX_BYTES))
        self._exact(memoryview(first))
        count = chunk.value_count(bytes(first))
        left = n - len(first)
        pending = first if count == 1 else bytearray()  # bytes of the next record read already
        heads: list[bytes] = []
        for r in range(count):
            head = bytearray(pending)
            pending = bytearray()
            need = rec.HEADER.size - len(head)
            if need > 0:
                if need > left:
                    break
                more = bytearray(need)
                self._exact(memoryview(more))
                left -= need
                head += more
            span = chunk.record_span(bytes(head))
            if span is None or span[0] + span[1] - len(head) > left or span[0] < len(head):
                heads.append(SHORT)
                break
            rest = bytearray(span[0] - len(head))
            self._exact(memoryview(rest))
            left -= len(rest)
            head += rest
            kv = dest(count, r, span[1])
            if kv is None or len(kv) != span[1]:
                self._skip(span[1])
                heads.append(SHORT)
            else:
                self._exact(kv)
                heads.append(bytes(head))
            left -= span[1]
        if count == 1 and not heads:  # shorter than a record header: not a record
            heads.append(SHORT)
        if left > 0:  # padded, or the records stopped adding up
            self._skip(left)
            if heads and count == 1:
                heads[-1] = SHORT  # a bare record with bytes after it: not that record
        return Value(count, heads)

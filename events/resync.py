"""Showing a (re)connected subscriber where the stream is, without traffic.

A restarted engine's first batches (its ``AllBlocksCleared``, then what its
storage still holds) go out before any subscriber has reconnected, so no live
subscriber receives them. A consumer that asks for replay whenever it
reconnects (``EventSubscriber``) learns of the restart from replay; one that
asks only when it sees a gap in the live sequence (NVIDIA Dynamo's indexer)
sees nothing until the engine publishes again, which an idle engine does not.

So the live socket is an XPUB, which hears every subscription (with
``XPUB_VERBOSE``, also a second subscriber's to a topic already subscribed
to), and after a subscription arrives the publisher sends its **newest batch
again**, unchanged: the same sequence number, the same payload::

    subscriber connects --SUBSCRIBE--> XPUB --> publisher thread:
        (once the queue is empty) send the newest batch again, live

The newest batch's number is above every number the previous incarnation
used (``events.sequence``), so a gap-driven consumer that still holds the old
incarnation sees a gap, asks replay for it and receives the new
incarnation's ``AllBlocksCleared`` and everything after it, within the
reconnect interval (ZMQ's default: 100 ms). Nothing new is published: no
sequence number is taken, and no batch is ever empty.

Consumers that are in step receive a batch they applied already: the
gap-driven ones skip it or apply it again (Dynamo applies ``seq <= last``
"anyway (idempotent)": applying a batch a second time, right after itself,
leaves every block as the first time did); ``EventSubscriber`` counts it as a
duplicate. A batch still queued is never overtaken: the repeat waits until
the queue is empty, and then repeats the newest, whose number is the highest
sent so far.
"""

from __future__ import annotations

import zmq

SUBSCRIBE = 1  # first byte of an XPUB subscription message (0: unsubscribe)


def open_live_socket(ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
    """The live socket: an XPUB (a PUB to subscribers) that hears every subscription."""
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    return sock


class SubscriptionWatch:
    """Whether the newest batch is to be sent again (a subscriber joined).

    Used by the publisher thread only.
    """

    __slots__ = ("due", "joined", "resent")

    def __init__(self) -> None:
        self.due = False  # a subscription arrived since the last repeat
        self.joined = 0  # subscriptions heard
        self.resent = 0  # batches sent again

    def hear(self, sock: zmq.Socket[bytes]) -> None:
        """Take every subscription message waiting on the live socket."""
        while True:
            try:
                message = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] == bytes([SUBSCRIBE]):
                self.joined += 1
                self.due = True

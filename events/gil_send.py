"""Frame sends on a PUB (or XPUB) socket that keep the GIL.

Why: pyzmq releases the GIL around every ``zmq_msg_send``. The publisher
thread sends three frames per batch; while the cache's owner thread runs
Python code, each release hands it the GIL, and the publisher thread then
waits for the interpreter's switch interval (5 ms) before it may send the
next frame. During a burst of publishes the live stream all but stops, and
subscribers sit idle until the owner pauses (in the events benchmark: about a
third of the run). A send on a PUB socket never blocks (a slow subscriber's
messages are dropped at the high-water mark), so there is nothing to gain
from releasing the GIL there.

How: libzmq's ``zmq_send`` is called through ``ctypes.PyDLL`` (which keeps
the GIL) on pyzmq's own socket (``Socket.underlying``, the handle pyzmq
offers to other bindings), in the libzmq instance pyzmq has loaded: the one
mapped into this process (``/proc/self/maps``) whose version matches
pyzmq's. Where that cannot be established (another platform, no single
mapped libzmq), ``frame_sender`` returns pyzmq's own ``send``: the same
frames, with the GIL released.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable

import zmq

FrameSend = Callable[[bytes, int], object]  # send(frame, flags)


@functools.cache
def _libzmq() -> ctypes.PyDLL | None:
    """pyzmq's libzmq, opened so that its calls keep the GIL; None if not found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {
                fields[5].strip()
                for fields in (line.split(None, 5) for line in maps)
                if len(fields) == 6 and os.path.basename(fields[5]).startswith("libzmq")
            }
    except OSError:
        return None
    if len(paths) != 1:
        return None
    try:
        lib = ctypes.PyDLL(paths.pop())
        lib.zmq_send.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int)
        lib.zmq_send.restype = ctypes.c_int
        lib.zmq_errno.restype = ctypes.c_int
        version = [ctypes.c_int(), ctypes.c_int(), ctypes.c_int()]
        lib.zmq_version(*(ctypes.byref(v) for v in version))
    except (OSError, AttributeError):
        return None
    if tuple(v.value for v in version) != zmq.zmq_version_info():
        return None
    return lib


def frame_sender(sock: zmq.Socket[bytes]) -> FrameSend:
    """``send(frame, flags)`` for the PUB (or XPUB) socket ``sock``, keeping
    the GIL where possible (see above). Raises ``zmq.ZMQError`` as pyzmq's
    send does. Only the thread that owns ``sock`` may call it, until ``sock``
    closes.
    """
    if sock.type not in (zmq.PUB, zmq.XPUB):  # both drop at the high-water mark
        raise ValueError("only a PUB or XPUB socket never blocks on a send")
    lib = _libzmq()
    if lib is None:
        return sock.send
    zmq_send = lib.zmq_send
    zmq_errno = lib.zmq_errno
    handle = sock.underlying
    dontwait = zmq.DONTWAIT

    def send(frame: bytes, flags: int) -> None:
        while zmq_send(handle, frame, len(frame), flags | dontwait) < 0:
            err = zmq_errno()
            if err != errno.EINTR:
                raise zmq.ZMQError(err)

    return send


def keeps_gil() -> bool:
    """Whether ``frame_sender`` sends with the GIL held in this process."""
    return _libzmq() is not None

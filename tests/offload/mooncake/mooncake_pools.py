"""Real Mooncake pools for the tests: ``mooncake_master`` from the wheel, with its
built-in HTTP metadata server, on free loopback ports, and holder processes
that give it memory (``radixcache.offload.mooncake.processes``).

``MooncakeKit`` opens ``MooncakeStorage`` on one pool and closes them at
teardown, and gives a test a raw client of the same pool (to tamper with
objects, or to look at them). Nothing here mocks a server.

Where the client library is not installed (``pip install
'radixcache[mooncake]'``, and Debian's ``libibverbs1``), the Mooncake tests
are skipped, unless ``RADIXCACHE_REQUIRE_MOONCAKE=1`` (``.ci/run`` sets it)
makes that a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from radixcache.offload import ModelFingerprint
from radixcache.offload.mooncake import MooncakeConfig

from tests.offload.storekit import StoreKit


def mooncake_missing() -> str | None:
    """Why the Mooncake client cannot be used here (None: it can)."""
    try:
        import radixcache.offload.mooncake.link  # noqa: F401  (sets the client's log level first)
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return f"Mooncake's client is not importable ({exc}): apt-get install libibverbs1 && pip install 'radixcache[mooncake]'"
    return None


def require_mooncake() -> None:
    """Skip the calling test (or fixture) without Mooncake, or fail where CI needs it."""
    why = mooncake_missing()
    if why is None:
        return
    if os.environ.get("RADIXCACHE_REQUIRE_MOONCAKE") == "1":
        pytest.fail(why)
    pytest.skip(why)


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        time.sleep(0.05)


class MooncakeKit(StoreKit):
    """Opens ``MooncakeStorage`` on one pool and closes them at teardown."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root)
        self.url = url
        self._pools: list[Any] = []
        self._raw: Any = None

    def config(self, **overrides: Any) -> MooncakeConfig:
        overrides.setdefault("retry_after_s", 0.2)
        return MooncakeConfig.from_url(self.url, **overrides)

    def pool(self, fingerprint: ModelFingerprint | None = None, url: str | None = None, **overrides: Any) -> Any:
        from radixcache.offload.mooncake import MooncakeStorage

        config = MooncakeConfig.from_url(url, **overrides) if url else self.config(**overrides)
        store = MooncakeStorage(config, self.spec, fingerprint or self.fingerprint)
        self._pools.append(store)
        return store

    def raw(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(client)`` on a plain Mooncake client of the pool (no segment)."""
        from radixcache.offload.mooncake.link import MooncakeLink

        if self._raw is None:
            self._raw = MooncakeLink(self.config())
            wait_until(self._raw.available, what="a raw client")
        return self._raw.run(fn)

    def read_object(self, name: str) -> bytes:
        """The bytes of one object of the pool."""
        import numpy as np

        size = self.raw(lambda c: c.get_size(name))
        assert size > 0, f"{name}: {size}"
        buf = np.zeros(size, dtype=np.uint8)
        self.raw(lambda c: c.register_buffer(buf.ctypes.data, buf.nbytes))
        try:
            assert self.raw(lambda c: c.batch_get_into([name], [buf.ctypes.data], [size])) == [size]
        finally:
            self.raw(lambda c: c.unregister_buffer(buf.ctypes.data))
        return buf.tobytes()

    def write_object(self, name: str, value: bytes) -> None:
        """Replace (or create) one object of the pool with ``value``."""
        import numpy as np

        buf = np.frombuffer(bytearray(value), dtype=np.uint8)
        self.raw(lambda c: c.register_buffer(buf.ctypes.data, buf.nbytes))
        try:
            self.raw(lambda c: c.batch_remove([name], True))
            assert self.raw(lambda c: c.batch_put_from([name], [buf.ctypes.data], [buf.nbytes])) == [0]
        finally:
            self.raw(lambda c: c.unregister_buffer(buf.ctypes.data))

    def empty(self) -> None:
        """Remove every object of the (test-only) pool."""
        self.raw(lambda c: c.remove_all(True))

    def close_all(self) -> None:
        for store in self._pools:
            store.close()
        self._pools.clear()
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        super().close_all()

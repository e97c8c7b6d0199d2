"""A copy engine and a storage whose every operation waits until the test
runs it: succeeding, failing, or (reads) coming back short; and, to inject
a tier that is down, calls that raise at once.

``ManualCopyEngine`` copies for real (``transfer.convert``) when a test
completes a ticket; ``ManualStorage`` runs the real backend's operation
then. A caller that waits on a ticket (``wait()``) completes it at once,
as a real ticket would finish eventually. Used by the stateful tests of
the tiers and of the public API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from radixcache.transfer import DeviceKVBuffer, FutureTicket
from radixcache.transfer.convert import PagePairs, copy_device_to_host, copy_host_to_device
from radixcache.transfer.host import HostKVBuffer


class ManualTicket(FutureTicket):
    """Done only when the test (or a waiting caller) completes it."""

    __slots__ = ("engine",)

    def __init__(self, engine: ManualCopyEngine) -> None:
        super().__init__()
        self.engine = engine

    def wait(self, timeout: float | None = None) -> bool:
        if not self.done():
            self.engine.complete(self)
        return True


class ManualCopyEngine:
    """Copies wait in ``pending`` until ``complete``; with ``raising`` set,
    every submission raises (an engine that is down)."""

    def __init__(self, device: DeviceKVBuffer, host: HostKVBuffer) -> None:
        self.device, self.host = device, host
        self.pending: list[tuple[str, PagePairs, ManualTicket]] = []
        self.raising = False

    def _submit(self, kind: str, src: np.ndarray, dst: np.ndarray) -> ManualTicket:
        if self.raising:
            raise RuntimeError("injected: the copy engine is down")
        ticket = ManualTicket(self)
        pairs = PagePairs(np.asarray(src, np.int64), np.asarray(dst, np.int64))
        self.pending.append((kind, pairs, ticket))
        return ticket

    def device_to_host(self, device_pages: np.ndarray, host_pages: np.ndarray) -> ManualTicket:
        return self._submit("d2h", device_pages, host_pages)

    def host_to_device(self, host_pages: np.ndarray, device_pages: np.ndarray) -> ManualTicket:
        return self._submit("h2d", host_pages, device_pages)

    def complete(self, ticket: ManualTicket, fail: bool = False) -> None:
        for i, (kind, pairs, t) in enumerate(self.pending):
            if t is ticket:
                del self.pending[i]
                if fail:
                    t.fail(RuntimeError("injected copy failure"))
                elif kind == "d2h":
                    copy_device_to_host(self.device, self.host, pairs)
                    t.finish()
                else:
                    copy_host_to_device(self.host, self.device, pairs)
                    t.finish()
                return

    def close(self) -> None:
        while self.pending:
            self.complete(self.pending[0][2])


class StorageTicket(FutureTicket):
    """Done only when the test (or a waiting caller) completes it."""

    __slots__ = ("storage",)

    def __init__(self, storage: ManualStorage) -> None:
        super().__init__()
        self.storage = storage

    def wait(self, timeout: float | None = None) -> bool:
        if not self.done():
            self.storage.complete(self)
        return True


class ManualStorage:
    """A real store whose reads and writes wait until the test (or a caller
    waiting on the ticket) runs them: succeeding, failing, or (reads)
    returning fewer leading pages than asked. Calls named in ``raising``
    raise at once (a storage that is down); the rest go to the store."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: list[tuple[str, Callable[[int | None], Any], StorageTicket]] = []
        self.raising: set[str] = set()

    def _down(self, call: str) -> None:
        if call in self.raising:
            raise ConnectionError(f"injected: storage {call} failed")

    def _hold(self, kind: str, run: Callable[[int | None], Any]) -> StorageTicket:
        self._down(kind)
        ticket = StorageTicket(self)
        self.pending.append((kind, run, ticket))
        return ticket

    def get(self, keys: list[bytes], tokens: np.ndarray, host: object, host_pages: np.ndarray,
            namespace: bytes | None = None, tenant: bytes | None = None) -> StorageTicket:
        def run(limit: int | None) -> Any:
            n = len(keys) if limit is None else min(limit, len(keys))
            return self.inner.get(keys[:n], tokens[:n], host, host_pages[:n], namespace, tenant=tenant)

        return self._hold("get", run)

    def put(self, keys: list[bytes], tokens: np.ndarray, host: object, host_pages: np.ndarray,
            namespace: bytes, meta: object = None, tenant: bytes | None = None) -> StorageTicket:
        def run(limit: int | None) -> Any:
            return self.inner.put(keys, tokens, host, host_pages, namespace, meta, tenant=tenant)

        return self._hold("put", run)

    def complete(self, ticket: StorageTicket, mode: str = "ok", short: int = 0) -> None:
        for i, (kind, run, t) in enumerate(self.pending):
            if t is ticket:
                del self.pending[i]
                if mode == "fail":
                    t.fail(RuntimeError("injected storage failure"))
                    return
                try:
                    inner = run(short if mode == "short" and kind == "get" else None)
                    inner.wait()
                except Exception as exc:  # noqa: BLE001 - a real backend fails the ticket
                    t.fail(exc)
                    return
                if inner.error is not None:
                    t.fail(inner.error)
                else:
                    t.finish(inner.result())
                return

    def close(self) -> None:
        while self.pending:
            self.complete(self.pending[0][2])
        self.inner.close()

    def longest_prefix(self, keys: list[bytes]) -> int:
        self._down("longest_prefix")
        return int(self.inner.longest_prefix(keys))

    def take_removed(self) -> list[bytes]:
        self._down("take_removed")
        return list(self.inner.take_removed())

    def take_written(self) -> list[bytes]:
        self._down("take_written")
        return list(self.inner.take_written())

    def forget_namespace(self, namespace: bytes) -> Any:
        self._down("forget_namespace")
        return self.inner.forget_namespace(namespace)

    def invalidate_tag(self, tag: str) -> Any:
        self._down("invalidate_tag")
        return self.inner.invalidate_tag(tag)

    def stats(self) -> Any:
        self._down("stats")
        return self.inner.stats()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

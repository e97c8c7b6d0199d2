"""The backends the storage conformance tests run against, behind one face.

``Backend`` is what a conformance test sees: ``open()`` a store (of this
test's fingerprint or another), the ``StoreKit`` helpers (pages, keys,
tokens, tickets), and the two raw operations the fault probes need: read
and replace a stored record behind the backend's back (``raw_read``,
``raw_write``). Each backend is a real one: LMDB in a temporary directory,
the session's Valkey server and 3-node cluster (emptied), the session's
Mooncake master with its holder process (emptied).

``shared`` says whether several stores may be open on the same data at once
(a pool shared by engines); LMDB is owned by one opener at a time, so tests
of two engines on one store skip it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from radixcache.offload import ModelFingerprint, Storage

from tests.offload.storekit import StoreKit

BACKENDS = ("lmdb", "valkey", "valkey-cluster", "mooncake")
SHARED_BACKENDS = ("valkey", "valkey-cluster", "mooncake")  # several engines open one at once


class Backend:
    """One backend under test (see the module docstring); StoreKit helpers pass through."""

    def __init__(
        self,
        name: str,
        kit: StoreKit,
        opener: Callable[[ModelFingerprint | None], Storage],
        raw_read: Callable[[Storage, bytes], bytes],
        raw_write: Callable[[Storage, bytes, bytes], Storage],
        shared: bool,
    ) -> None:
        self.name = name
        self.kit = kit
        self.shared = shared
        self._opener = opener
        self._raw_read = raw_read
        self._raw_write = raw_write

    def __getattr__(self, name: str) -> Any:  # host, keys, tokens, ids, done, spec, fingerprint
        return getattr(self.kit, name)

    def open(self, fingerprint: ModelFingerprint | None = None) -> Storage:
        """A store on this backend's data (another handle on a shared pool)."""
        return self._opener(fingerprint)

    def raw_read(self, store: Storage, key: bytes) -> bytes:
        """The stored record of page ``key`` of ``store``'s fingerprint, as bytes."""
        return self._raw_read(store, key)

    def raw_write(self, store: Storage, key: bytes, value: bytes) -> Storage:
        """Replace the record of page ``key`` with ``value`` behind the backend's
        back; returns the store to go on with (LMDB reopens it)."""
        return self._raw_write(store, key, value)

    def barrier(self, store: Storage) -> None:
        """Wait until every write queued so far (e.g. a corrupt record's deletion) ran."""
        self.kit.done(store.delete([]))


@contextmanager
def backend_under_test(name: str, request: pytest.FixtureRequest, root: Path) -> Iterator[Backend]:
    """The backend ``name`` (one of ``BACKENDS``), set up for one test, torn down after."""
    if name == "lmdb":
        yield _lmdb(root)
    elif name.startswith("valkey"):
        servers = request.getfixturevalue("valkey_server" if name == "valkey" else "valkey_cluster")
        with _valkey(name, servers, root) as backend:
            yield backend
    else:
        kit = request.getfixturevalue("mooncake_kit")
        yield _mooncake(kit)


def _lmdb(root: Path) -> Backend:
    import lmdb

    kit = StoreKit(root)
    path = root / "store"

    def raw_read(store: Storage, key: bytes) -> bytes:
        store.close()
        env = lmdb.open(str(path), max_dbs=3)
        try:
            with env.begin(db=env.open_db(b"pages")) as txn:
                value = txn.get(kit.fingerprint.digest() + key)
        finally:
            env.close()
        assert value is not None, "no such record"
        return bytes(value)

    def raw_write(store: Storage, key: bytes, value: bytes) -> Storage:
        store.close()
        env = lmdb.open(str(path), max_dbs=3)
        try:
            with env.begin(write=True, db=env.open_db(b"pages")) as txn:
                txn.put(kit.fingerprint.digest() + key, value)
        finally:
            env.close()
        return kit.open()

    def opener(fingerprint: ModelFingerprint | None) -> Storage:
        return kit.open(fingerprint=fingerprint)

    backend = Backend("lmdb", kit, opener, raw_read, raw_write, shared=False)
    return backend


@contextmanager
def _valkey(name: str, servers: Any, root: Path) -> Iterator[Backend]:
    from tests.offload.storekit import PoolKit

    servers.flush()
    kit = PoolKit(root, servers.url)
    client = servers.client()

    def raw_read(store: Any, key: bytes) -> bytes:
        value = client.get(store.pool_keys([key])[0])
        assert value is not None, "no such record"
        return bytes(value)

    def raw_write(store: Any, key: bytes, value: bytes) -> Storage:
        client.set(store.pool_keys([key])[0], value)
        return store  # type: ignore[no-any-return]

    try:
        yield Backend(name, kit, lambda fp: kit.pool(fp), raw_read, raw_write, shared=True)
    finally:
        kit.close_all()
        client.close()


def _mooncake(kit: Any) -> Backend:
    def raw_read(store: Any, key: bytes) -> bytes:
        return kit.read_object(store.pool_names([key])[0])  # type: ignore[no-any-return]

    def raw_write(store: Any, key: bytes, value: bytes) -> Storage:
        kit.write_object(store.pool_names([key])[0], value)
        return store  # type: ignore[no-any-return]

    return Backend("mooncake", kit, lambda fp: kit.pool(fp), raw_read, raw_write, shared=True)

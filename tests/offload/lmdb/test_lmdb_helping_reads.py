"""A thread that waits on an LMDB read's ticket runs queued reads itself
(``PageReader.helping``, ``HelpingTicket``): held mid-way, interrupted, and
at close."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache.offload import LmdbStorage
from radixcache.offload.lmdb.reader import LmdbReader
from radixcache.offload.storage import StorageError
from radixcache.transfer.workers import HelpingTicket

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit


def _put(kit: StoreKit, store: LmdbStorage, n: int) -> tuple[list[bytes], np.ndarray]:
    host = kit.host(16, seed=3)
    keys = kit.keys(n)
    assert kit.done(store.put(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), b"")) == n
    return keys, host.as_bytes()[:n].copy()


def _hold_reader(store: LmdbStorage) -> threading.Event:
    """Hold the store's only reader thread mid-call until the event is set."""
    gate, entered = threading.Event(), threading.Event()
    store._reader._pool.submit(lambda: (entered.set(), gate.wait(10)))
    assert entered.wait(10)
    return gate


def test_a_waiting_thread_reads_while_the_reader_is_held(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open(num_readers=1)
    keys, pages = _put(kit, store, 6)
    readers: list[str] = []
    real = LmdbReader._served

    def served(self: LmdbReader, served_keys: list[bytes]) -> None:
        readers.append(threading.current_thread().name)
        real(self, served_keys)

    monkeypatch.setattr(LmdbReader, "_served", served)
    gate = _hold_reader(store)
    host = kit.host(16, seed=99)
    tickets = [store.get(keys[i : i + 3], kit.tokens(3, i), host, kit.ids(i, i + 1, i + 2))
               for i in (0, 3)]
    assert all(isinstance(t, HelpingTicket) for t in tickets)
    assert not tickets[0].wait(0.05)  # with a timeout it only waits: the reader is held
    assert tickets[1].wait()  # without one, this thread reads both (oldest first)
    assert readers == [threading.current_thread().name] * 2
    assert [t.result() for t in tickets] == [3, 3]
    assert np.array_equal(host.as_bytes()[:6], pages)
    assert store.stats().hits == 6
    gate.set()
    store.check_integrity()


def test_an_interrupt_while_helping_fails_that_read_and_leaves_the_store_whole(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open(num_readers=1)
    keys, pages = _put(kit, store, 4)
    real = LmdbReader._served
    main = threading.current_thread()

    def served(self: LmdbReader, served_keys: list[bytes]) -> None:
        if threading.current_thread() is main:
            raise KeyboardInterrupt  # Ctrl-C lands while this thread reads
        real(self, served_keys)

    monkeypatch.setattr(LmdbReader, "_served", served)
    gate = _hold_reader(store)
    ticket = store.get(keys, kit.tokens(4), kit.host(16), kit.ids(0, 1, 2, 3))
    with pytest.raises(KeyboardInterrupt):
        ticket.wait()
    assert ticket.done() and isinstance(ticket.error, StorageError)  # it ended: nothing hangs on it
    assert "interrupted" in str(ticket.error)
    gate.set()
    host = kit.host(16, seed=99)
    again = store.get(keys, kit.tokens(4), host, kit.ids(0, 1, 2, 3))
    assert kit.done(again) == 4  # the reader thread serves it, unharmed
    assert np.array_equal(host.as_bytes()[:4], pages)
    store.check_integrity()
    store.close()  # no read left behind: close returns


def test_close_with_reads_queued_behind_a_held_reader_serves_them(kit: StoreKit) -> None:
    store = kit.open(num_readers=1)
    keys, pages = _put(kit, store, 2)
    gate = _hold_reader(store)
    host = kit.host(16, seed=99)
    ticket = store.get(keys, kit.tokens(2), host, kit.ids(0, 1))
    threading.Timer(0.05, gate.set).start()
    store.close()  # waits for the held call and the queued read
    assert ticket.done() and ticket.result() == 2
    assert np.array_equal(host.as_bytes()[:2], pages)


def test_an_error_after_the_pages_were_read_still_ends_the_ticket(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open(num_readers=1)
    keys, _ = _put(kit, store, 2)

    def served(self: LmdbReader, served_keys: list[bytes]) -> None:
        raise RuntimeError("index gone")

    monkeypatch.setattr(LmdbReader, "_served", served)
    ticket = store.get(keys, kit.tokens(2), kit.host(16), kit.ids(0, 1))
    assert ticket.wait(10)  # on the reader thread: it fails, it does not hang
    assert isinstance(ticket.error, StorageError) and "index gone" in str(ticket.error)
    monkeypatch.undo()
    assert kit.done(store.get(keys, kit.tokens(2), kit.host(16), kit.ids(0, 1))) == 2
    store.check_integrity()

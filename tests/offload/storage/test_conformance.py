"""The storage contract, the same tests on every backend: LMDB, a Valkey server,
a Valkey cluster, a Mooncake pool (all real: tests/offload/storage/backends_under_test.py).

What the cache relies on of any store (offload/storage/contract.py): pages
come back bit-exact into other host pages; a lookup counts leading stored
pages; a read stops at the first miss; a record that fails any check (token
ids, key, namespace, checksum, length) is a miss, counted and deleted, never
a hit; removals are reported once their stores were; bad calls are refused
when they are made. Tests of two engines on one store run on the shared
pools only (an LMDB directory has one owner).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from radixcache.offload import ModelFingerprint, Storage
from radixcache.offload.storage import record

from tests.offload.storage.backends_under_test import Backend


def test_put_get_round_trip_is_bit_exact(backend: Backend) -> None:
    store = backend.open()
    assert isinstance(store, Storage)
    host = backend.host(16, seed=1)
    raw = host.as_bytes()
    keys = backend.keys(5)
    assert backend.done(store.put(keys, backend.tokens(5), host, backend.ids(3, 7, 0, 12, 5), b"ns")) == 5
    assert store.longest_prefix(keys) == 5
    dst = backend.host(16, seed=2)
    out = dst.as_bytes()
    assert backend.done(store.get(keys, backend.tokens(5), dst, backend.ids(9, 1, 2, 15, 4))) == 5
    for src, to in zip((3, 7, 0, 12, 5), (9, 1, 2, 15, 4)):
        assert np.array_equal(out[to], raw[src])
    stats = store.stats()
    assert (stats.puts, stats.hits, stats.misses, stats.corrupt) == (5, 5, 0, 0)


def test_longest_prefix_stops_at_the_first_missing_page(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(16)
    keys = backend.keys(10)
    assert backend.done(store.put(keys[:7], backend.tokens(7), host, np.arange(7, dtype=np.int32), b"ns")) == 7
    assert store.longest_prefix(keys) == 7
    assert store.longest_prefix(keys[:3]) == 3
    assert store.longest_prefix(keys[7:]) == 0
    assert store.longest_prefix([keys[0], keys[8], keys[1]]) == 1
    assert store.longest_prefix([]) == 0


def test_put_skips_stored_keys_and_a_second_engine_reads_them(shared_backend: Backend) -> None:
    backend = shared_backend
    a, b = backend.open(), backend.open()
    host = backend.host(16, seed=3)
    keys = backend.keys(4)
    assert backend.done(a.put(keys, backend.tokens(4), host, backend.ids(0, 1, 2, 3), b"ns")) == 4
    assert backend.done(b.put(keys, backend.tokens(4), host, backend.ids(0, 1, 2, 3), b"ns")) == 4
    assert (b.stats().puts, b.stats().put_skipped) == (0, 4)
    # each page is announced (EXTERNAL) once, by the engine that wrote it
    assert (a.medium, a.take_written(), b.take_written(), a.take_written()) == ("EXTERNAL", keys, [], [])
    dst = backend.host(16, seed=4)
    assert backend.done(b.get(keys, backend.tokens(4), dst, backend.ids(4, 5, 6, 7))) == 4
    assert np.array_equal(dst.as_bytes()[4:8], host.as_bytes()[0:4])


def test_get_stops_at_a_missing_page_and_counts_the_rest_as_misses(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(16)
    keys = backend.keys(6)
    tokens = backend.tokens(6)
    backend.done(store.put(keys[:2], tokens[:2], host, backend.ids(0, 1), b"ns"))
    backend.done(store.put(keys[3:], tokens[3:], host, backend.ids(3, 4, 5), b"ns"))
    assert backend.done(store.get(keys, tokens, backend.host(16), np.arange(6, dtype=np.int32))) == 2
    assert (store.stats().hits, store.stats().misses) == (2, 4)


def test_another_fingerprint_never_sees_the_pages(shared_backend: Backend) -> None:
    backend = shared_backend
    mine = backend.open()
    other = backend.open(ModelFingerprint("other-model", backend.spec.describe(), 0))
    host = backend.host(16)
    keys = backend.keys(3)
    backend.done(mine.put(keys, backend.tokens(3), host, backend.ids(0, 1, 2), b"ns"))
    assert other.longest_prefix(keys) == 0
    assert backend.done(other.get(keys, backend.tokens(3), backend.host(16), backend.ids(0, 1, 2))) == 0
    assert mine.longest_prefix(keys) == 3


def test_wrong_tokens_are_a_miss_and_the_record_is_deleted(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(16)
    keys = backend.keys(2)
    backend.done(store.put(keys, backend.tokens(2), host, backend.ids(0, 1), b"ns"))
    wrong = backend.tokens(2, start=50)
    assert backend.done(store.get(keys, wrong, backend.host(16), backend.ids(2, 3))) == 0
    backend.barrier(store)  # the corrupt record's deletion is queued before this
    assert store.stats().corrupt == 1
    assert store.longest_prefix(keys) == 0
    assert store.take_removed() == [keys[0]]


def test_delete_and_forget_namespace_report_removals_in_order(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(16)
    keys = backend.keys(6)
    tokens = backend.tokens(6)
    backend.done(store.put(keys[:3], tokens[:3], host, backend.ids(0, 1, 2), b"tenant-a"))
    backend.done(store.put(keys[3:], tokens[3:], host, backend.ids(3, 4, 5), b"tenant-b"))
    assert backend.done(store.delete([keys[0], backend.keys(1, b"never")[0]])) == 1
    assert backend.done(store.forget_namespace(b"tenant-b")) == 3
    assert backend.done(store.forget_namespace(b"tenant-b")) == 0
    assert store.longest_prefix(keys[1:3]) == 2
    assert backend.done(store.get(keys[3:], tokens[3:], backend.host(16), backend.ids(0, 1, 2))) == 0
    removed = store.take_removed()
    # keys[0] went first; within one forget, the order is the store's
    assert removed[0] == keys[0] and sorted(removed[1:]) == sorted(keys[3:]), removed
    assert store.take_removed() == []
    assert store.stats().deleted == 4


def test_a_forgotten_namespace_is_gone_for_every_engine(shared_backend: Backend) -> None:
    """Engine B forgets a tenant; engine A, which wrote its pages, is never
    served them again, and the tenant's pages written afterwards are kept."""
    backend = shared_backend
    a, b = backend.open(), backend.open()
    host = backend.host(16, seed=6)
    keys, tokens = backend.keys(4), backend.tokens(4)
    assert backend.done(a.put(keys, tokens, host, backend.ids(0, 1, 2, 3), b"tenant")) == 4
    assert backend.done(b.forget_namespace(b"tenant")) == 4
    assert backend.done(a.get(keys, tokens, backend.host(16), backend.ids(0, 1, 2, 3))) == 0
    backend.barrier(a)
    assert a.longest_prefix(keys) == 0
    assert backend.done(b.put(keys[:2], tokens[:2], host, backend.ids(4, 5), b"tenant")) == 2
    dst = backend.host(16, seed=7)
    assert backend.done(a.get(keys, tokens, dst, backend.ids(8, 9, 10, 11))) == 2
    assert np.array_equal(dst.as_bytes()[8:10], host.as_bytes()[4:6])


def test_another_tenants_page_is_refused_where_the_reader_names_its_namespace(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(16, seed=8)
    keys, tokens = backend.keys(2), backend.tokens(2)
    backend.done(store.put(keys, tokens, host, backend.ids(0, 1), b"tenant-a"))
    assert backend.done(store.get(keys, tokens, backend.host(16), backend.ids(0, 1), namespace=b"tenant-b")) == 0
    dst = backend.host(16, seed=9)
    assert backend.done(store.get(keys[1:], tokens[1:], dst, backend.ids(3), namespace=b"tenant-a")) == 1
    assert np.array_equal(dst.as_bytes()[3], host.as_bytes()[1])


def test_bad_calls_raise_clear_errors(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(4)
    with pytest.raises(ValueError, match="1 to 256"):
        store.longest_prefix([b""])
    with pytest.raises(ValueError, match="shape"):
        store.put(backend.keys(2), backend.tokens(3), host, backend.ids(0, 1), b"ns")
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        store.get(backend.keys(1), backend.tokens(1), host, backend.ids(4))
    with pytest.raises(TypeError, match="namespace"):
        store.put(backend.keys(1), backend.tokens(1), host, backend.ids(0), "ns")  # type: ignore[arg-type]
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.longest_prefix(backend.keys(1))
    with pytest.raises(RuntimeError, match="closed"):
        store.get(backend.keys(1), backend.tokens(1), host, backend.ids(0))
    store.close()  # idempotent


def test_raw_pages_with_engine_keys_round_trip(backend: Backend) -> None:
    """Raw pages (tokens None; keys of 1 to 256 bytes, as serving engines key them)."""
    store = backend.open()
    host = backend.host(8, seed=11)
    keys = [b"k", b"engine-block-" + bytes(range(40)), bytes(256)]
    assert backend.done(store.put(keys, None, host, backend.ids(5, 6, 7), b"raw-ns")) == 3
    assert store.longest_prefix(keys) == 3
    dst = backend.host(8, seed=12)
    assert backend.done(store.get(keys, None, dst, backend.ids(0, 1, 2), namespace=b"raw-ns")) == 3
    assert np.array_equal(dst.as_bytes()[:3], host.as_bytes()[5:8])
    # a raw record is never served as a token page (and the other way round)
    assert backend.done(store.get(keys[:1], backend.tokens(1), dst, backend.ids(0))) == 0
    with pytest.raises(ValueError, match="1 to 256"):
        store.put([bytes(257)], None, host, backend.ids(0), b"raw-ns")


def _flip(offset: int) -> Callable[[bytes], bytes]:
    def change(value: bytes) -> bytes:
        out = bytearray(value)
        out[offset] ^= 0x01
        return bytes(out)

    return change


_KV = -1024  # the KV bytes are a record's last page_bytes (1 KiB here)
TAMPERING: dict[str, Callable[[bytes], bytes]] = {
    "a KV bit": _flip(_KV + 100),
    "the last KV bit": _flip(-1),
    "a token id bit": _flip(_KV - 5),
    "a checksum bit": _flip(9),
    "the magic": _flip(0),
    "cut by one byte": lambda v: v[:-1],
    "cut to the header": lambda v: v[:30],
    "one byte added": lambda v: v + b"\0",
    "not a record": lambda v: b"garbage",
}


@pytest.mark.parametrize("how", list(TAMPERING))
def test_a_tampered_record_is_a_miss_counted_and_deleted(backend: Backend, how: str) -> None:
    store = backend.open()
    host = backend.host(8, seed=5)
    keys, tokens = backend.keys(3), backend.tokens(3)
    assert backend.done(store.put(keys, tokens, host, backend.ids(0, 1, 2), b"ns")) == 3
    value = backend.raw_read(store, keys[1])
    assert len(value) == record.record_size(len(keys[1]) + 8, 0, backend.spec.page_size, backend.spec.page_bytes)
    store = backend.raw_write(store, keys[1], TAMPERING[how](value))
    dst = backend.host(8, seed=9)
    assert backend.done(store.get(keys, tokens, dst, backend.ids(4, 5, 6))) == 1
    assert np.array_equal(dst.as_bytes()[4], host.as_bytes()[0])
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.corrupt) == (1, 2, 1)
    backend.barrier(store)  # the deletion of the bad record ran
    assert store.take_removed() == [keys[1]]
    assert store.longest_prefix(keys) == 1
    assert store.longest_prefix(keys[2:]) == 1
    assert backend.done(store.get(keys[2:], tokens[2:], dst, backend.ids(6))) == 1
    assert np.array_equal(dst.as_bytes()[6], host.as_bytes()[2])


def test_a_record_copied_under_another_key_or_from_another_model_is_refused(backend: Backend) -> None:
    store = backend.open()
    host = backend.host(8, seed=13)
    keys, tokens = backend.keys(2), backend.tokens(2)
    assert backend.done(store.put(keys, tokens, host, backend.ids(0, 1), b"ns")) == 2
    # page 0's record under page 1's key: a valid record, of another page
    first = backend.raw_read(store, keys[0])
    store = backend.raw_write(store, keys[1], first)
    assert backend.done(store.get(keys[1:], tokens[:1], backend.host(8), backend.ids(3))) == 0
    backend.barrier(store)
    assert store.stats().corrupt == 1
    # another model's record of the same page key and tokens
    if backend.shared:
        other = backend.open(ModelFingerprint("other-model", backend.spec.describe(), 0))
        assert backend.done(other.put(keys[:1], tokens[:1], host, backend.ids(0), b"ns")) == 1
        foreign = backend.raw_read(other, keys[0])
        store = backend.raw_write(store, keys[0], foreign)
        assert backend.done(store.get(keys[:1], tokens[:1], backend.host(8), backend.ids(3))) == 0
        backend.barrier(store)
        assert store.stats().corrupt == 2

"""The slot file (offload/lmdb/slots.py): records whose KV bytes lie in fixed-size
slots beside LMDB. Round trips, restarts, the inline form still read, damage
to either part, a write failing part-way, and a slot freed while a read
that still names it is held mid-way."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixcache.offload import LmdbStorage, StorageConfig
from radixcache.offload.lmdb import slots as slot_module
from radixcache.offload.lmdb.slots import ENVELOPE, SLOT_FILE, SlotFile, stored_size, unwrap
from radixcache.offload.storage import StorageError

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

SLOTTED = {"slot_min_page_bytes": 1}  # the kit's 1 KiB pages go into slots


def _slots(store: LmdbStorage) -> SlotFile:
    slots = store._store.slots
    assert slots is not None
    return slots


def _put(kit: StoreKit, store: LmdbStorage, n: int, salt: bytes = b"", seed: int = 3):
    host = kit.host(16, seed=seed)
    keys = kit.keys(n, salt)
    assert kit.done(store.put(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), b"ns")) == n
    return keys, host.as_bytes()[:n].copy()


def _get(kit: StoreKit, store: LmdbStorage, keys: list[bytes], start: int = 0) -> tuple[int, np.ndarray]:
    host = kit.host(16, seed=99)
    n = len(keys)
    got = kit.done(store.get(keys, kit.tokens(n, start), host, np.arange(n, dtype=np.int32)))
    return got, host.as_bytes()[:n].copy()


def _raw(kit: StoreKit) -> dict[bytes, bytes]:
    env = lmdb.open(str(kit.root / "store"), max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(b"pages", create=False)) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def _rewrite(kit: StoreKit, rkey: bytes, value: bytes) -> None:
    env = lmdb.open(str(kit.root / "store"), max_dbs=8)
    try:
        with env.begin(write=True, db=env.open_db(b"pages")) as txn:
            txn.put(rkey, value)
    finally:
        env.close()


def test_pages_round_trip_through_slots_and_survive_a_restart(kit: StoreKit) -> None:
    store = kit.open(**SLOTTED)
    keys, pages = _put(kit, store, 5)
    got, out = _get(kit, store, keys)
    assert got == 5 and np.array_equal(out, pages)
    stats = store.stats()
    assert stats.stored_bytes == 5 * kit.record_bytes  # the record's size, wherever it lies
    assert _slots(store).stats() == {"slots": 5, "free": 0, "pending": 0}
    store.check_integrity()
    store.close()
    values = _raw(kit)
    assert all(unwrap(v) is not None for v in values.values())  # envelopes only
    assert all(stored_size(v) == kit.record_bytes for v in values.values())
    data = (kit.root / "store" / "data.mdb").read_bytes()
    slot_bytes = (kit.root / "store" / SLOT_FILE).read_bytes()
    for page in pages:  # the KV bytes lie in the slot file, not in LMDB's
        assert data.find(page.tobytes()) < 0 and slot_bytes.find(page.tobytes()) >= 0
    store = kit.open(**SLOTTED)
    got, out = _get(kit, store, keys)
    assert got == 5 and np.array_equal(out, pages)
    store.check_integrity()


def test_free_slots_are_derived_at_open_and_reused(kit: StoreKit) -> None:
    store = kit.open(**SLOTTED)
    keys, _pages = _put(kit, store, 6)
    assert kit.done(store.delete(keys[1:3])) == 2
    store.close()
    size = os.path.getsize(kit.root / "store" / SLOT_FILE)
    store = kit.open(**SLOTTED)
    assert _slots(store).stats() == {"slots": 6, "free": 2, "pending": 0}
    stats = store.stats()  # the two free slots are disk the store keeps for reuse
    assert stats.free_disk_bytes == 2 * _slots(store).slot_bytes
    files = [kit.root / "store" / name for name in ("data.mdb", SLOT_FILE)]
    assert stats.disk_bytes >= sum(os.stat(f).st_blocks * 512 for f in files) > size
    more, pages = _put(kit, store, 2, salt=b"more", seed=8)
    assert os.path.getsize(kit.root / "store" / SLOT_FILE) == size  # the two freed slots
    assert store.stats().free_disk_bytes == 0
    got, out = _get(kit, store, more)
    assert got == 2 and np.array_equal(out, pages)
    got, out = _get(kit, store, keys[3:], start=3)
    assert got == 3
    store.check_integrity()


def test_records_of_the_inline_form_stay_readable(kit: StoreKit) -> None:
    store = kit.open(slot_min_page_bytes=None)
    old, old_pages = _put(kit, store, 3)
    assert store._store.slots is None and not (kit.root / "store" / SLOT_FILE).exists()
    store.close()
    store = kit.open(**SLOTTED)
    new, new_pages = _put(kit, store, 3, salt=b"new", seed=4)
    got, out = _get(kit, store, old)
    assert got == 3 and np.array_equal(out, old_pages)
    got, out = _get(kit, store, new)
    assert got == 3 and np.array_equal(out, new_pages)
    store.check_integrity()
    store.close()
    values = _raw(kit)
    prefix = kit.fingerprint.digest()
    assert all(unwrap(values[prefix + k]) is None for k in old)
    assert all(unwrap(values[prefix + k]) is not None for k in new)
    # a run that writes no slots still reads the records that name one
    store = kit.open(slot_min_page_bytes=None)
    got, out = _get(kit, store, new)
    assert got == 3 and np.array_equal(out, new_pages)


def _second_page_rejected(
    kit: StoreKit, keys: list[bytes], pages: np.ndarray, close: bool = True
) -> LmdbStorage:
    store = kit.open(**SLOTTED)
    got, out = _get(kit, store, keys)
    assert got == 1 and np.array_equal(out[0], pages[0])
    assert (store.stats().corrupt, store.stats().hits) == (1, 1)
    kit.barrier(store)
    assert store.take_removed() == [keys[1]]
    got, out = _get(kit, store, keys[2:], start=2)
    assert got == 1 and np.array_equal(out[0], pages[2])
    store.check_integrity()
    if close:
        store.close()
    return store


def _envelope_change(how: str):
    def change(value: bytes) -> bytes:
        _m, tail, slot = ENVELOPE.unpack_from(value)
        lead = value[ENVELOPE.size :]
        if how == "another slot":
            return ENVELOPE.pack(b"RXSL", tail, slot - 1) + lead
        if how == "past the end":
            return ENVELOPE.pack(b"RXSL", tail, 1 << 40) + lead
        if how == "tail length":
            return ENVELOPE.pack(b"RXSL", tail - 1, slot) + lead
        assert how == "lead byte"
        out = bytearray(value)
        out[ENVELOPE.size + 72 + 24 + 2] ^= 1  # a token id
        return bytes(out)

    return change


@pytest.mark.parametrize("how", ["another slot", "past the end", "tail length", "lead byte"])
def test_a_damaged_envelope_is_a_miss_never_another_pages_kv(kit: StoreKit, how: str) -> None:
    store = kit.open(**SLOTTED)
    keys, pages = _put(kit, store, 3)
    store.close()
    rkey = kit.fingerprint.digest() + keys[1]
    _rewrite(kit, rkey, _envelope_change(how)(_raw(kit)[rkey]))
    # the same run writes on: the allocator kept its footing
    store = _second_page_rejected(kit, keys, pages, close=False)
    more, more_pages = _put(kit, store, 4, salt=b"more", seed=6)
    got, out = _get(kit, store, more)
    assert got == 4 and np.array_equal(out, more_pages)
    assert _slots(store).stats()["slots"] <= 7
    # the pages whose slot the bad envelope named are intact: it was not reused
    got, out = _get(kit, store, keys[:1])
    assert got == 1 and np.array_equal(out[0], pages[0])
    got, out = _get(kit, store, keys[2:], start=2)
    assert got == 1 and np.array_equal(out[0], pages[2])
    store.check_integrity()


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_a_damaged_slot_file_is_a_miss(kit: StoreKit, how: str) -> None:
    store = kit.open(**SLOTTED)
    keys, pages = _put(kit, store, 3)
    store.close()
    path = kit.root / "store" / SLOT_FILE
    page = kit.spec.page_bytes
    if how == "flipped":
        with open(path, "r+b") as f:
            f.seek(page + 700)  # inside slot 1
            byte = f.read(1)
            f.seek(page + 700)
            f.write(bytes([byte[0] ^ 0x40]))
        _second_page_rejected(kit, keys, pages)
    else:
        os.truncate(path, page + 100)  # slot 1 cut short, slot 2 gone
        store = kit.open(**SLOTTED)
        got, out = _get(kit, store, keys)
        assert got == 1 and np.array_equal(out[0], pages[0]) and store.stats().corrupt == 1
        more, more_pages = _put(kit, store, 2, salt=b"more", seed=6)
        got, out = _get(kit, store, more)
        assert got == 2 and np.array_equal(out, more_pages)


def test_a_slot_write_failing_part_way_commits_nothing(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open(**SLOTTED)
    keys, pages = _put(kit, store, 2)
    real = os.pwritev
    calls = [0]

    def full_disk(fd: int, parts: list, offset: int) -> int:
        calls[0] += 1
        if calls[0] == 2:  # the second page of the next put: the disk is full
            return real(fd, [memoryview(parts[0])[:100]], offset)
        return real(fd, parts, offset)

    monkeypatch.setattr(slot_module.os, "pwritev", full_disk)
    host = kit.host(16, seed=5)
    new = kit.keys(3, b"new")
    ticket = store.put(new, kit.tokens(3), host, kit.ids(0, 1, 2), b"ns")
    assert ticket.wait(10) and isinstance(ticket.error, StorageError)
    assert "short write" in str(ticket.error)
    monkeypatch.setattr(slot_module.os, "pwritev", real)
    assert store.longest_prefix(new) == 0 and store.stats().records == 2
    assert _slots(store).stats() == {"slots": 4, "free": 2, "pending": 0}  # given back
    got, out = _get(kit, store, keys)
    assert got == 2 and np.array_equal(out, pages)
    assert kit.done(store.put(new, kit.tokens(3), host, kit.ids(0, 1, 2), b"ns")) == 3
    assert _slots(store).stats()["slots"] == 5  # the two given back, then one more
    store.check_integrity()


def test_a_slot_freed_under_a_read_held_mid_way_is_not_rewritten(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read is held after its first page; meanwhile its second page's record
    is deleted and new pages are put. The freed slot must not be written until
    the read ended: the read serves the bytes its snapshot named."""
    store = kit.open(**SLOTTED)
    keys, pages = _put(kit, store, 3)
    real = SlotFile.view
    held, release = threading.Event(), threading.Event()

    def slow(self: SlotFile, slot: int, nbytes: int) -> memoryview | None:
        if slot == 1:  # page 0 was served; page 1's slot is named but not read yet
            held.set()
            assert release.wait(10)
        return real(self, slot, nbytes)

    monkeypatch.setattr(SlotFile, "view", slow)
    host = kit.host(16, seed=99)
    reading = store.get(keys, kit.tokens(3), host, kit.ids(0, 1, 2))
    assert held.wait(10)
    assert kit.done(store.delete([keys[1]])) == 1
    more, more_pages = _put(kit, store, 2, salt=b"more", seed=7)
    assert _slots(store).stats() == {"slots": 5, "free": 0, "pending": 1}  # slot 1 waits
    release.set()
    assert kit.done(reading) == 3  # its snapshot still held page 1, and slot 1 its bytes
    assert np.array_equal(host.as_bytes()[:3], pages)
    last, last_pages = _put(kit, store, 1, salt=b"last", seed=9)
    assert _slots(store).stats() == {"slots": 5, "free": 0, "pending": 0}  # slot 1 reused
    for ks, want, start in ((more, more_pages, 0), (last, last_pages, 0), (keys[2:], pages[2:], 2)):
        got, out = _get(kit, store, ks, start)
        assert got == len(ks) and np.array_equal(out, want)
    store.check_integrity()


def test_sealed_records_keep_their_ciphertext_in_slots(kit: StoreKit, tmp_path: Path) -> None:
    key = tmp_path / "rx.key"
    key.write_text(bytes(range(32)).hex() + "\n")
    key.chmod(0o600)
    store = kit.open(key_file=str(key), **SLOTTED)
    assert _slots(store).slot_bytes == kit.spec.page_bytes + 16  # the body and its tag
    keys, pages = _put(kit, store, 3)
    got, out = _get(kit, store, keys)
    assert got == 3 and np.array_equal(out, pages)
    assert [m.key for m in store.scan()] == sorted(keys)  # meta read from the lead alone
    assert [t.tolist() for t in store.read_tokens(keys)] == kit.tokens(3).tolist()
    store.close()
    slot_bytes = (kit.root / "store" / SLOT_FILE).read_bytes()
    assert all(slot_bytes.find(p.tobytes()[:64]) < 0 for p in pages)  # not in the clear
    store = kit.open(key_file=str(key), **SLOTTED)
    got, out = _get(kit, store, keys)
    assert got == 3 and np.array_equal(out, pages)
    store.check_integrity()


def test_the_slot_size_is_the_files_own_and_checked(kit: StoreKit, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="slot_min_page_bytes must be a positive int"):
        StorageConfig(path=tmp_path / "x", slot_min_page_bytes=0)
    assert StorageConfig(path=tmp_path / "x").slot_bytes(256 << 10) == 256 << 10
    sealed = StorageConfig(path=tmp_path / "x", key_file=str(tmp_path / "k"))
    assert sealed.slot_bytes(256 << 10) == 260 << 10  # the page and its tag, in 4 KiB pages
    assert StorageConfig(path=tmp_path / "x").slot_bytes(16 << 10) is None
    store = kit.open(**SLOTTED)
    assert _slots(store).slot_bytes == kit.spec.page_bytes
    store.close()
    env = lmdb.open(str(kit.root / "store"), max_dbs=8)
    try:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            txn.put(slot_module.META_KEY, (0).to_bytes(8, "little"))
    finally:
        env.close()
    with pytest.raises(OSError, match="slot size kept in"):
        LmdbStorage(
            StorageConfig(path=kit.root / "store", on_open_error="strict", **SLOTTED),
            kit.spec,
            kit.fingerprint,
        )


# -- the allocator alone, as a state machine --------------------------------------


class SlotMachine(RuleBasedStateMachine):
    """Steps remove records and write new ones, then commit or abort; reads
    begin and end in between, each seeing the records committed when it
    began. A slot handed out is never one a committed record or any read in
    progress names, nor one handed out twice."""

    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.mkdtemp(prefix="slots-")
        self.slots = SlotFile(self._dir, 64)
        self.slots.load([])
        self.named: dict[int, int] = {}  # record id -> slot (committed)
        self.content: dict[int, int] = {}  # slot -> the byte its last write filled it with
        self.reads: list[tuple[ExitStack, dict[int, int]]] = []  # in progress: what they saw
        self.next_id = 0
        self.writes = 0

    @rule(remove=st.lists(st.integers(0, 30), max_size=4), new=st.integers(0, 4), commit=st.booleans())
    def step(self, remove: list[int], new: int, commit: bool) -> None:
        gone = {r for r in remove if r in self.named}
        taken: list[int] = []
        for _ in range(new):
            slot = self.slots.take()
            assert slot not in self.named.values(), "a slot a committed record names"
            assert slot not in taken, "a slot handed out twice"
            for _stack, saw in self.reads:
                assert slot not in saw, "a slot a read in progress may still read"
            self.writes += 1
            self.content[slot] = self.writes % 251
            self.slots.write(slot, [memoryview(bytes([self.content[slot]]) * 64)])
            taken.append(slot)
        if not commit:
            self.slots.give_back(taken)
            return
        self.slots.sync()
        freed = [self.named.pop(r) for r in sorted(gone)]
        for slot in taken:
            self.named[self.next_id] = slot
            self.next_id += 1
        self.slots.committed(freed)

    @rule()
    def begin_read(self) -> None:
        stack = ExitStack()
        stack.enter_context(self.slots.reading())
        self.reads.append((stack, {s: self.content[s] for s in self.named.values()}))

    @precondition(lambda self: self.reads)
    @rule(which=st.integers(0, 100))
    def end_read(self, which: int) -> None:
        stack, _saw = self.reads.pop(which % len(self.reads))
        stack.close()

    @invariant()
    def slots_are_accounted_for(self) -> None:
        stats = self.slots.stats()
        assert stats["free"] + stats["pending"] + len(self.named) <= stats["slots"]
        for _stack, saw in self.reads:  # what a read saw is still there, byte for byte
            for slot, byte in saw.items():
                view = self.slots.view(slot, 64)
                assert view is not None and (np.frombuffer(view, dtype=np.uint8) == byte).all()

    def teardown(self) -> None:
        for stack, _saw in self.reads:
            stack.close()
        self.slots.close()
        shutil.rmtree(self._dir, ignore_errors=True)


SlotMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_slot_allocator_machine = SlotMachine.TestCase


def test_a_sealed_body_flipped_in_its_slot_is_unreadable_and_deleted(
    kit: StoreKit, tmp_path: Path
) -> None:
    key = tmp_path / "rx.key"
    key.write_text(bytes(range(32)).hex() + "\n")
    key.chmod(0o600)
    store = kit.open(key_file=str(key), **SLOTTED)
    keys, pages = _put(kit, store, 3)
    slot_bytes = _slots(store).slot_bytes
    store.close()
    with open(kit.root / "store" / SLOT_FILE, "r+b") as f:
        f.seek(slot_bytes + 500)  # the ciphertext of page 1
        byte = f.read(1)
        f.seek(slot_bytes + 500)
        f.write(bytes([byte[0] ^ 0x01]))
    store = kit.open(key_file=str(key), **SLOTTED)
    got, out = _get(kit, store, keys)
    assert got == 1 and np.array_equal(out[0], pages[0])
    assert (store.stats().decrypt_failures, store.stats().corrupt) == (1, 0)
    kit.barrier(store)
    assert store.take_removed() == [keys[1]]  # this store's own: deleted
    store.check_integrity()


def test_sealed_bodies_too_large_for_a_file_made_in_the_clear_are_stored_inline(
    kit: StoreKit, tmp_path: Path
) -> None:
    store = kit.open(**SLOTTED)  # slots of exactly one page: no room for a seal's tag
    _put(kit, store, 2)
    store.close()
    key = tmp_path / "rx.key"
    key.write_text(bytes(range(32)).hex() + "\n")
    key.chmod(0o600)
    store = kit.open(key_file=str(key), **SLOTTED)
    assert _slots(store).slot_bytes == kit.spec.page_bytes  # the file's own size
    keys, pages = _put(kit, store, 2, salt=b"sealed", seed=4)
    got, out = _get(kit, store, keys)
    assert got == 2 and np.array_equal(out, pages)
    store.close()
    values = _raw(kit)
    assert all(unwrap(values[kit.fingerprint.digest() + k]) is None for k in keys)

"""Faults the storage tier must survive: corrupt records, a foreign store, a
full map, an unusable directory, LMDB errors, and a writer killed mid-stream."""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import lmdb
import numpy as np
import numpy.typing as npt
import pytest

from radixcache.offload import (
    LmdbStorage,
    ModelFingerprint,
    StorageConfig,
    StorageError,
    StorageOpenError,
)
from radixcache.offload.lmdb import space as lmdb_space
from radixcache.offload.lmdb import writer as lmdb_writer
from radixcache.offload.lmdb.space import DISK_RESERVE_MAX_BYTES, DiskReserve, disk_room
from radixcache.offload.storage import record as lmdb_record

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

REPO = Path(__file__).resolve().parents[3]


def _rewrite_record(kit: StoreKit, key: bytes, change: Callable[[bytes], bytes]) -> None:
    """Replace one stored value with ``change(value)``, with a raw LMDB write."""
    env = lmdb.open(str(kit.root / "store"), max_dbs=3)
    try:
        db = env.open_db(b"pages")
        rkey = kit.fingerprint.digest() + key
        with env.begin(write=True, db=db) as txn:
            value = txn.get(rkey)
            assert value is not None
            txn.put(rkey, change(value))
    finally:
        env.close()


def _flip(offset: int) -> Callable[[bytes], bytes]:
    def change(value: bytes) -> bytes:
        out = bytearray(value)
        out[offset] ^= 0x01
        return bytes(out)

    return change


KV_AT = 48 + 16  # header + 4 tokens of 4 bytes

CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "kv byte": _flip(KV_AT + 100),
    "last kv byte": _flip(-1),
    "token byte": _flip(48 + 5),
    "checksum byte": _flip(9),
    "magic byte": _flip(0),
    "token count": _flip(12),
    "namespace tag": _flip(40),
    "truncated by one byte": lambda v: v[:-1],
    "truncated to the header": lambda v: v[:30],
    "padded": lambda v: v + b"\0",
    "emptied": lambda v: b"",
}


def _three_pages(kit: StoreKit) -> tuple[list[bytes], npt.NDArray[np.uint8]]:
    store = kit.open()
    host = kit.host(8, seed=5)
    keys = kit.keys(3)
    assert kit.done(store.put(keys, kit.tokens(3), host, kit.ids(0, 1, 2), b"ns")) == 3
    store.close()
    return keys, host.as_bytes()[:3].copy()


def _assert_second_page_rejected(
    kit: StoreKit, keys: list[bytes], pages: npt.NDArray[np.uint8]
) -> None:
    store = kit.open()
    host = kit.host(8, seed=9)
    assert kit.done(store.get(keys, kit.tokens(3), host, kit.ids(4, 5, 6))) == 1
    assert np.array_equal(host.as_bytes()[4], pages[0])
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.corrupt) == (1, 2, 1)
    kit.barrier(store)  # the deletion of the bad record has committed
    assert store.take_removed() == [keys[1]]
    assert store.longest_prefix(keys) == 1
    assert store.longest_prefix(keys[2:]) == 1
    assert kit.done(store.get(keys[2:], kit.tokens(1, 2), host, kit.ids(6))) == 1
    assert np.array_equal(host.as_bytes()[6], pages[2])
    store.check_integrity()


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_a_corrupt_record_is_a_miss_deleted_and_counted(kit: StoreKit, how: str) -> None:
    keys, pages = _three_pages(kit)
    _rewrite_record(kit, keys[1], CORRUPTIONS[how])
    _assert_second_page_rejected(kit, keys, pages)


def test_a_zero_length_value_passes_the_integrity_check_before_and_after_its_read(
    kit: StoreKit,
) -> None:
    """Issue 21 (5): an emptied record was indexed with size 0, and
    ``check_integrity`` failed ("a record of size <= 0") until a read
    deleted it. The index mirrors the store: size 0 is what is there."""
    keys, pages = _three_pages(kit)
    _rewrite_record(kit, keys[1], lambda v: b"")
    store = kit.open()
    store.check_integrity()  # before any read
    assert store.stats().stored_bytes == 2 * kit.record_bytes
    store.close()
    _assert_second_page_rejected(kit, keys, pages)  # (checks integrity after the delete)


def test_a_byte_flipped_in_the_data_file_is_caught(kit: StoreKit) -> None:
    keys, pages = _three_pages(kit)
    with open(kit.root / "store" / "data.mdb", "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        at = data.find(pages[1].tobytes())
        assert at >= 0 and data.find(pages[1].tobytes(), at + 1) < 0
        data[at + 300] ^= 0x80
    _assert_second_page_rejected(kit, keys, pages)


def test_wrong_tokens_are_a_miss_and_delete_the_record(kit: StoreKit) -> None:
    keys, pages = _three_pages(kit)
    store = kit.open()
    host = kit.host(8)
    wrong = kit.tokens(3)
    wrong[1, 2] += 1
    assert kit.done(store.get(keys, wrong, host, kit.ids(4, 5, 6))) == 1
    assert store.stats().corrupt == 1
    kit.barrier(store)
    assert store.take_removed() == [keys[1]]
    assert store.longest_prefix(keys) == 1


@pytest.mark.parametrize(
    "other",
    [
        ModelFingerprint("another-model", "SPEC", 0),
        ModelFingerprint("tiny-model", "SPEC", 1),
    ],
)
def test_a_store_of_another_fingerprint_never_hits(
    kit: StoreKit, other: ModelFingerprint, caplog: pytest.LogCaptureFixture
) -> None:
    other = ModelFingerprint(other.model_id, kit.spec.describe(), other.tp_rank)
    keys, pages = _three_pages(kit)
    with caplog.at_level(logging.WARNING, logger="radixcache.offload.lmdb.env"):
        foreign = kit.open(fingerprint=other)
    assert "last written for model=tiny-model" in caplog.text
    host = kit.host(8, seed=2)
    assert foreign.longest_prefix(keys) == 0
    assert kit.done(foreign.get(keys, kit.tokens(3), host, kit.ids(4, 5, 6))) == 0
    # The same page keys under this fingerprint are other records.
    assert kit.done(foreign.put(keys, kit.tokens(3), host, kit.ids(0, 1, 2), b"ns")) == 3
    assert foreign.stats().records == 6
    assert kit.done(foreign.forget_namespace(b"ns")) == 3  # forgets only its own
    assert sorted(foreign.take_removed()) == sorted(keys)
    foreign.close()
    store = kit.open()
    assert kit.done(store.get(keys, kit.tokens(3), host, kit.ids(4, 5, 6))) == 3
    assert np.array_equal(host.as_bytes()[4:7], pages)


def test_a_full_map_evicts_and_grows_instead_of_failing(kit: StoreKit) -> None:
    store = kit.open(capacity_bytes=1 << 30, map_size_bytes=1 << 20)
    host = kit.host(32, seed=4)
    all_keys = []
    for r in range(30):
        keys = kit.keys(32, salt=b"round%d" % r)
        all_keys += keys
        assert (
            kit.done(store.put(keys, kit.tokens(32), host, np.arange(32, dtype=np.int32), b""))
            == 32
        )
    stats = store.stats()
    assert stats.map_full >= 1 and stats.failed_ops == 0
    removed = store.take_removed()
    assert removed and len(removed) == stats.evicted == 30 * 32 - stats.records
    assert set(removed) <= set(all_keys[: len(all_keys) - 32])  # never the newest round
    assert not any(store.longest_prefix([k]) for k in removed)
    last = kit.keys(32, salt=b"round29")
    assert (
        kit.done(store.get(last, kit.tokens(32), host, np.arange(32, dtype=np.int32)[::-1].copy()))
        == 32
    )
    store.check_integrity()


def test_a_directory_below_a_file_is_a_clear_error(tmp_path: Path, kit: StoreKit) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(
        StorageOpenError, match=f"storage directory '{blocker / 'store'}' is not writable"
    ):
        LmdbStorage(StorageConfig(path=blocker / "store"), kit.spec, kit.fingerprint)


def _open_as_nobody(target: Path, kit: StoreKit) -> str:
    """Root may write to any directory: the open runs in a forked child that
    dropped to the unprivileged ``nobody`` user (65534); the child reports the
    error's text (or ``"opened"``) through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        text = "opened"
        try:
            os.setgid(65534)
            os.setuid(65534)
            LmdbStorage(StorageConfig(path=target), kit.spec, kit.fingerprint).close()
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            text = f"{type(err).__name__}: {err}"
        os.write(write_end, text.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    return text


def test_a_read_only_directory_is_a_clear_error(tmp_path: Path, kit: StoreKit) -> None:
    if os.geteuid() != 0:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
        try:
            with pytest.raises(StorageOpenError, match=f"'{target}' is not writable"):
                LmdbStorage(StorageConfig(path=target), kit.spec, kit.fingerprint)
        finally:
            target.chmod(0o700)
        return
    base = Path(tempfile.mkdtemp(prefix="radixcache-ro-"))  # reachable by nobody
    try:
        base.chmod(0o755)
        target = base / "ro"
        target.mkdir(mode=0o755)  # root's: nobody may read it, not write it
        text = _open_as_nobody(target, kit)
        assert text.startswith("StorageOpenError") and f"'{target}' is not writable" in text, text
    finally:
        shutil.rmtree(base)


def test_a_store_is_owned_by_one_opener_at_a_time(kit: StoreKit) -> None:
    store = kit.open()
    with pytest.raises(StorageOpenError, match="is already open"):
        kit.open()
    store.close()
    again = kit.open()  # the lock went with the first owner
    assert again.stats().records == 0


class _FailingEnv:
    """An lmdb.Environment stand-in whose transactions cannot begin."""

    def __init__(self, real: lmdb.Environment) -> None:
        self._real = real

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        raise lmdb.DiskError("injected I/O error")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_writes_after_the_directory_was_removed_name_it(kit: StoreKit) -> None:
    """Issue 21 (5): after ``rm -rf`` of an open store, the write error said
    only ``FileNotFoundError(2, 'No such file or directory')``."""
    store = kit.open()
    host = kit.host(4)
    assert kit.done(store.put(kit.keys(1), kit.tokens(1), host, kit.ids(0), b"ns")) == 1
    shutil.rmtree(kit.root / "store")
    ticket = store.put(kit.keys(2, b"later"), kit.tokens(2), host, kit.ids(1, 2), b"ns")
    assert ticket.wait(10)
    assert isinstance(ticket.error, StorageError)
    message = str(ticket.error)
    assert str(kit.root / "store") in message and "gone" in message, message
    stats = store.stats()  # (its figures still come, the files' as none)
    assert stats.failed_ops == 1 and stats.disk_bytes == 0


def test_lmdb_errors_fail_tickets_and_the_threads_carry_on(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(2)
    real = store._env
    store._env = store._writer._env = store._reader._env = _FailingEnv(real)  # type: ignore[assignment]
    get = store.get(keys, kit.tokens(2), host, kit.ids(0, 1))
    put = store.put(keys, kit.tokens(2), host, kit.ids(0, 1), b"")
    forget = store.forget_namespace(b"")
    for ticket in (get, put, forget):
        assert ticket.wait(10)
        assert isinstance(ticket.error, StorageError) and "injected I/O error" in str(ticket.error)
        with pytest.raises(StorageError):
            ticket.result()
    assert store.stats().failed_ops == 3
    store._env = store._writer._env = store._reader._env = real
    assert kit.done(store.put(keys, kit.tokens(2), host, kit.ids(0, 1), b"")) == 2
    assert kit.done(store.get(keys, kit.tokens(2), host, kit.ids(2, 3))) == 2


def test_an_error_inside_a_transaction_commits_nothing_of_it(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(3)
    real = lmdb_record.encode_into
    calls = []

    def encode_failing_second(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise lmdb.Error("injected")
        real(*args)

    monkeypatch.setattr(lmdb_record, "encode_into", encode_failing_second)
    ticket = store.put(keys, kit.tokens(3), host, kit.ids(0, 1, 2), b"")
    assert ticket.wait(10) and isinstance(ticket.error, StorageError)
    assert store.longest_prefix(keys) == 0 and store.stats().records == 0
    monkeypatch.setattr(lmdb_record, "encode_into", real)
    assert kit.done(store.put(keys, kit.tokens(3), host, kit.ids(0, 1, 2), b"")) == 3
    store.check_integrity()


_CHILD_WRITE = """
import collections, hashlib, sys
import numpy as np, torch
from radixcache.offload import LmdbStorage, ModelFingerprint, StorageConfig
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import KVSpec
spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float16, page_size=4)
least = None if sys.argv[3] == "inline" else 1  # KV bytes inside LMDB, or in slots
store = LmdbStorage(StorageConfig(path=sys.argv[1], durability=sys.argv[2],
                                  slot_min_page_bytes=least), spec,
                    ModelFingerprint("tiny-model", spec.describe(), 0))
N, SLOTS = 8, 4
host = HostKVBuffer(spec, N * SLOTS)
raw = host.as_bytes()
free, inflight, i = list(range(SLOTS)), collections.deque(), 0
while True:
    if not free:
        slot, first, ticket = inflight.popleft()
        ticket.wait()
        print(" ".join(str(first + j) for j in range(ticket.result())), flush=True)
        free.append(slot)
    slot = free.pop()
    pages = np.arange(slot * N, slot * N + N, dtype=np.int32)
    for j in range(N):
        rng = np.random.default_rng(i + j)
        raw[pages[j]] = rng.integers(0, 256, spec.page_bytes, dtype=np.uint8)
    keys = [hashlib.blake2b((i + j).to_bytes(4, "little"), digest_size=16).digest()
            for j in range(N)]
    tokens = np.arange(i * 4, (i + N) * 4, dtype=np.int32).reshape(N, 4)
    inflight.append((slot, i, store.put(keys, tokens, host, pages, b"")))
    i += N
"""


@pytest.mark.parametrize("layout", ["inline", "slots"])
@pytest.mark.parametrize("durability", ["safe", "fast"])
def test_kill_9_mid_stream_keeps_every_committed_page(
    kit: StoreKit, durability: str, layout: str
) -> None:
    """``slots``: the KV bytes in the slot file (offload/lmdb/slots.py), whose
    writes the kill also cuts between a slot's write and the commit."""
    path = kit.root / "store"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_WRITE, str(path), durability, layout],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while len(lines) < 40 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        lines.append(line)
    os.kill(child.pid, signal.SIGKILL)
    rest, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, err
    assert len(lines) >= 40, err
    committed = sorted(int(tok) for line in lines + rest.splitlines() for tok in line.split())
    assert committed == list(range(len(committed)))  # each put was reported whole

    store = kit.open(slot_min_page_bytes=None if layout == "inline" else 1)
    top = len(committed) + 64  # beyond it nothing was even submitted (4 slots of 8 pages)
    keys = kit.keys(top)
    host = kit.host(top)
    want = np.stack(
        [
            np.random.default_rng(i).integers(0, 256, kit.spec.page_bytes, dtype=np.uint8)
            for i in range(top)
        ]
    )
    # every reported page is there, bit-exact
    got = kit.done(store.get(keys, kit.tokens(top), host, np.arange(top, dtype=np.int32)))
    assert got >= len(committed)
    assert np.array_equal(host.as_bytes()[:got], want[:got])
    # and the store holds no page that fails its checks
    for i in range(got, top):
        if kit.done(store.get(keys[i : i + 1], kit.tokens(1, i), host, kit.ids(i))):
            assert np.array_equal(host.as_bytes()[i], want[i])
    assert store.stats().corrupt == 0
    store.check_integrity()


def test_a_nearly_full_disk_evicts_or_fails_the_put_never_the_process(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open()
    host = kit.host()
    keys = kit.keys(6)
    for i in range(4):
        assert kit.done(store.put(keys[i : i + 1], kit.tokens(1, i), host, kit.ids(i), b"")) == 1
    # A simulated disk with room for one record, plus whatever eviction frees.
    base = [kit.record_bytes]
    monkeypatch.setattr(
        lmdb_writer, "disk_room", lambda *a: base[0] + store.stats().evicted * kit.record_bytes
    )
    assert kit.done(store.put(keys[4:6], kit.tokens(2, 4), host, kit.ids(4, 5), b"")) == 2
    assert store.take_removed() == [keys[0]]  # the least recently used, and only it
    # A disk that eviction cannot help: the put fails, nothing is evicted.
    base[0] = -(1 << 40)
    ticket = store.put(kit.keys(1, b"more"), kit.tokens(1), host, kit.ids(0), b"")
    assert ticket.wait(10) and isinstance(ticket.error, StorageError)
    assert "nearly full" in str(ticket.error)
    assert store.take_removed() == [] and store.stats().records == 5
    # stored pages are still served while the disk is full
    assert kit.done(store.get(keys[1:6], kit.tokens(5, 1), host, kit.ids(8, 9, 10, 11, 12))) == 5
    store.check_integrity()


def test_disk_room_is_free_space_plus_reusable_pages_less_the_reserve(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kit.open()
    free = 10 << 30
    monkeypatch.setattr(
        lmdb_space.os, "statvfs", lambda path: SimpleNamespace(f_blocks=free // 2048, f_bavail=free // 4096, f_frsize=4096)
    )
    dbs = (store._pages, store._ns, store._meta)
    reserve = DISK_RESERVE_MAX_BYTES
    room = disk_room(store._env, store.path, dbs, reserve)
    assert 0 <= room - (free - reserve) <= 64 << 10  # a fresh store reuses little
    host = kit.host(16)
    keys = kit.keys(16)
    kit.done(store.put(keys, kit.tokens(16), host, np.arange(16, dtype=np.int32), b""))
    kit.done(store.delete(keys))
    after = disk_room(store._env, store.path, dbs, reserve)
    assert after > room  # the deleted records' pages are on LMDB's free list


def _small_disk(monkeypatch: pytest.MonkeyPatch, size: int, free: list[int]) -> None:
    """A simulated file system of ``size`` bytes with ``free[0]`` bytes free."""
    monkeypatch.setattr(
        lmdb_space.os,
        "statvfs",
        lambda path: SimpleNamespace(
            f_blocks=size // 4096, f_bavail=free[0] // 4096, f_frsize=4096
        ),
    )
    monkeypatch.setattr(lmdb_space, "preallocate", lambda *a: None)
    monkeypatch.setattr(lmdb_writer, "preallocate", lambda *a: None)


def test_the_disk_reserve_is_proportional_by_default_and_configurable(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = [3 << 20]
    _small_disk(monkeypatch, 100 << 20, free)
    assert DiskReserve().bytes("/") == (100 << 20) // 100  # 1% of a 100 MiB disk
    assert DiskReserve(fixed=12345).bytes("/") == 12345
    _small_disk(monkeypatch, 1 << 40, free)
    assert DiskReserve().bytes("/") == DISK_RESERVE_MAX_BYTES  # 1% of 1 TiB: capped at 64 MiB
    _small_disk(monkeypatch, 100 << 20, free)
    store = kit.open()  # 3 MiB free on a 100 MiB disk: a fixed 64 MiB reserve stored nothing
    host = kit.host()
    assert kit.done(store.put(kit.keys(4), kit.tokens(4), host, kit.ids(0, 1, 2, 3), b"")) == 4
    with pytest.raises(ValueError, match="disk_reserve_ratio"):
        StorageConfig(disk_reserve_ratio=0.7)
    with pytest.raises(ValueError, match="disk_reserve_bytes"):
        StorageConfig(disk_reserve_bytes=-1)


def test_a_full_disk_says_what_is_reserved_warns_sparingly_and_recovers(
    kit: StoreKit, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    free = [0]
    _small_disk(monkeypatch, 100 << 20, free)
    store = kit.open()
    host = kit.host()
    caplog.set_level(logging.WARNING)
    errors = []
    for i in range(50):  # every write fails while the disk is full
        ticket = store.put(kit.keys(1, bytes([i])), kit.tokens(1), host, kit.ids(0), b"")
        assert ticket.wait(10)
        errors.append(ticket.error)
    assert all(isinstance(e, StorageError) for e in errors)
    assert "1048576 B of free disk are kept in reserve (disk_reserve_ratio=0.01" in str(errors[0])
    lines = [r for r in caplog.records if "storage write" in r.getMessage()]
    assert 1 <= len(lines) <= 2, f"{len(lines)} warnings for 50 failed writes"
    free[0] = 3 << 20  # space came back: the next write goes through
    assert kit.done(store.put(kit.keys(2, b"after"), kit.tokens(2), host, kit.ids(0, 1), b"")) == 2
    assert store.stats().records == 2
    store.check_integrity()

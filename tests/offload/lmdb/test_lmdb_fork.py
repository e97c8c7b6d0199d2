"""The store's owner lock and threads under ``fork()``.

Issue 21 (5): the ``flock`` of ``radixcache.lock`` belongs to the open file
description, which a forked child shares: while a child the process forked
(a helper, a data loader) still ran, the parent could not reopen its own
store after closing it (strict mode raised "already open", recover mode
silently disabled the tier). The child now drops its copy of the lock at
once; a child that uses the store gets a clear error instead of a ticket no
thread finishes, and closing it there touches nothing of the parent's."""

from __future__ import annotations

import os
import select
import signal
import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache.offload import StorageOpenError

if TYPE_CHECKING:
    from tests.offload.conftest import StoreKit

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running


def _fork(body: object) -> tuple[int, int, int]:
    """Fork a child that runs ``body()`` (its text result goes to the
    parent), then waits until the parent writes to ``go``; returns (pid,
    the result pipe, the go pipe)."""
    out_r, out_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            text = str(body())  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - reported
            text = f"{type(exc).__name__}: {exc}"
        os.write(out_w, text.encode()[:60_000])
        os.close(out_w)
        select.select([go_r], [], [], 60)  # keep the inherited descriptors until told
        os._exit(0)
    os.close(out_w)
    os.close(go_r)
    return pid, out_r, go_w


def _result(out_r: int) -> str:
    chunks = []
    while True:
        ready, _, _ = select.select([out_r], [], [], 60)
        assert ready, "the child hung"
        chunk = os.read(out_r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(out_r)
    return b"".join(chunks).decode()


def _end(pid: int, go_w: int) -> None:
    os.write(go_w, b"x")
    os.close(go_w)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the child did not exit")


def test_the_parent_reopens_its_store_while_a_forked_child_lives(kit: StoreKit) -> None:
    store = kit.open(on_open_error="strict")
    host = kit.host(4)
    keys = kit.keys(2)
    assert kit.done(store.put(keys, kit.tokens(2), host, kit.ids(0, 1), b"ns")) == 2
    pid, out_r, go_w = _fork(lambda: "idle")
    try:
        assert _result(out_r) == "idle"
        store.close()  # the child still lives, with every descriptor it inherited
        again = kit.open(on_open_error="strict")  # was: "already open (in this or another process)"
        assert again.longest_prefix(keys) == 2
        with pytest.raises(StorageOpenError, match="already open"):
            kit.open(on_open_error="strict")  # the lock is real: a second opener still fails
    finally:
        _end(pid, go_w)


def test_a_forked_child_that_uses_the_store_gets_a_clear_error(kit: StoreKit) -> None:
    store = kit.open()
    host = kit.host(4)
    keys = kit.keys(2)
    assert kit.done(store.put(keys, kit.tokens(2), host, kit.ids(0, 1), b"ns")) == 2
    parent = os.getpid()

    def child() -> str:
        errors = []
        for call in (
            lambda: store.longest_prefix(keys),
            lambda: store.get(keys, kit.tokens(2), host, kit.ids(2, 3)),
            lambda: store.put(kit.keys(1, b"c"), kit.tokens(1), host, kit.ids(0), b"ns"),
            lambda: store.forget_namespace(b"ns"),
        ):
            try:
                call()
                errors.append("no error")
            except RuntimeError as exc:
                errors.append(str(exc))
        store.close()  # nothing of the parent's: no join, no commit, no unlock
        return "\n".join(errors)

    pid, out_r, go_w = _fork(child)
    try:
        lines = _result(out_r).splitlines()
        assert len(lines) == 4, lines
        assert all(f"process {parent}" in ln and "forked" in ln for ln in lines), lines
    finally:
        _end(pid, go_w)
    # The parent's store still works: its threads, environment and lock are intact.
    got = kit.host(4, seed=3)
    assert kit.done(store.get(keys, kit.tokens(2), got, kit.ids(2, 3))) == 2
    assert np.array_equal(got.as_bytes()[2:4], host.as_bytes()[0:2])
    with pytest.raises(StorageOpenError, match="already open"):
        kit.open()
    store.check_integrity()


def test_a_reopen_right_after_a_fork_waits_for_the_child_to_drop_the_lock(kit: StoreKit) -> None:
    """Between ``fork()`` and the child's fork handler the child shares the
    lock: a parent that closes and reopens in that moment waits for it (a
    busy machine made that window long enough to fail a reopen), up to
    ``LOCK_WAIT_S``. A copy of the lock's descriptor stands in for the
    child's; one never dropped still fails the open, after the wait."""
    import threading

    from radixcache.offload.lmdb import env

    store = kit.open(on_open_error="strict")
    shared = os.dup(store._store.lock_fd)  # the child's copy, not yet dropped
    store.close()
    threading.Timer(0.2, os.close, args=(shared,)).start()
    started = time.monotonic()
    again = kit.open(on_open_error="strict")
    assert 0.15 < time.monotonic() - started < env.LOCK_WAIT_S + 0.5
    stuck = os.dup(again._store.lock_fd)  # a copy nobody drops
    again.close()
    started = time.monotonic()
    try:
        with pytest.raises(StorageOpenError, match="already open"):
            kit.open(on_open_error="strict")
        assert time.monotonic() - started >= env.LOCK_WAIT_S
    finally:
        os.close(stuck)

"""A closed cache is closed, and a forked child cannot use its parent's.

Issue 21 (3): after ``close()``, ``admit`` raised ``RuntimeError: storage
... is closed`` after registering the request (``live_requests`` stuck at 1,
``reset()`` refused forever). Now every call after ``close()`` raises
``CacheClosedError`` at once and changes nothing; ``close()`` twice is
fine; live requests are released by ``close``. (5): in a child forked from
the process that built the cache (whose copy, storage and publisher
threads do not exist there), every call raises ``CacheClosedError`` too,
and closing there touches nothing of the parent's."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixcache import CacheClosedError, Namespace, RadixCache, Request
from radixcache.events import BlockRemoved, PublisherConfig, ZmqEventPublisher
from tests.radixcache.tiers.tierkit import assert_kv_correct, make_tiered, prefill, seq


def _calls(cache: RadixCache, req: Request) -> dict[str, Callable[[], Any]]:
    """Every public call of the cache, with valid arguments."""
    return {
        "admit": lambda: cache.admit(seq(0, 9)),
        "peek": lambda: cache.peek(seq(0, 9)),
        "reserve": lambda: cache.reserve(req, 4),
        "extend": lambda: cache.extend(req, [1]),
        "commit": lambda: cache.commit(req, 0),
        "release": lambda: cache.release(req),
        "evict": lambda: cache.evict(1),
        "forget_namespace": lambda: cache.forget_namespace(Namespace(salt="a")),
        "reset": lambda: cache.reset(force=True),
        "poll": cache.poll,
        "drain": cache.drain,
        "take_events": cache.take_events,
        "stats": cache.stats,
        "check_integrity": cache.check_integrity,
        "tier_stats": cache.tier_stats,
    }


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_every_call_after_close_raises_cache_closed_error(tmp_path: Path, policy: str) -> None:
    cache = make_tiered(write_policy=policy, storage=tmp_path / "s")
    prefill(cache, seq(0, 17))
    live = cache.admit(seq(0, 13))
    assert live.cached_len == 12
    cache.close()
    assert cache.closed and live.released and cache.live_requests == []
    for name, call in _calls(cache, live).items():
        with pytest.raises(CacheClosedError, match="closed"):
            call()
    cache.close()  # a second close does nothing
    # Closing released the request and flushed the store: a new cache on the
    # same directory opens it (nothing holds its lock) and finds the pages.
    again = make_tiered(storage=tmp_path / "s", on_open_error="strict")
    req = again.admit(seq(0, 17))
    assert req.hit_storage == (16 if policy == "write_through" else 0)  # write_back stores on eviction
    again.reserve(req, 0)
    assert_kv_correct(again, req)
    again.close()


def test_a_call_on_a_closed_cache_changes_nothing_even_with_a_bad_argument() -> None:
    cache = make_tiered()
    cache.close()
    with pytest.raises(CacheClosedError):
        cache.admit("not tokens")  # the closed state is reported first
    with pytest.raises(CacheClosedError):
        cache.release("not a request")  # type: ignore[arg-type]


# ----------------------------------------------------------------- fork


def _in_child(body: Callable[[], str]) -> str:
    """Run ``body`` in a forked child; its result (or its exception, as
    ``Type: message``) comes back as text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, no atexit, no finalizers
        try:
            out = body()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = f"{type(exc).__name__}: {exc}"
        os.write(w, out.encode()[:60_000])
        os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + 60
    while True:  # a child that hangs (a ticket no thread finishes) is killed, and fails the test
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            raise AssertionError("the forked child hung")
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return b"".join(chunks).decode()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_forked_child_gets_a_clear_error_and_the_parent_is_unharmed(tmp_path: Path) -> None:
    cache = make_tiered(storage=tmp_path / "s")
    prefill(cache, seq(0, 17))
    parent = os.getpid()

    def child() -> str:
        errors = []
        for call in (lambda: cache.admit(seq(0, 9)), cache.poll, cache.stats):
            try:
                call()
                errors.append("no error")
            except CacheClosedError as exc:
                errors.append(str(exc))
        cache.close()  # touches nothing of the parent's: no join, no unlock, no commit
        return "\n".join(errors)

    out = _in_child(child)
    lines = out.splitlines()
    assert len(lines) == 3 and all(f"process {parent}" in ln and "forked" in ln for ln in lines), out
    # The parent's threads, store and lock are untouched by the child's close.
    req = cache.admit(seq(0, 17))
    assert req.cached_len == 16
    cache.release(req)
    cache.drain()
    cache.check_integrity()
    assert cache.tier_stats().failed_jobs == 0  # type: ignore[union-attr]
    cache.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_cannot_publish_on_its_parents_publisher() -> None:
    pub = ZmqEventPublisher(PublisherConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint=None))
    try:
        def child() -> str:
            try:
                pub.publish([BlockRemoved([1], "GPU")])
                return "published"
            except RuntimeError as exc:
                pub.close()  # does nothing in the child
                return str(exc)

        out = _in_child(child)
        assert f"process {os.getpid()}" in out and "forked" in out, out
        pub.publish([BlockRemoved([2], "GPU")])  # the parent's thread still sends
        deadline = 200
        while pub.stats().sent < 2 and deadline:
            time.sleep(0.01)
            deadline -= 1
        assert pub.stats().sent == 2
    finally:
        pub.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_cannot_submit_copies_to_its_parents_engine() -> None:
    cache = make_tiered()
    engine = cache.tiers.controller.copy  # type: ignore[attr-defined]

    def child() -> str:
        try:
            engine.device_to_host(np.array([0], np.int32), np.array([0], np.int32))
            return "submitted"
        except RuntimeError as exc:
            return str(exc)

    assert "forked" in _in_child(child)
    prefill(cache, seq(0, 9))  # the parent's engine still copies
    cache.drain()
    assert cache.tier_stats().host_cached_pages == 2  # type: ignore[union-attr]
    cache.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_cache_that_forked_a_helper_reopens_its_store_after_close(tmp_path: Path) -> None:
    """The issue's case end to end: a runner forks a helper (which keeps
    running), closes its cache, and builds a new one on the same store: in
    strict mode that raised "already open", in recover mode the tier was
    silently disabled."""
    cache = make_tiered(storage=tmp_path / "s", on_open_error="strict")
    prefill(cache, seq(0, 17))
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the helper: idles with every descriptor it inherited
        select.select([go_r], [], [], 60)
        os._exit(0)
    os.close(go_r)
    try:
        cache.close()
        for mode in ("strict", "recover"):
            again = make_tiered(storage=tmp_path / "s", on_open_error=mode)
            assert again.tier_stats().storage_state == "opened"  # type: ignore[union-attr]
            req = again.admit(seq(0, 17))
            assert req.hit_storage == 16
            again.close()
    finally:
        os.write(go_w, b"x")
        os.close(go_w)
        os.waitpid(pid, 0)

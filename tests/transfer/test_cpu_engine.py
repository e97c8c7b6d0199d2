"""CpuCopyEngine: async copies on one worker, ordering, failures, validation, close."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from tests.transfer.transfer_testkit import as_bits, fill_random

from radixcache.transfer.engine import (
    INLINE_BYTES,
    CopyEngine,
    CopyRequest,
    CpuCopyEngine,
    Direction,
    make_copy_engine,
)
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer, KVSpec
from radixcache.transfer import engine as engine_module
from radixcache.transfer.ticket import FutureTicket, Ticket

MakeBuffers = Callable[..., tuple[DeviceKVBuffer, HostKVBuffer]]
WAIT = 5.0  # seconds; a healthy engine needs milliseconds


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def host_page_of(dev: DeviceKVBuffer, page: int) -> torch.Tensor:
    """Device page ``page`` in the host layout [2, L, P, H, D]."""
    return torch.stack((dev.k[:, page], dev.v[:, page]))


def close_within(engine: CpuCopyEngine, seconds: float = WAIT) -> None:
    closer = threading.Thread(target=engine.close, daemon=True)
    closer.start()
    closer.join(seconds)
    assert not closer.is_alive(), "close() hung"


@pytest.fixture
def buffers(spec: KVSpec, make_buffers: MakeBuffers) -> tuple[DeviceKVBuffer, HostKVBuffer]:
    return make_buffers(spec)


@pytest.fixture(params=[0, INLINE_BYTES], ids=["worker", "inline"])
def engine(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer], request: pytest.FixtureRequest
) -> Iterator[CpuCopyEngine]:
    """Every copy on the worker, or small ones inline when the engine is idle."""
    eng = CpuCopyEngine(*buffers, inline_bytes=request.param)
    yield eng
    close_within(eng)


def test_a_small_copy_on_an_idle_engine_is_done_on_return(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    dev, host = buffers
    eng = CpuCopyEngine(dev, host)
    seen: list[str] = []
    save = eng.device_to_host(ids(3, 5), ids(0, 1))
    assert save.done() and save.error is None  # ran on this thread: no wait
    assert torch.equal(as_bits(host.data[1]), as_bits(host_page_of(dev, 5)))
    close_within(eng)
    hooked = CpuCopyEngine(
        dev, host, before_copy=lambda r: seen.append(threading.current_thread().name)
    )
    assert hooked.device_to_host(ids(4), ids(2)).wait(WAIT)
    assert seen == ["kv-copy"]  # with a fault hook, every copy goes to the worker
    close_within(hooked)


def test_an_interrupt_during_an_inline_copy_fails_its_ticket_and_the_engine_goes_on(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while a small copy runs inline on the caller's thread: the
    KeyboardInterrupt reaches the caller, its ticket is failed (a drain never
    waits for it: a demo interrupted there used to hang at close), and the
    engine still copies and closes."""
    dev, host = buffers
    eng = CpuCopyEngine(dev, host)
    tickets: list[FutureTicket] = []
    real_ticket = engine_module.FutureTicket

    def recorded() -> FutureTicket:
        tickets.append(real_ticket())
        return tickets[-1]

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_module, "FutureTicket", recorded)
    monkeypatch.setattr(engine_module, "copy_small", interrupted)
    with pytest.raises(KeyboardInterrupt):
        eng.device_to_host(ids(3), ids(0))
    (ticket,) = tickets
    assert ticket.done() and isinstance(ticket.error, KeyboardInterrupt)
    monkeypatch.undo()
    assert eng.device_to_host(ids(5), ids(1)).wait(WAIT)
    assert torch.equal(as_bits(host.data[1]), as_bits(host_page_of(dev, 5)))
    close_within(eng)


def test_a_small_copy_behind_a_queued_one_waits_its_turn(
    spec: KVSpec, make_buffers: MakeBuffers
) -> None:
    """A copy too big to run inline is queued; a small one right after it must
    still observe it (it reads the host pages the first one writes)."""
    dev, host = make_buffers(spec, device_pages=12, host_pages=10)
    eng = CpuCopyEngine(dev, host, inline_bytes=spec.page_bytes)
    expect = [host_page_of(dev, p).clone() for p in range(6)]
    big = eng.device_to_host(ids(0, 1, 2, 3, 4, 5), ids(9, 8, 7, 6, 5, 4))
    small = eng.host_to_device(ids(4), ids(11))  # host page 4 <- device page 5, by ``big``
    assert small.wait(WAIT) and big.done()
    assert torch.equal(as_bits(host_page_of(dev, 11)), as_bits(expect[5]))
    close_within(eng)


def test_round_trip_through_the_engine(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer], engine: CpuCopyEngine
) -> None:
    dev, host = buffers
    expect = [host_page_of(dev, p).clone() for p in (9, 2, 6)]
    save = engine.device_to_host(ids(9, 2, 6), ids(7, 0, 4))
    assert isinstance(save, Ticket)
    assert save.wait(WAIT) and save.done() and save.error is None and save.result() is None
    for page, want in zip((7, 0, 4), expect):
        assert torch.equal(as_bits(host.data[page]), as_bits(want))
    fill_random(dev.k, 50)
    fill_random(dev.v, 51)
    load = engine.host_to_device(ids(7, 0, 4), ids(1, 11, 3))
    assert load.wait(WAIT) and load.error is None
    for page, want in zip((1, 11, 3), expect):
        assert torch.equal(as_bits(host_page_of(dev, page)), as_bits(want))


def test_copies_run_in_submission_order(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    dev, host = buffers
    seen: list[int] = []

    def slow_first(req: CopyRequest) -> None:
        if req.seq == 0:
            time.sleep(0.05)  # a racing engine would run the load first
        seen.append(req.seq)

    original = host_page_of(dev, 5).clone()
    eng = CpuCopyEngine(dev, host, before_copy=slow_first)
    try:
        save = eng.device_to_host(ids(5), ids(8))
        load = eng.host_to_device(ids(8), ids(10))  # reads what the save writes
        assert load.wait(WAIT)
        assert save.done(), "tickets complete in submission order"
        assert torch.equal(as_bits(host_page_of(dev, 10)), as_bits(original))
        assert seen == [0, 1]
    finally:
        close_within(eng)


def test_injected_failure_fails_only_its_ticket(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    dev, host = buffers
    boom = OSError("injected DMA failure")

    def fail_second(req: CopyRequest) -> None:
        if req.seq == 1:
            raise boom

    host_before = host.data.clone()
    eng = CpuCopyEngine(dev, host, before_copy=fail_second)
    try:
        first = eng.device_to_host(ids(0), ids(0))
        failed = eng.device_to_host(ids(1, 2), ids(3, 4))
        third = eng.device_to_host(ids(3), ids(9))
        assert failed.wait(WAIT), "wait() returns for a failed copy"
        assert failed.done() and failed.error is boom
        with pytest.raises(OSError, match="injected"):
            failed.result()
        assert torch.equal(as_bits(host.data[3:5]), as_bits(host_before[3:5]))  # untouched
        assert third.wait(WAIT) and third.error is None  # later work proceeds
        assert first.error is None
        assert torch.equal(as_bits(host.data[9]), as_bits(host_page_of(dev, 3)))
    finally:
        close_within(eng)


def test_submit_returns_while_the_copy_is_blocked(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    dev, host = buffers
    release = threading.Event()

    def hold(req: CopyRequest) -> None:
        release.wait(WAIT)

    eng = CpuCopyEngine(dev, host, before_copy=hold)
    try:
        device_pages = np.array([4, 6], dtype=np.int64)  # int64: no conversion copy to hide behind
        ticket = eng.device_to_host(device_pages, ids(1, 2))
        device_pages[:] = 0  # the caller may reuse its array right away
        time.sleep(0.02)
        assert not ticket.done()
        assert ticket.wait(0.01) is False  # a timed wait gives up
        release.set()
        assert ticket.wait(WAIT) and ticket.error is None
        assert torch.equal(as_bits(host.data[1]), as_bits(host_page_of(dev, 4)))
        assert torch.equal(as_bits(host.data[2]), as_bits(host_page_of(dev, 6)))
    finally:
        release.set()
        close_within(eng)


def test_close_drains_queued_copies(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    dev, host = buffers
    eng = CpuCopyEngine(dev, host, before_copy=lambda req: time.sleep(0.005))
    tickets = [eng.device_to_host(ids(p), ids(p)) for p in range(8)]
    close_within(eng)
    assert all(t.done() and t.error is None for t in tickets)
    for p in range(8):
        assert torch.equal(as_bits(host.data[p]), as_bits(host_page_of(dev, p)))
    eng.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        eng.device_to_host(ids(0), ids(0))


def test_empty_copy_completes(engine: CpuCopyEngine) -> None:
    ticket = engine.host_to_device(np.array([], dtype=np.int32), np.array([], dtype=np.int32))
    assert ticket.wait(WAIT) and ticket.error is None


@pytest.mark.parametrize(
    ("device_pages", "host_pages", "message"),
    [
        (ids(1, 2), ids(1), "device_pages has 2 ids but host_pages has 1"),
        (ids(1, 12), ids(1, 2), r"device_pages out of range \[0, 12\): min 1, max 12"),
        (ids(-1), ids(0), r"device_pages out of range \[0, 12\): min -1"),
        (ids(0), ids(10), r"host_pages out of range \[0, 10\)"),
        (
            np.array([[1, 2]], dtype=np.int32),
            ids(0, 1),
            "device_pages must be a 1-D integer array",
        ),
        (
            np.array([1.0, 2.0]),
            ids(0, 1),
            "device_pages must be a 1-D integer array, got dtype float64",
        ),
        (np.array([True]), ids(0), "dtype bool"),
        (ids(1, 2), ids(3, 3), r"host_pages lists page\(s\) \[3\] more than once"),
    ],
)
def test_device_to_host_rejects_bad_arguments(
    engine: CpuCopyEngine,
    device_pages: np.ndarray,
    host_pages: np.ndarray,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        engine.device_to_host(device_pages, host_pages)


def test_host_to_device_rejects_bad_arguments(engine: CpuCopyEngine) -> None:
    with pytest.raises(ValueError, match="host_pages has 1 ids but device_pages has 2"):
        engine.host_to_device(ids(1), ids(1, 2))
    with pytest.raises(ValueError, match=r"device_pages lists page\(s\) \[5\] more than once"):
        engine.host_to_device(ids(1, 1), ids(5, 5))  # same source twice is fine, same target is not
    with pytest.raises(ValueError, match=r"host_pages out of range \[0, 10\)"):
        engine.host_to_device(ids(10), ids(0))


def test_engine_refuses_mismatched_buffers(spec: KVSpec) -> None:
    other = KVSpec(num_layers=3, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16, page_size=4)
    with pytest.raises(ValueError, match="same KVSpec"):
        CpuCopyEngine(DeviceKVBuffer(spec, 4), HostKVBuffer(other, 4))


def test_factory_picks_the_cpu_engine(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    eng: CopyEngine = make_copy_engine(*buffers)
    try:
        assert isinstance(eng, CpuCopyEngine)
        assert eng.device_to_host(ids(0), ids(0)).wait(WAIT)
    finally:
        eng.close()


def test_fault_hook_sees_each_request(
    buffers: tuple[DeviceKVBuffer, HostKVBuffer],
) -> None:
    seen: list[tuple[int, Direction, list[int], list[int]]] = []
    eng = CpuCopyEngine(
        *buffers,
        before_copy=lambda r: seen.append(
            (r.seq, r.direction, r.pairs.src.tolist(), r.pairs.dst.tolist())
        ),
    )
    eng.device_to_host(ids(3, 1), ids(2, 5))
    eng.host_to_device(ids(2), ids(7))
    close_within(eng)
    assert seen == [
        (0, Direction.DEVICE_TO_HOST, [3, 1], [2, 5]),
        (1, Direction.HOST_TO_DEVICE, [2], [7]),
    ]

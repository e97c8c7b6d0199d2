"""CudaCopyEngine (gpu-marked) and its pure-numpy step planner (runs anywhere)."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
import torch
from tests.transfer.transfer_testkit import as_bits, fill_random

from radixcache.transfer.cuda_engine import (
    CudaCopyEngine,
    CudaTicket,
    Step,
    _CrossOrder,
    plan_steps,
)
from radixcache.transfer.engine import Direction, make_copy_engine
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer, KVSpec
from radixcache.transfer.ticket import Ticket

SPEC = KVSpec(num_layers=4, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16, page_size=16)
SPIN = 200_000_000  # GPU cycles of torch.cuda._sleep: ~0.1 s, far longer than a submit


def test_plan_steps_cuts_host_runs_at_step_boundaries() -> None:
    steps = plan_steps(np.array([0, 1, 2, 5, 6, 9], dtype=np.int64), pages_per_step=4)
    assert steps == [Step(0, 4, ((0, 3), (3, 4))), Step(4, 6, ((4, 5), (5, 6)))]
    assert plan_steps(np.array([3, 4, 5], dtype=np.int64), pages_per_step=8) == [
        Step(0, 3, ((0, 3),))
    ]
    assert plan_steps(np.empty(0, dtype=np.int64), pages_per_step=2) == []


class FakeEvent:
    def __init__(self, complete: bool = True) -> None:
        self.complete = complete

    def query(self) -> bool:
        return self.complete

    def synchronize(self) -> None:
        self.complete = True


class FakeStream:
    def __init__(self, device: object = None) -> None:
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event)

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        return FakeEvent()

    def synchronize(self) -> None:
        pass


class FailingEvent(FakeEvent):
    def query(self) -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_cuda_ticket_polls_its_event_and_reports_cuda_errors() -> None:
    pending = FakeEvent(complete=False)
    ticket = CudaTicket(pending, [])  # type: ignore[arg-type]
    assert isinstance(ticket, Ticket)
    assert not ticket.done() and ticket.wait(0.01) is False
    with pytest.raises(RuntimeError, match="not done"):
        ticket.result()
    pending.complete = True
    assert ticket.done() and ticket.wait(0) and ticket.error is None and ticket.result() is None
    failed = CudaTicket(FailingEvent(), [])  # type: ignore[arg-type]
    assert failed.wait(1.0) and failed.done()
    assert isinstance(failed.error, RuntimeError)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        failed.result()


def test_cuda_ticket_routes_stream_waits_to_the_right_event() -> None:
    done, layers = FakeEvent(), [FakeEvent(), FakeEvent()]
    stream = FakeStream()
    by_layer = CudaTicket(done, layers)  # type: ignore[arg-type]
    by_layer.wait_layer(stream, 1)  # type: ignore[arg-type]
    by_layer.wait_stream(stream)  # type: ignore[arg-type]
    whole = CudaTicket(done, [])  # type: ignore[arg-type]
    whole.wait_layer(stream, 0)  # type: ignore[arg-type]
    assert stream.waited == [layers[1], done, done]
    assert (by_layer.num_layer_events, whole.num_layer_events) == (2, 0)


def test_cross_direction_order_names_the_copy_to_wait_for() -> None:
    order = _CrossOrder(num_device=10, num_host=10)
    d2h, h2d = Direction.DEVICE_TO_HOST, Direction.HOST_TO_DEVICE
    save = FakeEvent(complete=False)
    order.record(d2h, 0, np.array([1, 2]), np.array([5]), save)  # type: ignore[arg-type]
    assert order.blocker(h2d, np.array([7]), np.array([5])) is save  # shares host page 5
    assert order.blocker(h2d, np.array([2]), np.array([6])) is save  # shares device page 2
    assert order.blocker(h2d, np.array([7]), np.array([6])) is None  # disjoint: overlap freely
    assert order.blocker(d2h, np.array([1]), np.array([5])) is None  # same direction: stream FIFO
    save.complete = True
    assert order.blocker(h2d, np.array([1]), np.array([5])) is None  # finished copies are forgotten


def test_data_path_on_cpu_with_stubbed_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI has no GPU: run the engine's staging, host-run DMAs and scatters on CPU
    tensors with the stream API stubbed out. The gpu tests cover the real thing."""
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    dev = DeviceKVBuffer(SPEC, 40)
    host = HostKVBuffer(SPEC, 32)
    for t, seed in ((dev.k, 0), (dev.v, 1), (host.data, 2)):
        fill_random(t, seed)
    dev.device = torch.device("cuda", 0)  # pass the constructor's checks ...
    host.pinned = True
    for staging_pages in (1, 3, 64):
        eng = CudaCopyEngine(dev, host, max_staging_bytes=staging_pages * SPEC.page_bytes)
        eng._dev = torch.device("cpu")  # ... then stage on the CPU
        rng = np.random.default_rng(staging_pages)
        device_ids, host_ids = (
            rng.choice(40, 20, replace=False),
            rng.choice(32, 20, replace=False),
        )
        want = (
            torch.stack((dev.k[:, device_ids], dev.v[:, device_ids]), dim=1)
            .permute(2, 1, 0, 3, 4, 5)
            .clone()
        )
        assert eng.device_to_host(device_ids, host_ids).wait()
        assert torch.equal(as_bits(host.data[host_ids]), as_bits(want))
        for load in (eng.host_to_device, eng.host_to_device_by_layer):
            fill_random(dev.k, 9)
            back = rng.permutation(40)[:20]
            ticket = load(host_ids, back)
            got = torch.stack((dev.k[:, back], dev.v[:, back]), dim=1).permute(2, 1, 0, 3, 4, 5)
            assert torch.equal(as_bits(got), as_bits(want)), (staging_pages, load)
            by_layer = load == eng.host_to_device_by_layer
            assert ticket.num_layer_events == (SPEC.num_layers if by_layer else 0)
        eng.close()


def buffers(
    device_pages: int = 40, host_pages: int = 32, seed: int = 0
) -> tuple[DeviceKVBuffer, HostKVBuffer]:
    dev = DeviceKVBuffer(SPEC, device_pages, "cuda")
    host = HostKVBuffer(SPEC, host_pages, pin=True)
    fill_random(dev.k, seed)
    fill_random(dev.v, seed + 1)
    fill_random(host.data, seed + 2)
    torch.cuda.synchronize()
    return dev, host


def device_pages_as_host(dev: DeviceKVBuffer, pages: np.ndarray) -> torch.Tensor:
    """Device pages in the host layout, on the CPU: [n, 2, L, P, H, D]."""
    idx = torch.from_numpy(pages.astype(np.int64)).cuda()
    return torch.stack((dev.k[:, idx], dev.v[:, idx]), dim=1).permute(2, 1, 0, 3, 4, 5).cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("staging_pages", [2, 64])
def test_round_trip_is_bit_exact(staging_pages: int) -> None:
    dev, host = buffers()
    rng = np.random.default_rng(3)
    device_ids = rng.choice(40, 20, replace=False)
    host_ids = rng.choice(32, 20, replace=False)
    want = device_pages_as_host(dev, device_ids)
    with CudaCopyEngine(dev, host, max_staging_bytes=staging_pages * SPEC.page_bytes) as eng:
        save = eng.device_to_host(device_ids.astype(np.int32), host_ids.astype(np.int32))
        assert isinstance(save, Ticket) and isinstance(save, CudaTicket)
        assert save.wait(10) and save.error is None
        assert torch.equal(as_bits(host.data[torch.from_numpy(host_ids)]), as_bits(want))
        fill_random(dev.k, 77)
        fill_random(dev.v, 78)
        back = rng.permutation(40)[:20]
        load = eng.host_to_device(host_ids, back)
        assert load.wait(10) and load.error is None
        assert torch.equal(as_bits(device_pages_as_host(dev, back)), as_bits(want))


@pytest.mark.gpu
def test_save_waits_for_the_compute_stream_and_submit_does_not_block() -> None:
    dev, host = buffers()
    pages = np.array([5, 17, 3], dtype=np.int32)
    index = torch.from_numpy(pages).long().cuda()  # before the spin: .cuda() would wait for it
    with CudaCopyEngine(dev, host) as eng:
        assert eng.device_to_host(pages, np.array([7, 8, 9])).wait(10)  # warm up allocators
        torch.cuda._sleep(10 * SPIN)  # the compute stream is busy for ~1 s ...
        # ... then writes the pages to save (index_fill_ takes the value as a
        # kernel argument; ``dev.k[:, index] = 3.0`` would copy a CPU scalar up
        # and wait for the stream, spin included)
        dev.k.index_fill_(1, index, 3.0)
        assert not torch.cuda.current_stream().query(), "the test's setup waited for the spin"
        started = time.perf_counter()
        ticket = eng.device_to_host(pages, np.array([0, 1, 2], dtype=np.int32))
        submit_s = time.perf_counter() - started
        assert submit_s < 0.05, f"submit blocked for {submit_s:.3f} s"
        assert not ticket.done()  # the copy is queued behind the compute work
        assert ticket.wait(10) and ticket.error is None
    assert bool((host.data[0:3, 0].float() == 3.0).all()), (
        "the save ran before the compute that wrote the pages"
    )


@pytest.mark.gpu
def test_runner_stream_waits_on_the_load_event() -> None:
    dev, host = buffers()
    runner = torch.cuda.Stream()
    host_ids, device_ids = np.array([4, 9, 10]), np.array([30, 2, 7])
    want = host.data[torch.from_numpy(host_ids)].clone()
    idx = torch.from_numpy(device_ids).cuda()  # before the spin: .cuda() would wait for it
    with CudaCopyEngine(dev, host) as eng:
        torch.cuda._sleep(SPIN)  # delays the load (it waits for this stream)
        ticket = eng.host_to_device(host_ids, device_ids)
        ticket.wait_stream(runner)  # the runner's stream, not the thread, waits
        with torch.cuda.stream(runner):
            seen_k = dev.k[:, idx].clone()
            seen_v = dev.v[:, idx].clone()
        runner.synchronize()
        assert ticket.done()
    assert torch.equal(as_bits(seen_k.cpu()), as_bits(want[:, 0].transpose(0, 1)))
    assert torch.equal(as_bits(seen_v.cpu()), as_bits(want[:, 1].transpose(0, 1)))


@pytest.mark.gpu
def test_load_by_layer_exposes_one_event_per_layer() -> None:
    dev, host = buffers()
    runner = torch.cuda.Stream()
    host_ids, device_ids = np.array([1, 2, 3, 20]), np.array([8, 9, 10, 0])
    want = host.data[torch.from_numpy(host_ids)].clone()
    idx = torch.from_numpy(device_ids).cuda()
    with CudaCopyEngine(dev, host) as eng:
        torch.cuda._sleep(SPIN)
        ticket = eng.host_to_device_by_layer(host_ids, device_ids)
        assert ticket.num_layer_events == SPEC.num_layers
        seen = []
        for layer in range(SPEC.num_layers):
            ticket.wait_layer(runner, layer)
            with torch.cuda.stream(runner):
                seen.append(dev.k[layer, idx].clone())
        runner.synchronize()
    for layer, got in enumerate(seen):
        assert torch.equal(as_bits(got.cpu()), as_bits(want[:, 0, layer]))


@pytest.mark.gpu
def test_opposite_directions_on_shared_pages_stay_ordered() -> None:
    dev, host = buffers(device_pages=96, host_pages=80)
    src = np.arange(0, 64)
    want = device_pages_as_host(dev, src)
    with CudaCopyEngine(dev, host) as eng:
        save = eng.device_to_host(src, np.arange(64))  # a big save into host 0..63
        load = eng.host_to_device(np.arange(64), np.arange(96 - 64, 96)[::-1].copy())
        assert load.wait(10) and save.done()
        got = device_pages_as_host(dev, np.arange(96 - 64, 96)[::-1].copy())
        assert torch.equal(as_bits(got), as_bits(want)), (
            "the load read host pages before the save wrote them"
        )
        before = host.data[70].clone()
        load2 = eng.host_to_device(np.array([70]), np.array([0]))
        save2 = eng.device_to_host(np.array([90]), np.array([70]))  # overwrites what load2 reads
        assert save2.wait(10) and load2.done()
        assert torch.equal(as_bits(device_pages_as_host(dev, np.array([0]))[0]), as_bits(before))


@pytest.mark.gpu
def test_cuda_engine_validates_and_factory_picks_it() -> None:
    dev, host = buffers()
    with pytest.raises(ValueError, match="pinned host buffer"):
        CudaCopyEngine(dev, HostKVBuffer(SPEC, 4, pin=False))
    eng = make_copy_engine(dev, host)
    try:
        assert isinstance(eng, CudaCopyEngine)
        with pytest.raises(ValueError, match="host_pages lists"):
            eng.device_to_host(np.array([1, 2]), np.array([3, 3]))
        ticket = eng.device_to_host(np.array([1]), np.array([3]))
    finally:
        eng.close()
    assert ticket.done()  # close() waited for it
    with pytest.raises(RuntimeError, match="closed"):
        eng.device_to_host(np.array([1]), np.array([3]))

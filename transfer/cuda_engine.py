"""CUDA copy engine: page copies on dedicated streams, completion as CUDA events.

Data path of one copy. Pairs are sorted by host page first, so each run of
consecutive host pages is one DMA; ``staging`` is device memory from torch's
caching allocator, at most ``max_staging_bytes`` per step::

    device_to_host:
      k, v [L, N, X] --index_select, all layers--> staging [m, 2, L, X] (page-first)
                     --cudaMemcpyAsync per host run--> pinned host pages
    host_to_device:
      pinned host pages --cudaMemcpyAsync per host run--> staging [m, 2, L, X]
                     --index_copy_, all layers (or layer by layer)--> k, v

The gathers and scatters run at device-memory speed (TB/s), so a copy costs
about what the DMAs of its bytes cost.

Ordering, which a runner may rely on:

* each direction has its own stream; copies of one direction run in
  submission order;
* every copy first waits for the work queued so far on the caller's current
  (compute) stream: a save sees the kernels that wrote its pages, and a load
  cannot overwrite pages that a queued kernel still reads;
* a copy that names a page (device or host) named by an in-flight copy of the
  other direction waits for that copy; copies on disjoint pages of the two
  directions overlap (the link is duplex);
* the compute stream waits for a load only when told to:
  ``ticket.wait_stream(stream)``, or ``ticket.wait_layer(stream, layer)`` for a
  load submitted with ``host_to_device_by_layer``.

The caller's thread never blocks on submit: kernels, DMAs from/to pinned
memory and event records are only enqueued, and page-id arrays go up through
pinned memory. ``done()`` polls an event. All methods are called from the owner
thread. cupy is never imported here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from radixcache.transfer.convert import Ids, check_buffers
from radixcache.transfer.contract import Direction, check_device_to_host, check_host_to_device
from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer


class CudaTicket:
    """Ticket of one CUDA copy; done once its final event has completed.

    Implements the ``Ticket`` protocol, plus ``wait_stream``/``wait_layer`` for
    making a CUDA stream (not a thread) wait. Owned by the owner thread.
    """

    __slots__ = ("_done_event", "_error", "_finished", "_layer_events")

    def __init__(
        self, done_event: torch.cuda.Event, layer_events: Sequence[torch.cuda.Event]
    ) -> None:
        self._done_event = done_event  # recorded on the copy stream after the last op
        self._layer_events = tuple(layer_events)  # per layer, or empty
        self._finished = False  # the event was seen complete (or failed)
        self._error: BaseException | None = None  # a CUDA error surfaced by the copy

    def done(self) -> bool:
        if not self._finished:
            try:
                if not self._done_event.query():
                    return False
            except RuntimeError as exc:  # a CUDA error reported at this event
                self._error = exc
            self._finished = True
        return True

    def wait(self, timeout: float | None = None) -> bool:
        if self._finished:
            return True
        if timeout is None:
            try:
                self._done_event.synchronize()
            except RuntimeError as exc:
                self._error = exc
                self._finished = True
            return self.done()
        deadline = time.monotonic() + timeout
        delay = 50e-6
        while not self.done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(2 * delay, 2e-3)
        return True

    @property
    def error(self) -> BaseException | None:
        return self._error

    def result(self) -> None:
        if not self.done():
            raise RuntimeError("ticket is not done yet; call wait() first")
        if self._error is not None:
            raise self._error

    @property
    def num_layer_events(self) -> int:
        """How many per-layer events this ticket has (0 unless loaded by layer)."""
        return len(self._layer_events)

    def wait_stream(self, stream: torch.cuda.Stream) -> None:
        """Make ``stream`` wait, on the GPU, until the whole copy is complete."""
        stream.wait_event(self._done_event)

    def wait_layer(self, stream: torch.cuda.Stream, layer: int) -> None:
        """Make ``stream`` wait until layer ``layer`` of every page is in place.

        Without per-layer events this waits for the whole copy.
        """
        if self._layer_events:
            stream.wait_event(self._layer_events[layer])
        else:
            stream.wait_event(self._done_event)


@dataclass(frozen=True, slots=True)
class Step:
    """One staging step: positions ``[lo, hi)`` of the host-sorted pairs.

    ``runs`` cuts the step into runs of consecutive host pages (one DMA each).
    """

    lo: int  # first position in the step
    hi: int  # one past the last position
    runs: tuple[tuple[int, int], ...]  # (lo, hi) per host run, absolute positions


def plan_steps(sorted_host_ids: Ids, pages_per_step: int) -> list[Step]:
    """Cut host-sorted pairs into staging steps and host runs (pure numpy)."""
    n = int(sorted_host_ids.size)
    if n == 0:
        return []
    run_cuts = np.flatnonzero(np.diff(sorted_host_ids) != 1) + 1
    step_cuts = np.arange(pages_per_step, n, pages_per_step)
    bounds = np.union1d(np.concatenate((run_cuts, step_cuts)), [0, n]).astype(np.int64).tolist()
    steps: list[Step] = []
    runs: list[tuple[int, int]] = []
    for lo, hi in itertools.pairwise(bounds):
        if runs and lo % pages_per_step == 0:
            steps.append(Step(runs[0][0], runs[-1][1], tuple(runs)))
            runs = []
        runs.append((lo, hi))
    steps.append(Step(runs[0][0], runs[-1][1], tuple(runs)))
    return steps


class _CrossOrder:
    """Which in-flight copy of each direction last named each page.

        device[dir][p] = seq of the newest copy of ``dir`` naming device page p (-1: none)
        host[dir][p]   = the same for host pages
        pending[dir]   = {seq: done event} for copies of ``dir`` not yet seen complete

    A copy in one direction waits for the newest copy of the other direction
    that shares a page with it; that stream is FIFO, so one event covers all
    older copies there.
    """

    def __init__(self, num_device: int, num_host: int) -> None:
        self._device = {d: np.full(num_device, -1, dtype=np.int64) for d in Direction}
        self._host = {d: np.full(num_host, -1, dtype=np.int64) for d in Direction}
        self._pending: dict[Direction, dict[int, torch.cuda.Event]] = {d: {} for d in Direction}

    def blocker(
        self, direction: Direction, device_ids: Ids, host_ids: Ids
    ) -> torch.cuda.Event | None:
        """The event a new copy in ``direction`` must wait for, or None."""
        other = next(d for d in Direction if d is not direction)
        pending = self._pending[other]
        for seq in list(pending):  # forget completed copies, oldest first
            if not pending[seq].query():
                break
            del pending[seq]
        if not pending:
            return None
        newest = max(
            int(self._device[other][device_ids].max(initial=-1)),
            int(self._host[other][host_ids].max(initial=-1)),
        )
        return pending.get(newest)

    def record(
        self,
        direction: Direction,
        seq: int,
        device_ids: Ids,
        host_ids: Ids,
        done: torch.cuda.Event,
    ) -> None:
        self._device[direction][device_ids] = seq
        self._host[direction][host_ids] = seq
        self._pending[direction][seq] = done


class CudaCopyEngine:
    """A ``CopyEngine`` for a device buffer on a GPU and a pinned host buffer.

    Owns two CUDA streams (one per direction). Writes only the destination
    pages of each copy, on its streams. ``max_staging_bytes`` bounds the device
    memory one copy step borrows from torch's caching allocator.
    """

    def __init__(
        self,
        device_buf: DeviceKVBuffer,
        host_buf: HostKVBuffer,
        *,
        max_staging_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        check_buffers(device_buf, host_buf)
        spec = device_buf.spec
        if device_buf.device.type != "cuda":
            raise ValueError(
                f"CudaCopyEngine needs a device buffer on cuda, got {device_buf.device}"
            )
        if not host_buf.pinned:
            raise ValueError(
                "CudaCopyEngine needs a pinned host buffer (HostKVBuffer(..., pin=True)); "
                "copies with pageable memory would block the caller"
            )
        if max_staging_bytes < spec.page_bytes:
            raise ValueError(
                f"max_staging_bytes={max_staging_bytes} is less than one page ({spec.page_bytes} B)"
            )
        dev = device_buf.device
        self._dev = (
            dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        )
        self._device_buf = device_buf
        self._host_buf = host_buf
        self._k = device_buf.k.flatten(2)  # [L, N, X], written by loads
        self._v = device_buf.v.flatten(2)
        self._k_pages = self._k.transpose(0, 1)  # [N, L, X] page view, read by saves
        self._v_pages = self._v.transpose(0, 1)
        self._host = host_buf.data.flatten(3)  # [M, 2, L, X], written by saves
        self._pages_per_step = max_staging_bytes // spec.page_bytes
        self._streams = {
            Direction.DEVICE_TO_HOST: torch.cuda.Stream(device=self._dev),
            Direction.HOST_TO_DEVICE: torch.cuda.Stream(device=self._dev),
        }
        self._order = _CrossOrder(device_buf.num_pages, host_buf.num_pages)
        self._seq = 0  # next submission number
        self._closed = False

    def device_to_host(self, device_pages: npt.ArrayLike, host_pages: npt.ArrayLike) -> CudaTicket:
        pairs = check_device_to_host(self._device_buf, self._host_buf, device_pages, host_pages)
        return self._submit(Direction.DEVICE_TO_HOST, pairs.src, pairs.dst, by_layer=False)

    def host_to_device(self, host_pages: npt.ArrayLike, device_pages: npt.ArrayLike) -> CudaTicket:
        pairs = check_host_to_device(self._device_buf, self._host_buf, host_pages, device_pages)
        return self._submit(Direction.HOST_TO_DEVICE, pairs.dst, pairs.src, by_layer=False)

    def host_to_device_by_layer(
        self, host_pages: npt.ArrayLike, device_pages: npt.ArrayLike
    ) -> CudaTicket:
        """Like ``host_to_device``, plus one event per layer (``ticket.wait_layer``).

        Layer ``l`` is scattered into place and its event recorded before layer
        ``l + 1``, so a runner that waits per layer can start layer 0 before the
        last layers are in place. (The DMAs move whole pages, so every layer's
        bytes cross the link before the first layer event.)
        """
        pairs = check_host_to_device(self._device_buf, self._host_buf, host_pages, device_pages)
        return self._submit(Direction.HOST_TO_DEVICE, pairs.dst, pairs.src, by_layer=True)

    def close(self) -> None:
        """Wait for every submitted copy, then refuse new ones. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for stream in self._streams.values():
            stream.synchronize()

    def __enter__(self) -> CudaCopyEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (owner thread; everything below only enqueues GPU work) ---
    def _submit(
        self, direction: Direction, device_ids: Ids, host_ids: Ids, *, by_layer: bool
    ) -> CudaTicket:
        if self._closed:
            raise RuntimeError("copy engine is closed")
        seq = self._seq
        self._seq += 1
        order = np.argsort(host_ids, kind="stable")
        host_ids, device_ids = host_ids[order], device_ids[order]
        stream = self._streams[direction]
        compute = torch.cuda.current_stream(self._dev)
        with torch.cuda.device(self._dev), torch.cuda.stream(stream):
            stream.wait_event(compute.record_event())
            blocker = self._order.blocker(direction, device_ids, host_ids)
            if blocker is not None:
                stream.wait_event(blocker)
            steps = plan_steps(host_ids, self._pages_per_step)
            layer_events: list[torch.cuda.Event] = []
            if direction is Direction.DEVICE_TO_HOST:
                self._save(steps, device_ids, host_ids)
            else:
                layer_events = self._load(steps, device_ids, host_ids, by_layer=by_layer)
            done = stream.record_event()
        self._order.record(direction, seq, device_ids, host_ids, done)
        return CudaTicket(done, layer_events)

    def _upload(self, ids: Ids) -> torch.Tensor:
        # Through pinned memory, so the upload is asynchronous; torch's caching
        # host allocator keeps that small block until the upload has run.
        return torch.from_numpy(ids).pin_memory().to(self._dev, non_blocking=True)

    def _stage(self, pages: int) -> torch.Tensor:
        # Allocated while the copy stream is current: the block is reused only
        # by later work on the same stream, so dropping it right away is safe.
        return torch.empty((pages, *self._host.shape[1:]), dtype=self._host.dtype, device=self._dev)

    def _save(self, steps: list[Step], device_ids: Ids, host_ids: Ids) -> None:
        for step in steps:
            index = self._upload(device_ids[step.lo : step.hi])
            stage = self._stage(step.hi - step.lo)
            torch.index_select(self._k_pages, 0, index, out=stage[:, 0])
            torch.index_select(self._v_pages, 0, index, out=stage[:, 1])
            for lo, hi in step.runs:
                h0 = int(host_ids[lo])
                self._host[h0 : h0 + hi - lo].copy_(
                    stage[lo - step.lo : hi - step.lo], non_blocking=True
                )

    def _load(
        self, steps: list[Step], device_ids: Ids, host_ids: Ids, *, by_layer: bool
    ) -> list[torch.cuda.Event]:
        layer_events: list[torch.cuda.Event] = []
        for i, step in enumerate(steps):
            stage = self._stage(step.hi - step.lo)
            for lo, hi in step.runs:
                h0 = int(host_ids[lo])
                stage[lo - step.lo : hi - step.lo].copy_(
                    self._host[h0 : h0 + hi - lo], non_blocking=True
                )
            index = self._upload(device_ids[step.lo : step.hi])
            if not by_layer:
                self._k.index_copy_(1, index, stage[:, 0].transpose(0, 1))
                self._v.index_copy_(1, index, stage[:, 1].transpose(0, 1))
                continue
            last = i == len(steps) - 1
            for layer in range(self._k.shape[0]):
                self._k[layer].index_copy_(0, index, stage[:, 0, layer])
                self._v[layer].index_copy_(0, index, stage[:, 1, layer])
                if last:
                    layer_events.append(torch.cuda.current_stream(self._dev).record_event())
        if by_layer and not steps:  # nothing to move: every layer is ready at once
            stream = torch.cuda.current_stream(self._dev)
            layer_events = [stream.record_event() for _ in range(self._k.shape[0])]
        return layer_events

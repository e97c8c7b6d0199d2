"""Layout conversion: device pages (layer-first) <-> host pages (page-first).

Both buffers are seen through *page views*, tensors whose dim 0 is the page id
and whose page holds every layer (X = P * H * D elements)::

    device K  k[L, N, X]  --transpose(0, 1)-->  [N, L, X]  page stride X,      layer stride N*X
    host   K  data[:, 0]                   ->   [M, L, X]  page stride 2*L*X,  layer stride X
    (V likewise: device ``v``, host ``data[:, 1]``)

so copying page ``s`` of one to page ``t`` of the other is one strided
``[L, X]`` block, and a batch of pairs ``(s_i -> t_i)`` is a copy of "rows"
between two page views. ``plan_copy`` groups the pairs so that the number of
torch/numpy calls grows with the number of *runs* of consecutive ids, never
with pages times layers:

* MERGED: a run whose ids are consecutive on both sides is one strided block
  copy (a numpy slice assignment).
* GATHER: sort by destination and cut where destination ids stop being
  consecutive. Each destination run ``[t0, t0 + r)`` with scattered sources is
  one ``torch.index_select(src, 0, ids, out=dst[t0:t0 + r])``: every layer of
  every page of the run in one call, written straight into place.
* SCATTER: the mirror image, by source runs: one numpy fancy assignment
  ``dst[ids] = src[s0:s0 + r]`` per source run.
* STAGED: when even the fewer runs are too small to pay for a call each
  (small pages scattered on both sides), pages go through a bounded
  temporary: one vectorized gather into it, one vectorized scatter out of it,
  per chunk of pages.

A batch of at most ``SMALL_COPY_BYTES`` skips the plan: ``PageViews`` holds
the four page views as numpy arrays, built once per buffer pair, and
``copy_small`` moves the batch with one fancy gather-and-scatter per view
(~10 us for tens of small pages, where planning and building the views
cost ~200 us: the copy engine's owner thread runs such copies inline).

The side with fewer runs leads (SCATTER on a tie). Why these calls, measured
on the 2-core dev box (32 layers, 8 heads, dim 128, fp16, P=16), as fractions
of a plain contiguous ``copy_`` of the same bytes: numpy's fancy assignment
and slice copies 0.9-1.2 (single-threaded, and steady when other processes
load the cores); ``index_select`` with ``out=`` 0.6-0.85 (its two OpenMP
threads slow down sharply under load); ``index_copy_``/``index_put_`` 0.1-0.35
(element-wise kernels); any scheme that writes every byte twice ~0.5. numpy
has no fancy *gather* that writes into a view, hence torch for GATHER.

These functions run on whichever thread calls them (the CPU copy engine's
worker). They mutate only the destination pages named in the pairs; callers
must keep both sides' pages untouched until the copy is over.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from radixcache.transfer.host import HostKVBuffer
from radixcache.transfer.layout import DeviceKVBuffer

Ids = npt.NDArray[np.int64]

# A run moving fewer bytes than this is cheaper through the STAGED path: one
# torch/numpy call costs ~5-10 us, which is ~200 KB at memcpy speed.
MIN_RUN_BYTES = 256 * 1024
# Upper bound on the STAGED path's temporary (stays mostly in cache).
STAGE_BYTES = 8 * 1024 * 1024

_INT_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def check_ids(name: str, ids: npt.ArrayLike, limit: int) -> Ids:
    """``ids`` as a fresh 1-D int64 array within ``[0, limit)``, or ValueError."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer array, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= limit:
        raise ValueError(f"{name} out of range [0, {limit}): min {lo}, max {hi}")
    return arr.astype(np.int64, copy=True)


@dataclass(frozen=True, slots=True)
class PagePairs:
    """A validated batch of page copies ``src[i] -> dst[i]``.

    Both arrays are private int64 copies, so the caller may reuse its own
    arrays right after submitting. Destinations are unique (a page is written
    once per copy); a source may appear more than once.
    """

    src: Ids  # source page ids
    dst: Ids  # destination page ids, unique, same length as src

    @classmethod
    def check(
        cls,
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        *,
        src_name: str,
        src_limit: int,
        dst_name: str,
        dst_limit: int,
    ) -> PagePairs:
        """Validate caller input; ValueError names the argument and the numbers."""
        s = check_ids(src_name, src, src_limit)
        d = check_ids(dst_name, dst, dst_limit)
        if s.size != d.size:
            raise ValueError(f"{src_name} has {s.size} ids but {dst_name} has {d.size}")
        if d.size > 1:
            sorted_d = np.sort(d)
            dup = sorted_d[1:][sorted_d[1:] == sorted_d[:-1]]
            if dup.size:
                raise ValueError(
                    f"{dst_name} lists page(s) {np.unique(dup)[:8].tolist()} more than once; "
                    "each destination page is written once per copy"
                )
        return cls(s, d)

    def __len__(self) -> int:
        return int(self.src.size)


class PlanKind(enum.Enum):
    GATHER = "gather"  # one index_select per destination run
    SCATTER = "scatter"  # one numpy fancy assignment per source run
    STAGED = "staged"  # gather into a bounded temporary, scatter out, per chunk


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """How one batch of pairs is executed (the same plan serves K and V).

    Run ``i`` covers positions ``[bounds[i], bounds[i + 1])`` of ``src``/``dst``
    (already put in execution order). ``merged[i]`` says both sides of run ``i``
    are consecutive ids, so it is a single slice copy.
    """

    kind: PlanKind
    src: Ids  # source ids in execution order
    dst: Ids  # destination ids in execution order
    bounds: Ids  # run boundaries, [0, ..., n]; runs = len(bounds) - 1
    merged: npt.NDArray[np.bool_]  # per run: consecutive on both sides

    @property
    def num_runs(self) -> int:
        return int(self.bounds.size) - 1


LOOP_MIN_PAGE_BYTES = 256 << 10  # per view (K or V): gather such pages one by one


def _run_bounds(sorted_ids: Ids) -> Ids:
    """Boundaries of maximal runs of consecutive ids in ``sorted_ids``."""
    n = sorted_ids.size
    cuts = np.flatnonzero(np.diff(sorted_ids) != 1) + 1
    return np.concatenate(([0], cuts, [n])).astype(np.int64) if n else np.zeros(1, np.int64)


def _merged(other: Ids, bounds: Ids) -> npt.NDArray[np.bool_]:
    """Per run: are the ids of ``other`` within it consecutive ascending?"""
    breaks = np.concatenate(([0], np.cumsum(np.diff(other) != 1)))
    if bounds.size < 2:
        return np.zeros(0, dtype=np.bool_)
    return np.asarray(breaks[bounds[1:] - 1] == breaks[bounds[:-1]], dtype=np.bool_)


def plan_copy(pairs: PagePairs, page_bytes: int, min_run_bytes: int = MIN_RUN_BYTES) -> CopyPlan:
    """Group ``pairs`` into the fewest calls (see the module docstring).

    ``page_bytes`` is the size of one page of one view (one of K or V).
    """
    by_dst = np.argsort(pairs.dst, kind="stable")
    by_src = np.argsort(pairs.src, kind="stable")
    dst_bounds = _run_bounds(pairs.dst[by_dst])
    src_bounds = _run_bounds(pairs.src[by_src])
    n = len(pairs)
    if dst_bounds.size < src_bounds.size:
        kind, order, bounds = PlanKind.GATHER, by_dst, dst_bounds
    else:
        kind, order, bounds = PlanKind.SCATTER, by_src, src_bounds
    runs = bounds.size - 1
    if runs > 1 and n * page_bytes < runs * min_run_bytes:
        per_chunk = max(1, STAGE_BYTES // max(1, page_bytes))
        kind, order = PlanKind.STAGED, by_dst
        bounds = np.append(np.arange(0, n, per_chunk, dtype=np.int64), n)
    src, dst = pairs.src[order], pairs.dst[order]
    if kind is PlanKind.STAGED:
        merged = np.zeros(bounds.size - 1, dtype=np.bool_)
    else:  # runs are consecutive on the lead side; merged if the other side is too
        merged = _merged(src if kind is PlanKind.GATHER else dst, bounds)
    return CopyPlan(kind, src, dst, bounds, merged)


def _as_numpy(t: torch.Tensor) -> npt.NDArray[np.generic]:
    """A numpy view of a CPU tensor, reinterpreted as same-width integers.

    Bytes are moved unchanged; the integer view also covers dtypes numpy lacks
    (bfloat16, float8).
    """
    return t.view(_INT_BY_ITEMSIZE[t.element_size()]).numpy()


def execute(plan: CopyPlan, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy the planned pages from page view ``src`` into page view ``dst`` (CPU)."""
    assert src.device.type == "cpu" and dst.device.type == "cpu", "execute() runs on CPU tensors"
    bounds = plan.bounds.tolist()
    s_ids, d_ids = plan.src, plan.dst
    index = torch.from_numpy(s_ids)
    src_np, dst_np = _as_numpy(src), _as_numpy(dst)
    if plan.kind is PlanKind.STAGED:
        longest = max(hi - lo for lo, hi in itertools.pairwise(bounds))
        temp = torch.empty((longest, *src.shape[1:]), dtype=src.dtype)
        temp_np = _as_numpy(temp)
        for lo, hi in itertools.pairwise(bounds):
            torch.index_select(src, 0, index[lo:hi], out=temp[: hi - lo])
            dst_np[d_ids[lo:hi]] = temp_np[: hi - lo]
        return
    gather = plan.kind is PlanKind.GATHER
    row_bytes = src[0].numel() * src.element_size() if src.shape[0] else 0
    for (lo, hi), merged in zip(itertools.pairwise(bounds), plan.merged.tolist()):
        t0, s0, r = int(d_ids[lo]), int(s_ids[lo]), hi - lo
        if merged:  # one strided block copy
            dst_np[t0 : t0 + r] = src_np[s0 : s0 + r]
        elif gather and row_bytes >= LOOP_MIN_PAGE_BYTES:
            # Big pages: one numpy copy per page; the loop costs ~1 us a page
            # against tens of us of copying, and beats index_select (2 threads
            # that slow down sharply when the cores are busy).
            for j in range(lo, hi):
                dst_np[t0 + j - lo] = src_np[int(s_ids[j])]
        elif gather:  # a destination run from scattered sources
            torch.index_select(src, 0, index[lo:hi], out=dst[t0 : t0 + r])
        else:  # scattered destinations from a source run
            dst_np[d_ids[lo:hi]] = src_np[s0 : s0 + r]


SMALL_COPY_BYTES = 1 << 20  # a batch moving at most this much (K and V): ``copy_small``


@dataclass(frozen=True, slots=True)
class PageViews:
    """The page views of a device/host buffer pair as numpy arrays, built once
    (the buffers' tensors live as long as the buffers)."""

    device: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic]]  # K, V: [N, L, X]
    host: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic]]  # K, V: [M, L, X]
    page_bytes: int  # bytes of one page, K and V together

    @classmethod
    def of(cls, device: DeviceKVBuffer, host: HostKVBuffer) -> PageViews:
        check_buffers(device, host)
        dk, dv = (_as_numpy(t) for t in device_page_views(device))
        hk, hv = (_as_numpy(t) for t in host_page_views(host))
        return cls((dk, dv), (hk, hv), device.spec.page_bytes)

    def small(self, pairs: PagePairs) -> bool:
        """Whether ``copy_small`` should move ``pairs``."""
        return len(pairs) * self.page_bytes <= SMALL_COPY_BYTES


def copy_small(
    src: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic]],
    dst: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic]],
    pairs: PagePairs,
) -> None:
    """Copy page ``pairs.src[i]`` of the views ``src`` (K, V) to page
    ``pairs.dst[i]`` of ``dst``: one gather into a temporary and one scatter
    per view. Mutates those destination pages only."""
    if len(pairs):
        for s, d in zip(src, dst):
            d[pairs.dst] = s[pairs.src]


def device_page_views(buf: DeviceKVBuffer) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``buf`` as page views ``[N, L, X]`` (no copy)."""
    return buf.k.flatten(2).transpose(0, 1), buf.v.flatten(2).transpose(0, 1)


def host_page_views(buf: HostKVBuffer) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``buf`` as page views ``[M, L, X]`` (no copy)."""
    flat = buf.data.flatten(3)  # [M, 2, L, X]
    return flat[:, 0], flat[:, 1]


def check_buffers(device: DeviceKVBuffer, host: HostKVBuffer) -> None:
    """ValueError unless both buffers describe the same KV layout."""
    if device.spec != host.spec:
        raise ValueError(
            "device and host buffers need the same KVSpec: "
            f"{device.spec.describe()} vs {host.spec.describe()}"
        )


def copy_device_to_host(device: DeviceKVBuffer, host: HostKVBuffer, pairs: PagePairs) -> CopyPlan:
    """Gather device pages ``pairs.src`` into host pages ``pairs.dst``.

    Mutates ``host`` (those pages only). Returns the plan it ran.
    """
    check_buffers(device, host)
    plan = plan_copy(pairs, device.spec.page_bytes // 2)
    if len(pairs):
        for src, dst in zip(device_page_views(device), host_page_views(host)):
            execute(plan, src, dst)
    return plan


def copy_host_to_device(host: HostKVBuffer, device: DeviceKVBuffer, pairs: PagePairs) -> CopyPlan:
    """Scatter host pages ``pairs.src`` into device pages ``pairs.dst``.

    Mutates ``device`` (those pages only). Returns the plan it ran.
    """
    check_buffers(device, host)
    plan = plan_copy(pairs, device.spec.page_bytes // 2)
    if len(pairs):
        for src, dst in zip(host_page_views(host), device_page_views(device)):
            execute(plan, src, dst)
    return plan

"""The events benchmark runs (small sizes): codec figures and one end-to-end
run of each kind, pinned to two cores when the machine has them."""

from __future__ import annotations

import os

from radixcache.cli.bench.events import bench_baseline, bench_codec, bench_two_process, make_batches


def test_events_bench_measures_every_part() -> None:
    batches = make_batches(4, 4)
    assert bench_baseline(batches, rounds=1)["pages"] == 4 * 4 * 16
    codec = bench_codec(batches, rounds=1)
    assert codec["encode_pages_per_s"] > 0 and codec["decode_pages_per_s"] > 0
    usable = sorted(os.sched_getaffinity(0))
    cores = (usable[0], usable[1]) if len(usable) >= 2 else None
    ours = bench_two_process(per_batch=4, total=60, plain=False, cores=cores)
    assert ours["pages"] == 60 * 4 * 16 and ours["subscriber_gaps"] == 0 and ours["subscriber_malformed"] == 0
    plain = bench_two_process(per_batch=4, total=60, plain=True, cores=cores)
    assert plain["pages"] == 60 * 4 * 16
    assert os.sched_getaffinity(0) == set(usable), "the benchmark gives this process its cores back"


def test_the_busy_owner_figure_times_both_sends() -> None:
    """``bench events`` (f): both sends measured in the same run; the figure
    itself (how much slower pyzmq's send is) is the benchmark's to report."""
    from radixcache.cli.bench.events import bench_busy_owner

    figure = bench_busy_owner(sends=50, rounds=1)
    assert figure["sends"] == 50 and isinstance(figure["keeps_gil"], bool)
    assert figure["gil_keeping_s"] > 0 and figure["pyzmq_send_s"] > 0
    ratio = figure["pyzmq_send_s"] / figure["gil_keeping_s"]  # (of the rounded times)
    assert abs(figure["pyzmq_over_gil_keeping"] - ratio) <= 0.05 * ratio + 0.1

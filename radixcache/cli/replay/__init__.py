"""``radixcache replay``: trace replay for capacity planning.

    command.py   the subcommand and its options
    trace.py     Mooncake JSONL traces and the tokens a line stands for
    run.py       replaying a trace through the real cache, and what is counted
    plot.py      reports, sweeps over pool sizes, CSV and JSON
    capacity.py  capacity in GB, model presets, the trace's ceiling, a sweep's context
    figure.py    the sweep's PNG (matplotlib)
"""

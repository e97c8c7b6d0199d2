"""``radixcache replay``: trace replay for capacity planning.

    command.py   the subcommand and its options (the parser imports no torch)
    presets.py   the trace's block size and the model presets the options offer
    trace.py     Mooncake JSONL traces and the tokens a line stands for
    run.py       replaying a trace through the real cache, and what is counted
    plot.py      reports, sweeps over pool sizes, CSV and JSON
    capacity.py  capacity in GB, the trace's ceiling, a sweep's context
    figure.py    the sweep's PNG (matplotlib)
"""

"""``radixcache demo``: the offload demo.

    command.py   the subcommand and its options (the parser imports no torch)
    run.py       the run: the workload through the tiers, the restart replay
    runner.py    the workload: tenants' multi-turn chats through one cache
    engines.py   two engine processes sharing a pool (``--engines 2``)
    storage.py   where the demo keeps its storage tier (LMDB folder or pool)
    noisy.py     ``--noisy-neighbor``: a quiet tenant beside a noisy one, with
                 and without per-tenant quotas
    report.py    the per-turn lines and the summary table
"""

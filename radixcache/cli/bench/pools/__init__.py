"""The ``pool`` benchmark's parts (its entry point and report: radixcache/cli/bench/pool.py).

    pages.py     the pages every figure moves, the clock, the rate
    valkey.py    ValkeyStorage against redis-py: clear, chunked and sealed pools, lookups
    mooncake.py  MooncakeStorage against a raw Mooncake client
"""

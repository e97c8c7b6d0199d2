"""The router side's view of the stream: which engine holds which pages on
which medium, built by applying events in order.

    kv_index.py     ``KvIndex``: per-engine, per-medium holdings; overlap scores
    block_index.py  per worker and medium, which blocks are resident
    records.py      its config and the typed records it answers with
    local_hash.py   the routers' own hash of a request's tokens (no engine ids)
"""

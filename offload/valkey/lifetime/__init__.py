"""How long values live in the pool and what removes them besides the server's LRU.

    retention.py  a put's expiry: the config's TTL, cut to the put's deadline
                  (``PutMeta.expires_at``); a put past its deadline writes nothing
    tags.py       tag -> namespace sets (``PutMeta.tags``) and what
                  ``invalidate_tag`` forgets
    quotas.py     per-tenant byte limits, kept by a server-side script with
                  each write: the tenant's own oldest values go first, what
                  cannot fit is dropped
    forget.py     deletes, forgotten namespaces, invalidated tags (on request)
    removals.py   which pages left (keyspace notifications), values to rewrite

The writer (offload/valkey/writer.py) calls them; they know the link and the
key layout, nothing of the engine.
"""

# Included in _core.pyx (one extension module): a request's lifecycle
# (admit, reserve, commit, release) in its common case, and the prompt's copy.
# Reference: radixcache/cache.py, ``RadixCache.admit``, ``reserve``,
# ``commit`` (with ``_insert``), ``release`` and ``take_events``;
# radixcache/request.py, ``Request.__init__``, ``admit_cached``,
# ``add_pages``, ``check_commit``, ``inserted`` and ``end``;
# radixcache/tenants/ledger.py, ``TenantLedger.admitted``;
# radixcache/tokens.py, ``owned_tokens`` (the prompt's copy).
#
# The common case: a device-only cache (no tiers, no retention) of a
# ``RadixTree``, open, with no namespace forgotten; a 1-D C-contiguous int32
# numpy prompt of a plain ``Namespace`` without tags; a request of exactly
# ``Request`` with no load pending. Every other call is the Python method's,
# whole (its checks, its errors, its tier calls), so these bodies run only
# where the method's checks pass and change what it changes, in its order.

# ``Request.__slots__`` in ``Request.__init__``'s order: a handle is built
# and read here through its slots (slots.pxi).
REQUEST_SLOTS = (
    "rid", "namespace", "priority", "_tokens", "num_tokens", "cached_len", "num_computed",
    "reserved_tokens", "_pages", "num_pages", "shared_pages", "locked_node", "released",
    "pending", "hit_device", "hit_host", "hit_storage", "forgets",
)
cdef enum:
    _R_RID, _R_NS, _R_PRIORITY, _R_TOKENS, _R_NUM_TOKENS, _R_CACHED_LEN, _R_NUM_COMPUTED, _R_RESERVED,
    _R_PAGES, _R_NUM_PAGES, _R_SHARED_PAGES, _R_LOCKED_NODE, _R_RELEASED, _R_PENDING, _R_HIT_DEVICE,
    _R_HIT_HOST, _R_HIT_STORAGE, _R_FORGETS
cdef _Slots _REQ = None  # Request's
# The counters admission bumps: the cache's (radixcache/stats.py ``Counters``)
# and the tenant's (radixcache/tenants/ledger.py ``TenantCounters``).
cdef enum:
    _C_REQUESTS, _C_PROMPT_TOKENS, _C_HIT_TOKENS, _C_HIT_PAGES
cdef enum:
    _T_REQUESTS, _T_PROMPT_TOKENS, _T_DEVICE_HIT_TOKENS
cdef _Slots _COUNTERS = None, _TENANT_COUNTERS = None

cdef object _ADMIT = None  # the Python methods (radixcache/cache.py), every other case
cdef object _RESERVE = None
cdef object _COMMIT = None
cdef object _RELEASE = None
cdef object _TAKE_EVENTS = None
cdef object _GATE = None  # radixcache/tenants/gate.py TenantGate
cdef Py_ssize_t _MAX_STEP = 1 << 40  # a reserve or commit of more tokens: the Python method's (C sizes)
cdef object _REQUEST = None  # radixcache/request.py Request
cdef object _NAMESPACE = None  # radixcache/namespace.py Namespace
cdef object _DEFAULT_NAMESPACE = None
cdef object _LEDGER = None  # radixcache/tenants/ledger.py TenantLedger
cdef object _EMPTY_TABLE = None  # radixcache/tree/node.py EMPTY_PAGES, a new handle's table


def bind_cache(cache, request, namespace, default_namespace, ledger, gate, empty_pages, counters,
               tenant_counters):
    """``RadixCache`` (its Python ``admit``, ``reserve``, ``commit``,
    ``release`` and ``take_events``, kept for every case but the common
    one), ``Request``, ``Namespace`` and ``DEFAULT_NAMESPACE``,
    ``TenantLedger``, ``TenantGate``, ``EMPTY_PAGES``, ``Counters`` and
    ``TenantCounters``; returns the compiled
    methods to install on ``cache``, in that order (``reference_methods()``
    gives back the Python ones). Raises TypeError when ``Request``'s slots
    are not ``REQUEST_SLOTS``."""
    global _ADMIT, _RESERVE, _COMMIT, _RELEASE, _TAKE_EVENTS, _REQUEST, _NAMESPACE, _DEFAULT_NAMESPACE
    global _LEDGER, _GATE, _EMPTY_TABLE, _REQ, _COUNTERS, _TENANT_COUNTERS
    if request.__bases__ != (object,):
        raise TypeError(f"{request.__name__}'s slots are not the ones the compiled core builds: "
                        f"it has bases {request.__bases__}")
    req_slots = _slots_of(request, REQUEST_SLOTS)
    cache_counts = _slots_of(counters, ("requests", "prompt_tokens", "hit_tokens", "hit_pages"), False)
    tenant_counts = _slots_of(tenant_counters, ("requests", "prompt_tokens", "device_hit_tokens"), False)
    _REQ, _COUNTERS, _TENANT_COUNTERS = req_slots, cache_counts, tenant_counts
    _ADMIT, _RESERVE, _COMMIT = cache.admit, cache.reserve, cache.commit
    _RELEASE, _TAKE_EVENTS = cache.release, cache.take_events
    _REQUEST, _NAMESPACE, _DEFAULT_NAMESPACE = request, namespace, default_namespace
    _LEDGER, _GATE, _EMPTY_TABLE = ledger, gate, empty_pages
    compiled = (cache_admit, cache_reserve, cache_commit, cache_release, cache_take_events)
    for fn, method in zip(compiled, reference_methods()):  # (help() and signatures: the methods')
        fn.__doc__, fn.__wrapped__ = method.__doc__, method
    return compiled


def reference_methods():
    """The Python ``admit``, ``reserve``, ``commit``, ``release`` and
    ``take_events`` that ``bind_cache`` was given (what tests hold the
    compiled ones to)."""
    return _ADMIT, _RESERVE, _COMMIT, _RELEASE, _TAKE_EVENTS


cdef inline object _get(object req, int field):
    """A field of a ``Request``."""
    return _field(_REQ, req, field)


cdef inline void _set(object req, int field, object value) noexcept:
    """Store a field of a ``Request``."""
    _put(req, _REQ.at[field], value)


cdef object _new_request(object rid, object namespace, object tokens, object priority, object forgets):
    """``Request(rid, namespace, tokens, priority, forgets)``."""
    req = _alloc(_REQ)
    _set(req, _R_RID, rid)
    _set(req, _R_NS, namespace)
    _set(req, _R_PRIORITY, priority)
    _set(req, _R_TOKENS, tokens)
    _set(req, _R_NUM_TOKENS, _len(tokens))
    _set(req, _R_CACHED_LEN, 0)
    _set(req, _R_NUM_COMPUTED, 0)
    _set(req, _R_RESERVED, 0)
    _set(req, _R_PAGES, _EMPTY_TABLE)
    _set(req, _R_NUM_PAGES, 0)
    _set(req, _R_SHARED_PAGES, 0)
    _set(req, _R_LOCKED_NODE, None)
    _set(req, _R_RELEASED, False)
    _set(req, _R_PENDING, [])
    _set(req, _R_HIT_DEVICE, 0)
    _set(req, _R_HIT_HOST, 0)
    _set(req, _R_HIT_STORAGE, 0)
    _set(req, _R_FORGETS, forgets)
    return req


def new_request(rid, namespace, tokens, priority, forgets=0):
    """``Request(rid, namespace, tokens, priority, forgets)`` as the
    compiled admission builds it (tests hold it to the class's own)."""
    if _REQ is None:
        raise RuntimeError("bind_cache() has not run: the compiled core is not in use in this process")
    return _new_request(rid, namespace, tokens, priority, forgets)


def owned_tokens(object tokens):
    """A copy of a 1-D C-contiguous int32 token array, or None if an id is
    negative; NotImplemented (nothing read) for any other buffer: the
    caller's general path converts or refuses it."""
    return _owned_tokens(tokens)


cdef object _owned_tokens(object tokens):
    """``owned_tokens``."""
    cdef Py_buffer sb, db
    cdef Py_ssize_t i, n
    cdef int32_t acc = 0, v
    cdef const int32_t* s
    cdef int32_t* d
    if not _int32_buffer(tokens, &sb):
        return NotImplemented
    try:
        n = sb.len // 4
        out = _empty(n, _I32)
        _write(out, &db)
        s = <const int32_t*>sb.buf
        d = <int32_t*>db.buf
        for i in range(n):  # copy and check the sign in one pass
            v = s[i]
            d[i] = v
            acc |= v
        PyBuffer_Release(&db)
    finally:
        PyBuffer_Release(&sb)
    return None if acc < 0 else out


def cache_admit(self, tokens, namespace=_MISSING, priority=0):
    """``RadixCache.admit`` (see there)."""
    cdef Py_ssize_t n, hit
    cdef MatchResult match
    if namespace is _MISSING:
        namespace = _DEFAULT_NAMESPACE
    if (type(tokens) is not np.ndarray or type(namespace) is not _NAMESPACE or type(priority) is not int
            or namespace.tags or not _device_only(self)):
        return _ADMIT(self, tokens, namespace, priority)
    arr = _owned_tokens(tokens)
    if arr is None or arr is NotImplemented:  # a negative id, or not a plain int32 array
        return _ADMIT(self, tokens, namespace, priority)
    rid = self._next_rid
    req = _new_request(rid, namespace, arr, priority, 0)
    n = _len(arr)
    tree = self.tree
    match = _match(tree, namespace, arr, priority, n - 1 if n else 0, False)  # (pages: the nodes' arrays)
    hit = match.device_len
    pages = hit // self.page_size
    node = match.last_device_node
    if node is not None:  # ``req.admit_cached(tree, node, ...)``
        _lock(tree, <Node?>node)
        _set(req, _R_LOCKED_NODE, node)
        if pages:  # (the table ``_append_pages`` makes, the nodes' pages copied in)
            _set(req, _R_PAGES, _concat(match.device_pages, pages, max(pages, n // 8)))
            _set(req, _R_NUM_PAGES, pages)
        _set(req, _R_SHARED_PAGES, pages)
        _set(req, _R_CACHED_LEN, hit)
        _set(req, _R_NUM_COMPUTED, hit)
        _set(req, _R_RESERVED, hit)
        _set(req, _R_HIT_DEVICE, hit)
    self._next_rid = rid + 1
    self._live[rid] = req
    c = self.counters
    _bump(_COUNTERS, c, _C_REQUESTS, 1)
    _bump(_COUNTERS, c, _C_PROMPT_TOKENS, n)
    _bump(_COUNTERS, c, _C_HIT_TOKENS, hit)
    _bump(_COUNTERS, c, _C_HIT_PAGES, pages)
    ledger = self._ledger  # ``ledger.admitted(namespace, n, hit, hit)``:
    c = ledger._by_ns.get(namespace)
    if c is None:
        c = ledger.counters_of(namespace)
    _bump(_TENANT_COUNTERS, c, _T_REQUESTS, 1)
    _bump(_TENANT_COUNTERS, c, _T_PROMPT_TOKENS, n)
    _bump(_TENANT_COUNTERS, c, _T_DEVICE_HIT_TOKENS, hit)
    return req


cdef bint _plain(cache) except -1:
    """The cache is open, its tree a ``RadixTree`` and its ledger a
    ``TenantLedger`` without quotas: the tree's own lock and unlock are the
    compiled ones (quotas give the tree counting ones,
    radixcache/tenants/device.py)."""
    ledger = cache._ledger
    return (cache._refusal is None and type(cache.tree) is _RADIX_TREE and type(ledger) is _LEDGER
            and ledger.book is None)


cdef bint _device_only(cache) except -1:
    """``_plain``, with no tiers, no retention and no namespace forgotten."""
    return not cache._tiered and cache._retention is None and not cache._forgets and _plain(cache)


cdef bint _live_handle(cache, req) except -1:
    """``req`` is of exactly ``Request``, live in ``cache``, no load pending."""
    return (type(req) is _REQUEST and _get(req, _R_RELEASED) is False and not _get(req, _R_PENDING)
            and cache._live.get(_get(req, _R_RID)) is req)


cdef bint _steady(cache, req) except -1:
    """The common case of a call on a live handle: ``_device_only`` and
    ``_live_handle``."""
    return _device_only(cache) and _live_handle(cache, req)


cdef int _serving(cache, namespace) except -1:
    """``cache._gate.serving(namespace)``: for a ``TenantGate``, its body."""
    gate = cache._gate
    if type(gate) is _GATE:
        gate._serving = namespace
    else:
        gate.serving(namespace)
    return 0


def cache_reserve(self, req, num_tokens):
    """``RadixCache.reserve`` (see there)."""
    cdef Py_ssize_t n, target, need, p
    if type(num_tokens) is not int or not 0 <= num_tokens <= _MAX_STEP or not _steady(self, req):
        return _RESERVE(self, req, num_tokens)
    n = num_tokens
    _serving(self, _get(req, _R_NS))
    target = <Py_ssize_t>_get(req, _R_NUM_COMPUTED) + n
    if target > <Py_ssize_t>_get(req, _R_RESERVED):
        p = self.page_size
        need = (target + p - 1) // p - <Py_ssize_t>_get(req, _R_NUM_PAGES)
        if need > 0:  # ``req.add_pages(self._capacity.allocate(need), target)``
            append_pages(req, self._capacity.allocate(need))
        _set(req, _R_RESERVED, target)
    return _get(req, _R_PAGES)[:_get(req, _R_NUM_PAGES)]


def cache_commit(self, req, num_tokens):
    """``RadixCache.commit`` (see there) and its ``_insert``."""
    cdef Py_ssize_t n, end, full, shared, p
    if type(num_tokens) is not int or not 0 <= num_tokens <= _MAX_STEP or not _steady(self, req):
        return _COMMIT(self, req, num_tokens)
    n = num_tokens
    end = <Py_ssize_t>_get(req, _R_NUM_COMPUTED) + n
    if (end > <Py_ssize_t>_get(req, _R_RESERVED) or end > <Py_ssize_t>_get(req, _R_NUM_TOKENS)
            or <Py_ssize_t>_get(req, _R_FORGETS) < 0):
        return _COMMIT(self, req, num_tokens)  # (``req.check_commit`` raises; a cut-off prefix)
    namespace = _get(req, _R_NS)
    _serving(self, namespace)
    _set(req, _R_NUM_COMPUTED, end)
    p = self.page_size
    full = end // p
    shared = _get(req, _R_SHARED_PAGES)
    if full > shared:
        _insert_pages(self, req, namespace, full, shared, p)
    return None


cdef int _insert_pages(cache, req, namespace, Py_ssize_t full, Py_ssize_t shared, Py_ssize_t p) except -1:
    """``RadixCache._insert(req, full, ...)`` of a cache without quotas,
    forgotten namespaces or tiers."""
    cdef InsertResult result
    cdef Py_ssize_t inserted, dup_to
    cdef Py_buffer tb, db
    tree = cache.tree
    node = _get(req, _R_LOCKED_NODE)  # ``req.unlock(tree)``
    if node is not None:
        _unlock(tree, <Node?>node)
        _set(req, _R_LOCKED_NODE, None)
    table = _get(req, _R_PAGES)  # (the first ``full`` pages and their tokens: ``req.first_pages``)
    result = _insert(tree, namespace, _get(req, _R_TOKENS), table, _get(req, _R_PRIORITY), full * p)
    inserted = result.inserted_pages
    dup_to = max(<Py_ssize_t>result.existing_pages, shared)
    dup = None
    if dup_to > shared:  # ``req.inserted(tree, result, dup_to)``: the tree's pages replace ours
        dup = _copy_range(table, shared, dup_to)
        theirs = result.device_pages
        _write(table, &tb)
        try:
            _read(theirs, &db)
            memcpy(<int32_t*>tb.buf + shared, <int32_t*>db.buf + shared, (dup_to - shared) * 4)
            PyBuffer_Release(&db)
        finally:
            PyBuffer_Release(&tb)
    if inserted:
        _lock(tree, <Node?>result.last_node)
        _set(req, _R_LOCKED_NODE, result.last_node)
    _set(req, _R_SHARED_PAGES, inserted)
    c = cache.counters
    if dup is not None:
        cache.pool.free(dup)
        c.duplicate_pages += dup_to - shared
    c.committed_pages += inserted - dup_to
    return 0


def cache_release(self, req):
    """``RadixCache.release`` (see there)."""
    cdef Py_ssize_t shared, num
    if not (_plain(self) and _live_handle(self, req)):  # (tiers need no call without a pending load)
        return _RELEASE(self, req)
    tree = self.tree
    node = _get(req, _R_LOCKED_NODE)  # ``req.end(tree)``
    if node is not None:
        _unlock(tree, <Node?>node)
        _set(req, _R_LOCKED_NODE, None)
    shared = _get(req, _R_SHARED_PAGES)
    num = _get(req, _R_NUM_PAGES)
    private = _copy_range(_get(req, _R_PAGES), shared, num) if num > shared else None
    _set(req, _R_NUM_PAGES, shared)
    _set(req, _R_RELEASED, True)
    if private is not None:
        self.pool.free(private)
    del self._live[_get(req, _R_RID)]
    if tree.removal.detached:
        self._bulk.sweep()


def cache_take_events(self):
    """``RadixCache.take_events`` (see there): for an ``EventRecorder``
    whose records since the last call are all ``BlockStored`` (inserts
    only), those records, in order, as the list they were recorded in."""
    cdef list records
    if self._refusal is None:
        recorder = self._recorder
        if type(recorder) is _RECORDER:
            records = recorder._records
            if not records:
                return []
            for r in records:
                if type(r) is not _STORED:
                    return _TAKE_EVENTS(self)
            recorder._records = []
            return records
    return _TAKE_EVENTS(self)

# Included in _core.pyx (one extension module): event block ids.
# References: radixcache/keys/hashing.py ``block_ids``, radixcache/keys/event_ids.py
# ``EventIds.node_ids``.

cdef uint64_t _fill_ids(const uint32_t* t, Py_ssize_t n, Py_ssize_t page_size, uint64_t prev,
                        const uint64_t* k, int64_t* o) noexcept nogil:
    """The ids of the ``n`` pages at ``t`` chaining from ``prev`` into ``o``;
    returns the last one (``prev`` when ``n`` is 0)."""
    cdef Py_ssize_t i, j
    cdef uint64_t x
    for i in range(n):
        x = 0
        for j in range(page_size):
            x += <uint64_t>t[i * page_size + j] * k[j]
        x ^= x >> 29
        prev = (_B * prev + _M * x) & _MASK63
        o[i] = <int64_t>prev
    return prev


def block_ids(object tokens, Py_ssize_t page_size, uint64_t start, object lanes):
    """Event block ids of the pages of ``tokens`` chaining from ``start``
    (the parent's id, or the namespace's seed); ``lanes``: the uint64 lane
    weights of ``radixcache.keys.hashing``. A new int64 array."""
    cdef Py_buffer tb, lb, ob
    cdef Py_ssize_t n
    _read(tokens, &tb)
    try:
        _read(lanes, &lb)
        try:
            n = tb.len // 4 // page_size
            out = _empty(n, _I64)
            PyObject_GetBuffer(out, &ob, PyBUF_SIMPLE | PyBUF_WRITABLE)
            _fill_ids(<const uint32_t*>tb.buf, n, page_size, start, <const uint64_t*>lb.buf,
                      <int64_t*>ob.buf)
            PyBuffer_Release(&ob)
        finally:
            PyBuffer_Release(&lb)
    finally:
        PyBuffer_Release(&tb)
    return out


cdef int64_t _last_id(object ids) except? -1:
    cdef Py_buffer b
    _read(ids, &b)
    try:
        return (<const int64_t*>b.buf)[b.len // 8 - 1]
    finally:
        PyBuffer_Release(&b)


def node_ids(self, Node node not None):
    """``EventIds.node_ids``: the ids of ``node``'s pages, computed (and
    cached on it and on the ancestors that lack theirs) where missing."""
    cdef Py_ssize_t p = self.page_size, done, total
    cdef Py_buffer kb, lb, ob, db
    cdef uint64_t prev
    cdef list chain = []
    cdef Node n = node, m
    while n.parent is not None and (n.ids is None or len(n.ids) * p < len(n.key)):
        chain.append(n)
        n = n.parent
    if not chain:
        return _NO_IDS if node.ids is None else node.ids
    prev = self.seed(node.namespace) if n.parent is None else <uint64_t>_last_id(n.ids)
    _read(self.lanes, &lb)
    try:
        for m in reversed(chain):
            done = 0 if m.ids is None else len(m.ids)
            if done:
                prev = <uint64_t>_last_id(m.ids)
            total = len(m.key) // p
            out = _empty(total, _I64)
            PyObject_GetBuffer(out, &ob, PyBUF_SIMPLE | PyBUF_WRITABLE)
            try:
                if done:
                    _read(m.ids, &db)
                    memcpy(ob.buf, db.buf, done * 8)
                    PyBuffer_Release(&db)
                _read(m.key, &kb)
                prev = _fill_ids(<const uint32_t*>kb.buf + done * p, total - done, p, prev,
                                 <const uint64_t*>lb.buf, <int64_t*>ob.buf + done)
                PyBuffer_Release(&kb)
            finally:
                PyBuffer_Release(&ob)
            m.ids = out
    finally:
        PyBuffer_Release(&lb)
    return node.ids

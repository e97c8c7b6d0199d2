# Included in _core.pyx (one extension module): event block ids.
# References: radixcache/keys/hashing.py ``block_ids``, radixcache/keys/event_ids.py
# ``EventIds.run_ids``, ``node_ids``, ``last_id`` and ``chain_start``.

# The page ids' loop, in C so that the common page sizes get a loop of
# their own: with the size a constant, the compiler unrolls and vectorizes
# a page's 16 (32, 64) multiplies; with the size a variable it ran ~2.5x
# slower at 16 tokens a page (17 against 6.8 ns a page here). The ids are
# the same either way (the tests hold both to radixcache/keys/hashing.py).
cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>

    static inline __attribute__((always_inline)) uint64_t rc_ids_loop(
            const uint32_t* t, ptrdiff_t n, ptrdiff_t p, uint64_t prev, const uint64_t* k, int64_t* o) {
        for (ptrdiff_t i = 0; i < n; i++) {
            uint64_t x = 0;
            for (ptrdiff_t j = 0; j < p; j++) x += (uint64_t)t[i * p + j] * k[j];
            x ^= x >> 29;
            prev = (0x9E3779B97F4A7C15ULL * prev + 0xBF58476D1CE4E5B9ULL * x) & 0x7FFFFFFFFFFFFFFFULL;
            if (o) o[i] = (int64_t)prev;
        }
        return prev;
    }

    static uint64_t rc_fill_ids(const uint32_t* t, ptrdiff_t n, ptrdiff_t p, uint64_t prev,
                                const uint64_t* k, int64_t* o) {
        switch (p) {
            case 16: return rc_ids_loop(t, n, 16, prev, k, o);
            case 32: return rc_ids_loop(t, n, 32, prev, k, o);
            case 64: return rc_ids_loop(t, n, 64, prev, k, o);
            default: return rc_ids_loop(t, n, p, prev, k, o);
        }
    }
    """
    # ``_fill_ids``: the ids of the ``n`` pages at ``t`` chaining from ``prev``
    # into ``o`` (NULL: only the last is wanted); returns the last one
    # (``prev`` when ``n`` is 0). The multipliers are radixcache/keys/hashing.py's
    # ``_B`` and ``_M``, the mask its ``ID_LIMIT - 1``.
    uint64_t _fill_ids "rc_fill_ids"(const uint32_t* t, Py_ssize_t n, Py_ssize_t page_size, uint64_t prev,
                                     const uint64_t* k, int64_t* o) noexcept nogil


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
            _write(out, &ob)
            _fill_ids(<const uint32_t*>tb.buf, n, page_size, start, <const uint64_t*>lb.buf,
                      <int64_t*>ob.buf)
            PyBuffer_Release(&ob)
        finally:
            PyBuffer_Release(&lb)
    finally:
        PyBuffer_Release(&tb)
    return out


cdef uint64_t _chain(const uint64_t* lanes, Py_ssize_t p, Node node, Py_ssize_t first,
                     Py_ssize_t n, uint64_t prev, int64_t* o) except? 0:
    """``_fill_ids`` over ``node``'s pages ``first .. first+n-1``."""
    cdef Py_buffer kb
    _read(node.key, &kb)
    prev = _fill_ids(<const uint32_t*>kb.buf + first * p, n, p, prev, lanes, o)
    PyBuffer_Release(&kb)
    return prev


cdef uint64_t _last(object self, const uint64_t* lanes, Py_ssize_t p, Node node) except? 0:
    """``EventIds.last_id`` for a node that is not a root."""
    cdef list chain = []
    cdef Node n = node, m
    cdef uint64_t prev
    cdef Py_ssize_t total
    while n.parent is not None and n.id_pages * p != len(n.key):
        chain.append(n)
        n = n.parent
    if not chain:
        return <uint64_t>node.last_id
    prev = self.seed(node.namespace) if n.parent is None else <uint64_t>n.last_id
    for m in reversed(chain):
        if m.id_pages:
            prev = <uint64_t>m.last_id
        total = len(m.key) // p
        prev = _chain(lanes, p, m, m.id_pages, total - m.id_pages, prev, NULL)
        m.id_pages = total
        m.last_id = <int64_t>prev
    return prev


cdef tuple _run(object self, Node node, Py_ssize_t start, Py_ssize_t count):
    """``EventIds.run_ids``."""
    cdef Py_ssize_t p = self.page_size, first = 0
    cdef Py_buffer lb, ob
    cdef const uint64_t* lanes
    cdef uint64_t prev
    cdef object before
    cdef Node parent = node.parent
    _read(self.lanes, &lb)
    try:
        lanes = <const uint64_t*>lb.buf
        if node.id_pages and node.id_pages <= start:  # (a leaf's new pages: from its kept id)
            prev = <uint64_t>node.last_id
            first = node.id_pages
        elif parent.parent is None:
            prev = self.seed(node.namespace)
        else:
            prev = _last(self, lanes, p, parent)
        if first < start:  # the pages before the run: only the last id is wanted
            prev = _chain(lanes, p, node, first, start - first, prev, NULL)
        before = None if start == 0 and parent.parent is None else prev
        out = _empty(count, _I64)
        _write(out, &ob)
        try:
            prev = _chain(lanes, p, node, start, count, prev, <int64_t*>ob.buf)
        finally:
            PyBuffer_Release(&ob)
    finally:
        PyBuffer_Release(&lb)
    if count and start + count > node.id_pages:
        node.id_pages = start + count
        node.last_id = <int64_t>prev
    return before, out


def run_ids(self, Node node not None, Py_ssize_t start, Py_ssize_t count):
    """``EventIds.run_ids``: the id before ``node``'s pages ``start ..
    start+count-1`` (None at the start of a namespace's sequence) and their ids."""
    if start < 0 or count < 0 or (start + count) * self.page_size > len(node.key) or node.parent is None:
        raise ValueError(f"no pages {start}..{start + count - 1} in this node")
    return _run(self, node, start, count)


def node_ids(self, Node node not None):
    """``EventIds.node_ids``: the ids of all of ``node``'s pages (a new array)."""
    if node.parent is None:
        return _empty(0, _I64)
    return _run(self, node, 0, len(node.key) // self.page_size)[1]


def last_id(self, Node node not None):
    """``EventIds.last_id``: the id of ``node``'s last page (kept on it and
    on the ancestors chained through)."""
    cdef Py_buffer lb
    if node.parent is None:
        raise ValueError("a root has no pages")
    _read(self.lanes, &lb)
    try:
        return <int64_t>_last(self, <const uint64_t*>lb.buf, self.page_size, node)
    finally:
        PyBuffer_Release(&lb)


def chain_start(self, Node node not None):
    """``EventIds.chain_start``: the id ``node``'s ids chain from."""
    cdef Py_buffer lb
    cdef Node parent = node.parent
    if parent is None:
        raise ValueError("a root has no pages")
    if parent.parent is None:
        return self.seed(node.namespace)
    if parent.id_pages * self.page_size == len(parent.key):
        return parent.last_id
    _read(self.lanes, &lb)
    try:
        return _last(self, <const uint64_t*>lb.buf, self.page_size, parent)
    finally:
        PyBuffer_Release(&lb)

# Included in _core.pyx (one extension module): the page pools' loops.
# References: radixcache/transfer/allocator.py, ``PageAllocator.allocate`` / ``free``.

def pool_take(object free, object state, Py_ssize_t top, Py_ssize_t fresh, Py_ssize_t n):
    """``PageAllocator.allocate``'s loop: the ids ``free[top-k:top]``, last
    first, then ``fresh, fresh+1, ...`` (``k = min(n, top)``) as a new int32
    array of ``n``, each marked allocated (1) in the int8 ``state``. The
    caller checked ``0 <= n <= top + capacity - fresh``."""
    cdef Py_buffer fb, sb, ob
    cdef const int32_t* f
    cdef int8_t* st
    cdef int32_t* o
    cdef int32_t page
    cdef Py_ssize_t i, k = n if n < top else top
    out = _empty(n, _I32)
    if n == 0:
        return out
    _read(free, &fb)
    try:
        _write(state, &sb)
        try:
            _write(out, &ob)
            f = <const int32_t*>fb.buf
            st = <int8_t*>sb.buf
            o = <int32_t*>ob.buf
            for i in range(k):
                page = f[top - 1 - i]
                o[i] = page
                st[page] = 1
            for i in range(k, n):
                page = <int32_t>(fresh + i - k)
                o[i] = page
                st[page] = 1
            PyBuffer_Release(&ob)
        finally:
            PyBuffer_Release(&sb)
    finally:
        PyBuffer_Release(&fb)
    return out


def pool_give(object ids, object free, object state, Py_ssize_t top, Py_ssize_t capacity):
    """``PageAllocator.free``'s loop for a 1-D C-contiguous int32 ``ids``:
    each id in range, allocated and listed once is marked freed (-1) in the
    int8 ``state`` and goes onto ``free`` at ``top`` (last first); returns how
    many. Returns -1, with nothing changed, for any other ``ids`` or any bad
    id: the caller's reference path then frees them or names the error."""
    cdef Py_buffer ib, fb, sb
    cdef const int32_t* a
    cdef int32_t* f
    cdef int8_t* st
    cdef int32_t page
    cdef Py_ssize_t n, j, k
    if not _int32_buffer(ids, &ib):
        return -1
    try:
        n = ib.len // 4
        if n == 0:
            return 0
        a = <const int32_t*>ib.buf
        _write(state, &sb)
        try:
            st = <int8_t*>sb.buf
            for j in range(n):
                page = a[j]
                if <uint32_t>page >= <uint64_t>capacity or st[page] <= 0:
                    # out of range, not allocated, or already marked by this
                    # call (listed twice): undo the marks and let the caller say which
                    for k in range(j):
                        st[a[k]] = 1
                    return -1
                st[page] = -1
        finally:
            PyBuffer_Release(&sb)
        _write(free, &fb)
        try:
            f = <int32_t*>fb.buf
            for j in range(n):
                f[top + j] = a[n - 1 - j]
        finally:
            PyBuffer_Release(&fb)
        return n
    finally:
        PyBuffer_Release(&ib)

# Included in _core.pyx (one extension module): the KV bytes of storage records.
# Reference: radixcache/offload/storage/kv_checksum.py ``copy_checksum`` (numpy's
# copy, then ``kv_checksum``'s row and column sums over the copy).

cdef inline uint64_t _load8(const uint8_t* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)  # (any alignment: a record's KV bytes need not be 8-aligned)
    return v


cdef inline void _store8(uint8_t* p, uint64_t v) noexcept nogil:
    memcpy(p, &v, 8)


cdef inline void _rows(const uint8_t* s, uint8_t* d, Py_ssize_t rows, uint64_t* row_sums,
                       uint64_t* col_sums, bint copy) noexcept nogil:
    """Sum ``rows`` rows of 4 KiB at ``s``: each row's 512 words into
    ``row_sums``, each column's into ``col_sums`` (wrapping); with ``copy``,
    copy them to ``d`` in the same pass. Four rows a step, so the column sums
    are loaded and stored once per four words: the loop then runs at about
    the speed of a plain copy (or read). Its callers pass ``copy`` as a
    constant, so the compiler makes one loop for each, without the test."""
    cdef Py_ssize_t r = 0, j
    cdef uint64_t a0, a1, a2, a3, v0, v1, v2, v3
    cdef const uint8_t* src
    cdef uint8_t* dst
    while r + 4 <= rows:
        a0 = a1 = a2 = a3 = 0
        src = s + r * 4096
        dst = d + r * 4096
        for j in range(0, 4096, 8):
            v0 = _load8(src + j)
            v1 = _load8(src + 4096 + j)
            v2 = _load8(src + 8192 + j)
            v3 = _load8(src + 12288 + j)
            if copy:
                _store8(dst + j, v0)
                _store8(dst + 4096 + j, v1)
                _store8(dst + 8192 + j, v2)
                _store8(dst + 12288 + j, v3)
            a0 += v0
            a1 += v1
            a2 += v2
            a3 += v3
            col_sums[j >> 3] += (v0 + v1) + (v2 + v3)
        row_sums[r] = a0
        row_sums[r + 1] = a1
        row_sums[r + 2] = a2
        row_sums[r + 3] = a3
        r += 4
    while r < rows:
        a0 = 0
        src = s + r * 4096
        dst = d + r * 4096
        for j in range(0, 4096, 8):
            v0 = _load8(src + j)
            if copy:
                _store8(dst + j, v0)
            a0 += v0
            col_sums[j >> 3] += v0
        row_sums[r] = a0
        r += 1


cdef void _copy_rows(const uint8_t* s, uint8_t* d, Py_ssize_t rows, uint64_t* row_sums,
                     uint64_t* col_sums) noexcept nogil:
    """``_rows`` copying: a record's KV bytes into a host page, summed."""
    _rows(s, d, rows, row_sums, col_sums, True)


cdef void _sum_rows(const uint8_t* s, Py_ssize_t rows, uint64_t* row_sums,
                    uint64_t* col_sums) noexcept nogil:
    """``_rows`` without the copy: the sums of a record's KV bytes where they
    lie (a host page a writer sends as it is, a page a reader received)."""
    _rows(s, <uint8_t*>s, rows, row_sums, col_sums, False)  # (nothing is written to ``d`` without ``copy``)


def copy_sums(object src, Py_ssize_t offset, object dst):
    """Copy the bytes of ``src`` from ``offset`` on into ``dst`` (a writable
    buffer of exactly that many bytes, C-contiguous) and return the row sums
    and the column sums of ``kv_checksum`` over them: two uint64 arrays in
    this machine's byte order (the caller uses them on a little-endian one),
    the row sums empty when there is no full 4 KiB row. The bytes after the
    last full row are copied too; their crc32 is the caller's. The GIL is
    released for the copy."""
    cdef Py_buffer sb, db, rb, cb
    cdef Py_ssize_t n, rows
    _read(src, &sb)
    try:
        _write(dst, &db)
        try:
            n = db.len
            if offset < 0 or sb.len - offset != n:
                raise ValueError(f"{sb.len - offset} bytes from offset {offset} for a destination of {n}")
            rows = n // 4096
            row_sums = _empty(rows, _U64)
            col_sums = np.zeros(512, _U64)
            _write(row_sums, &rb)
            _write(col_sums, &cb)
            with nogil:
                _copy_rows(<const uint8_t*>sb.buf + offset, <uint8_t*>db.buf, rows,
                           <uint64_t*>rb.buf, <uint64_t*>cb.buf)
                memcpy(<uint8_t*>db.buf + rows * 4096, <const uint8_t*>sb.buf + offset + rows * 4096,
                       n - rows * 4096)
            PyBuffer_Release(&cb)
            PyBuffer_Release(&rb)
        finally:
            PyBuffer_Release(&db)
    finally:
        PyBuffer_Release(&sb)
    return row_sums, col_sums


def kv_sums(object src):
    """The row sums and the column sums of ``kv_checksum`` over the bytes of
    ``src`` (a C-contiguous buffer), as ``copy_sums`` returns them, without
    copying anything. The bytes after the last full row are the caller's
    (their crc32). The GIL is released for the pass."""
    cdef Py_buffer sb, rb, cb
    cdef Py_ssize_t rows
    _read(src, &sb)
    try:
        rows = sb.len // 4096
        row_sums = _empty(rows, _U64)
        col_sums = np.zeros(512, _U64)
        _write(row_sums, &rb)
        _write(col_sums, &cb)
        with nogil:
            _sum_rows(<const uint8_t*>sb.buf, rows, <uint64_t*>rb.buf, <uint64_t*>cb.buf)
        PyBuffer_Release(&cb)
        PyBuffer_Release(&rb)
    finally:
        PyBuffer_Release(&sb)
    return row_sums, col_sums

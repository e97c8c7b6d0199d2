# Included in _core.pyx (one extension module): a request's page table.
# Reference: radixcache/request.py, ``Request._append_pages``.

def append_pages(req, object pages):
    """``Request._append_pages``: ``pages`` written after the first
    ``req.num_pages`` entries of ``req._pages``; when they do not fit, a new
    table (at least twice the old size, and room for the prompt's pages at
    the first) takes the old entries first. Ids that are not a C-contiguous
    int32 array are converted as numpy's assignment converts them."""
    cdef Py_buffer pb, tb, gb
    cdef Py_ssize_t num, add, need, size, cap
    pages = _int32_view(pages, &pb)
    try:
        add = pb.len // 4
        if add == 0:
            return  # (the table may still be the shared read-only empty one)
        num = req.num_pages
        need = num + add
        table = req._pages
        size = _len(table)
        if need > size:  # (room for the prompt's pages at the first)
            cap = max(need, 2 * size, len(req._tokens) // 8)
            grown = _empty(cap, _I32)
            _write(grown, &gb)
            try:
                if num:
                    _read(table, &tb)
                    memcpy(gb.buf, tb.buf, num * 4)
                    PyBuffer_Release(&tb)
                memcpy(<int32_t*>gb.buf + num, pb.buf, add * 4)
            finally:
                PyBuffer_Release(&gb)
            req._pages = grown
        else:
            _write(table, &tb)
            memcpy(<int32_t*>tb.buf + num, pb.buf, add * 4)
            PyBuffer_Release(&tb)
        req.num_pages = need
    finally:
        PyBuffer_Release(&pb)

# Included in _core.pyx (one extension module): reading numpy arrays and other buffers.
# Plain 1-D numpy arrays are read from the array object's head (``_direct``);
# anything else through the buffer protocol (see the module docstring).

cdef extern from *:
    """
    /* The head of numpy's array object (PyArrayObject_fields), whose layout
       numpy keeps stable (its own inline accessors read these fields). */
    typedef struct {
        PyObject_HEAD
        char *data;
        int nd;
        Py_ssize_t *dimensions;
        Py_ssize_t *strides;
        PyObject *base;
        PyObject *descr;
        int flags;
    } rc_array_head;

    /* A view of n bytes at buf with no owner: PyBuffer_Release of it does nothing. */
    static inline void rc_fill_view(Py_buffer *v, char *buf, Py_ssize_t n, Py_ssize_t item) {
        v->buf = buf; v->obj = NULL; v->len = n; v->itemsize = item; v->readonly = 0;
        v->ndim = 1; v->format = NULL; v->shape = NULL; v->strides = NULL;
        v->suboffsets = NULL; v->internal = NULL;
    }
    """
    ctypedef struct rc_array_head:
        char* data
        int nd
        Py_ssize_t* dimensions
        PyObject* descr
        int flags
    void rc_fill_view(Py_buffer* v, char* buf, Py_ssize_t n, Py_ssize_t item) noexcept

cdef object _U8 = np.dtype(np.uint8)
cdef object _I8 = np.dtype(np.int8)
cdef PyTypeObject* _NDARRAY = <PyTypeObject*>np.ndarray
cdef PyObject* _D_I32 = <PyObject*>_I32
cdef PyObject* _D_I64 = <PyObject*>_I64
cdef PyObject* _D_U64 = <PyObject*>_U64
cdef PyObject* _D_U8 = <PyObject*>_U8
cdef PyObject* _D_I8 = <PyObject*>_I8
cdef int _C_CONTIGUOUS = 0x0001  # numpy's NPY_ARRAY_C_CONTIGUOUS
cdef int _WRITEABLE = 0x0400  # NPY_ARRAY_WRITEABLE
cdef int _WARN_ON_WRITE = <int>0x80000000  # NPY_ARRAY_WARN_ON_WRITE: leave to numpy's export


cdef bint _int32_buffer(object ids, Py_buffer* view):
    """A read view of ``ids`` when it is a 1-D C-contiguous native int32
    buffer (True; the caller releases it); False, holding nothing, for any
    other object."""
    if _direct(ids, view, _C_CONTIGUOUS, True):
        return True
    try:
        PyObject_GetBuffer(ids, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except (TypeError, BufferError, ValueError):
        return False
    if view.ndim == 1 and view.itemsize == 4 and view.format != NULL and strcmp(view.format, b"i") == 0:
        return True
    PyBuffer_Release(view)
    return False


cdef object _int32_view(object ids, Py_buffer* view):
    """A read view of ``ids`` as a 1-D C-contiguous int32 array: of ``ids``
    itself, or of the copy that numpy's assignment into an int32 array would
    convert them to (returned: the caller keeps it alive with the view)."""
    if _int32_buffer(ids, view):
        return ids
    ids = _ascontiguous(ids, _I32).reshape(-1)
    PyObject_GetBuffer(ids, view, PyBUF_SIMPLE)
    return ids


cdef inline Py_ssize_t _item_bytes(PyObject* descr) noexcept:
    """The item size of numpy's own dtype objects the loops use; 0 for any other."""
    if descr == _D_I32:
        return 4
    if descr == _D_I64 or descr == _D_U64:
        return 8
    if descr == _D_U8 or descr == _D_I8:
        return 1
    return 0


cdef inline bint _direct(object arr, Py_buffer* view, int flags, bint int32) noexcept:
    """Fill ``view``'s ``buf``, ``len``, ``ndim`` and ``itemsize`` from the
    head of ``arr`` when it is a plain (not a subclass) 1-D numpy array with
    all of ``flags`` of a dtype above (``int32``: of int32 only); its
    ``obj`` is NULL, so ``PyBuffer_Release`` of it does nothing: the caller's
    own reference keeps ``arr`` alive meanwhile. False (``view`` untouched)
    for anything else."""
    cdef rc_array_head* h
    cdef Py_ssize_t size
    if Py_TYPE(arr) is not _NDARRAY:
        return False
    h = <rc_array_head*><PyObject*>arr
    if h.nd != 1 or (h.flags & flags) != flags or (h.flags & _WARN_ON_WRITE):
        return False
    size = _item_bytes(h.descr)
    if size == 0 or (int32 and h.descr != _D_I32):
        return False
    rc_fill_view(view, h.data, h.dimensions[0] * size, size)
    return True


cdef inline int _read_only(object arr) except -1:
    """``arr.flags.writeable = False`` for a numpy view: the flag cleared in
    the array's head (numpy's own ``PyArray_CLEARFLAGS``) for a plain array
    that has no write-warning to settle, numpy's setter for anything else."""
    cdef rc_array_head* h
    if Py_TYPE(arr) is _NDARRAY:
        h = <rc_array_head*><PyObject*>arr
        if not (h.flags & _WARN_ON_WRITE):
            h.flags &= ~_WRITEABLE
            return 0
    arr.flags.writeable = False
    return 0


cdef inline Py_ssize_t _len(object arr) except -1:
    """``len(arr)``, read from the head of a plain 1-D numpy array."""
    if Py_TYPE(arr) is _NDARRAY and (<rc_array_head*><PyObject*>arr).nd == 1:
        return (<rc_array_head*><PyObject*>arr).dimensions[0]
    return len(arr)


cdef inline int _read(object arr, Py_buffer* view) except -1:
    """A read view of a C-contiguous array (ValueError otherwise)."""
    if _direct(arr, view, _C_CONTIGUOUS, False):
        return 0
    return PyObject_GetBuffer(arr, view, PyBUF_SIMPLE)


cdef inline int _write(object arr, Py_buffer* view) except -1:
    """A writable view of a C-contiguous array (BufferError / ValueError otherwise)."""
    if _direct(arr, view, _C_CONTIGUOUS | _WRITEABLE, False):
        return 0
    return PyObject_GetBuffer(arr, view, PyBUF_SIMPLE | PyBUF_WRITABLE)

# Included in _core.pyx (one extension module): building instances of the
# project's plain ``__slots__`` classes (``Request``, ``BlockStored``) on the
# hot path without their Python ``__init__``.
#
# Each field is stored where its slot's member descriptor keeps it, which is
# what that descriptor's own ``__set__`` does; the Python ``__init__`` costs
# a frame and a generic store per field (~0.3-0.4 us for the 9-18 fields of
# these classes). Only classes whose every slot is a plain object slot, with
# no ``__dict__``, are accepted, and the caller names every slot, so no
# field of a built instance is left unset. Tests hold each built instance to
# one the class's own ``__init__`` builds from the same arguments.

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    PyObject* PyType_GenericAlloc(PyTypeObject* tp, Py_ssize_t nitems) except NULL

from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF

cdef int _T_OBJECT_EX = 16  # the member type of a ``__slots__`` entry (structmember.h)
cdef enum:
    _MAX_SLOTS = 24


cdef class _Slots:
    """The slots of a class, by the caller's order of their names."""

    cdef object cls
    cdef tuple names
    cdef Py_ssize_t at[_MAX_SLOTS]  # each field's offset in an instance


cdef _Slots _slots_of(object cls, tuple names, bint every=True):
    """``cls``'s slots, ``names`` being all of them (its bases' included;
    without ``every``, some of them: instances are then only read and
    written here, never built); TypeError for any other class (a
    ``__dict__``, a property, a slot not named, a name not a slot)."""
    cdef _Slots s = _Slots.__new__(_Slots)
    cdef PyMemberDescrObject* d
    cdef Py_ssize_t i
    declared = []
    for k in cls.__mro__:
        slots = k.__dict__.get("__slots__", ())
        declared += [slots] if isinstance(slots, str) else list(slots)
    if (cls.__dictoffset__ or len(set(names)) != len(names) or len(names) > _MAX_SLOTS
            or (sorted(declared) != sorted(names) if every else not set(names) <= set(declared))):
        raise TypeError(f"{cls.__name__}'s slots ({tuple(declared)}) are not the ones the compiled core "
                        f"builds ({names})")
    for i, name in enumerate(names):
        descr = next(k.__dict__[name] for k in cls.__mro__ if name in k.__dict__)
        if type(descr).__name__ != "member_descriptor":
            raise TypeError(f"{cls.__name__}.{name} is not a plain slot")
        d = <PyMemberDescrObject*>descr
        if d.d_member.type != _T_OBJECT_EX:
            raise TypeError(f"{cls.__name__}.{name} is not a plain slot")
        s.at[i] = d.d_member.offset
    s.cls, s.names = cls, names
    return s


cdef inline object _alloc(_Slots s):
    """A new instance of ``s.cls``, every field unset (the caller sets them all)."""
    cdef PyObject* obj = PyType_GenericAlloc(<PyTypeObject*>s.cls, 0)  # (a new reference)
    o = <object>obj
    Py_DECREF(o)  # (``o`` holds the one reference)
    return o


cdef inline void _put(object o, Py_ssize_t at, object value) noexcept:
    """Store a field at offset ``at`` (its old value released)."""
    cdef PyObject** slot = <PyObject**>(<char*><PyObject*>o + at)
    cdef PyObject* old = slot[0]
    Py_INCREF(value)
    slot[0] = <PyObject*>value
    Py_XDECREF(old)


cdef inline object _field(_Slots s, object o, Py_ssize_t i):
    """Field ``i`` of ``o`` (an instance of exactly ``s.cls``); AttributeError
    for one never set, as reading the slot raises."""
    cdef PyObject* v = (<PyObject**>(<char*><PyObject*>o + s.at[i]))[0]
    if v == NULL:
        raise AttributeError(f"'{s.cls.__name__}' object has no attribute '{s.names[i]}'")
    return <object>v


cdef inline int _bump(_Slots s, object o, Py_ssize_t i, Py_ssize_t n) except -1:
    """``o.<field i> += n`` (a counter): in the slot for an instance of
    exactly ``s.cls``, through the attribute for anything else."""
    if type(o) is s.cls:
        _put(o, s.at[i], _field(s, o, i) + n)
    else:
        name = s.names[i]
        setattr(o, name, getattr(o, name) + n)
    return 0

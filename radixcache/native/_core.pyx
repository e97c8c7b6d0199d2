# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled hot loops of the request path (see ``radixcache.native``).

Each function here (and in the files it includes, ``buffers.pxi``,
``slots.pxi``, ``pools.pxi``, ``victims.pxi``, ``eviction.pxi``, ``table.pxi``,
``ids.pxi``, ``insert.pxi``, ``lifecycle.pxi`` and ``kv.pxi``: one extension
module) has a pure-Python reference of the
same contract where it is used; the reference is what the tests hold this
module to:

    Node            radixcache/tree/node.py         Node
    MatchResult     radixcache/tree/node.py         MatchResult
    InsertResult    radixcache/tree/node.py         InsertResult
    match           radixcache/tree/radix_tree.py   RadixTree.match (and _walk)
    insert          radixcache/tree/radix_tree.py   RadixTree.insert
    insert_walk     radixcache/tree/radix_tree.py   RadixTree._insert_walk
    lock, unlock    radixcache/tree/radix_tree.py   RadixTree.lock / unlock
    evict_loop      radixcache/tree/eviction.py     DeviceEviction.evict
    drop_device     radixcache/tree/eviction.py     DeviceEviction.drop_device
    eviction_update radixcache/tree/eviction.py     DeviceEviction.update
    eviction_push   radixcache/tree/eviction.py     DeviceEviction.push
    policy_key      radixcache/tree/policies.py     EvictionPolicy.key (the built-in four)
    common_len      radixcache/tree/radix_tree.py   RadixTree._common_len
    first_page      radixcache/tree/radix_tree.py   first_page
    concat_pages    radixcache/tree/node.py         concat_pages
    block_ids       radixcache/keys/hashing.py      block_ids
    run_ids         radixcache/keys/event_ids.py    EventIds.run_ids
    node_ids        radixcache/keys/event_ids.py    EventIds.node_ids
    last_id         radixcache/keys/event_ids.py    EventIds.last_id
    chain_start     radixcache/keys/event_ids.py    EventIds.chain_start
    owned_tokens    radixcache/tokens.py            owned_tokens
    namespace_hash  radixcache/namespace.py         Namespace.__hash__
    pool_take       radixcache/transfer/allocator.py PageAllocator.allocate
    pool_give       radixcache/transfer/allocator.py PageAllocator.free
    append_pages    radixcache/request.py           Request._append_pages
    new_request     radixcache/request.py           Request (its __init__)
    new_stored      events/types.py                 BlockStored (its __init__)
    cache_admit     radixcache/cache.py             RadixCache.admit (its common case)
    cache_reserve   radixcache/cache.py             RadixCache.reserve (its common case)
    cache_commit    radixcache/cache.py             RadixCache.commit and _insert (its common case)
    cache_release   radixcache/cache.py             RadixCache.release (its common case)
    cache_take_events radixcache/cache.py           RadixCache.take_events (nothing recorded)
    copy_sums       radixcache/offload/storage/kv_checksum.py copy_checksum

Token and page-id arrays are int32 and C-contiguous (the tree only holds
validated ones). The loops read a plain 1-D numpy array's data pointer and
length from the head of the array object itself (``_direct``: the fields
numpy's own ``PyArray_DATA`` / ``PyArray_DIMS`` macros read, the same in
numpy 1 and 2), and anything else through the buffer protocol, so no numpy
header is needed to build this module. (numpy's buffer export rebuilds and
compares the array's format string on every call: ~0.1 us, several times
a request.)
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, strcmp
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE

import heapq

import numpy as np

cdef object _empty = np.empty
cdef object _MISSING = object()  # (a dict lookup's default: no such key)
cdef object _heappop = heapq.heappop
cdef object _heappush = heapq.heappush
cdef object _NO_PAGES = np.empty(0, np.int32)  # a match's pages when it found none (shared)
_NO_PAGES.setflags(write=False)
cdef object _I32 = np.dtype(np.int32)
cdef object _I64 = np.dtype(np.int64)
cdef object _U64 = np.dtype(np.uint64)
cdef object _ascontiguous = np.ascontiguousarray


cdef class Node:
    """The tree node of ``radixcache/tree/node.py`` as a C struct: the same
    fields, the same meaning (read that class's docstring)."""

    cdef public object key
    cdef public object device
    cdef public object host
    cdef public bint stored
    cdef public dict children
    cdef public Node parent
    cdef public object namespace
    cdef public Py_ssize_t lock_ref
    cdef public Py_ssize_t device_children
    # (Python ints, not C ones: the eviction policies and the tiers read
    # these from Python, and a C field would build a new int on every read)
    cdef public object last_access
    cdef public object hit_count
    cdef public object priority
    cdef public object uid
    cdef public object keys
    cdef public Py_ssize_t id_pages
    cdef public int64_t last_id
    cdef public object heap_seq
    cdef public Py_ssize_t holds
    cdef public Py_ssize_t loading
    cdef public bint forgotten

    def __init__(self, key, Node parent, namespace, uid):
        _init_node(self, key, parent, namespace, uid)

    @property
    def is_root(self):
        return self.parent is None

    def __repr__(self):
        return (
            f"Node(uid={self.uid}, tokens={self.key.size}, device={self.device is not None}, "
            f"host={self.host is not None}, stored={self.stored}, lock_ref={self.lock_ref})"
        )


cdef class MatchResult:
    """``MatchResult`` of ``radixcache/tree/node.py`` as a C struct: the same
    fields, the same meaning (read that class's docstring)."""

    cdef public object device_len
    cdef public object device_pages
    cdef public object last_device_node
    cdef public object host_len
    cdef public tuple host_nodes
    cdef public object storage_len

    def __init__(self, device_len, device_pages, last_device_node, host_len=0, tuple host_nodes=(),
                 storage_len=0):
        self.device_len = device_len
        self.device_pages = device_pages
        self.last_device_node = last_device_node
        self.host_len = host_len
        self.host_nodes = host_nodes
        self.storage_len = storage_len

    @property
    def total_len(self):
        return self.device_len + self.host_len + self.storage_len

    def __repr__(self):
        return (
            f"MatchResult(device_len={self.device_len!r}, device_pages={self.device_pages!r}, "
            f"last_device_node={self.last_device_node!r}, host_len={self.host_len!r}, "
            f"host_nodes={self.host_nodes!r}, storage_len={self.storage_len!r})"
        )


cdef class InsertResult:
    """``InsertResult`` of ``radixcache/tree/node.py`` as a C struct: the same
    fields, the same meaning (read that class's docstring)."""

    cdef public object existing_pages
    cdef public list device_parts
    cdef public object last_node
    cdef public list new_nodes
    cdef public list new_node_offsets
    cdef public object inserted_pages

    def __init__(self, existing_pages, list device_parts, last_node, list new_nodes,
                 list new_node_offsets, inserted_pages):
        # (the order of the walk's tuple: ``insert`` builds one from it)
        self.existing_pages, self.device_parts, self.last_node = existing_pages, device_parts, last_node
        self.new_nodes, self.new_node_offsets, self.inserted_pages = new_nodes, new_node_offsets, inserted_pages

    @property
    def device_pages(self):
        return concat_pages(self.device_parts)

    def __repr__(self):
        return (
            f"InsertResult(existing_pages={self.existing_pages!r}, device_parts={self.device_parts!r}, "
            f"last_node={self.last_node!r}, new_nodes={self.new_nodes!r}, "
            f"new_node_offsets={self.new_node_offsets!r}, inserted_pages={self.inserted_pages!r})"
        )


cdef int _init_node(Node self, key, Node parent, namespace, uid) except -1:
    """``Node.__init__``."""
    self.key = key
    self.device = None
    self.host = None
    self.stored = False
    self.children = {}
    self.parent = parent
    self.namespace = namespace
    self.lock_ref = 0
    self.device_children = 0
    self.last_access = uid
    self.hit_count = 0
    self.priority = 0
    self.uid = uid
    self.keys = None
    self.id_pages = 0
    self.last_id = 0
    self.heap_seq = -1
    self.holds = 0
    self.loading = 0
    self.forgotten = False
    return 0


cdef Node _new_node(key, Node parent, namespace, uid):
    """``Node(key, parent, namespace, uid)`` without a call through the type."""
    cdef Node n = Node.__new__(Node)
    _init_node(n, key, parent, namespace, uid)
    return n


cdef MatchResult _match_result(object device_len, object pages, object last, object host_len, tuple host):
    cdef MatchResult m = MatchResult.__new__(MatchResult)
    m.device_len = device_len
    m.device_pages = pages
    m.last_device_node = last
    m.host_len = host_len
    m.host_nodes = host
    m.storage_len = 0
    return m


include "buffers.pxi"
include "slots.pxi"


cdef inline Py_ssize_t _common(object key, const int32_t* t, Py_ssize_t pos, Py_ssize_t n,
                               Py_ssize_t p) except -1:
    """Tokens (page-aligned) that ``key`` shares with ``t[pos:n]``."""
    cdef Py_buffer kb
    cdef Py_ssize_t klen, m, page, pages
    _read(key, &kb)
    try:
        klen = kb.len // 4
        m = klen if klen < n - pos else n - pos
        if memcmp(kb.buf, t + pos, m * 4) == 0:
            return m
        pages = m // p
        for page in range(pages):
            if memcmp(<const int32_t*>kb.buf + page * p, t + pos + page * p, p * 4) != 0:
                return page * p
        return pages * p
    finally:
        PyBuffer_Release(&kb)


def common_len(object key, object tokens, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t page_size):
    """Tokens (page-aligned) that ``key`` shares with ``tokens[pos:n]``."""
    cdef Py_buffer tb
    _read(tokens, &tb)
    try:
        return _common(key, <const int32_t*>tb.buf, pos, n, page_size)
    finally:
        PyBuffer_Release(&tb)


def first_page(object tokens, Py_ssize_t pos, Py_ssize_t page_size):
    """The bytes of the page of ``tokens`` that starts at ``pos`` (a child's key)."""
    return _first_page(tokens, pos, page_size)


cdef object _first_page(object tokens, Py_ssize_t pos, Py_ssize_t page_size):
    """``first_page`` (C callers: no Python call)."""
    cdef Py_buffer tb
    _read(tokens, &tb)
    try:
        if (pos + page_size) * 4 > tb.len:
            raise IndexError(f"page at {pos} runs past {tb.len // 4} tokens")
        return PyBytes_FromStringAndSize(<char*>tb.buf + pos * 4, page_size * 4)
    finally:
        PyBuffer_Release(&tb)


cpdef object concat_pages(list parts):
    """The page ids of ``parts``, in order, as one new int32 array."""
    cdef Py_ssize_t total = 0
    for part in parts:
        total += _len(part)
    return _concat(parts, total, total)


cdef object _concat(list parts, Py_ssize_t total, Py_ssize_t size):
    """A new int32 array of ``size`` entries whose first ``total`` are the
    page ids of ``parts`` in order (``total``: their count; ValueError,
    nothing written past the array, when it is not)."""
    cdef Py_ssize_t at = 0
    cdef Py_buffer pb, ob
    out = _empty(size, _I32)
    if total == 0:
        return out
    _write(out, &ob)
    try:
        for part in parts:
            _read(part, &pb)
            try:
                if at + pb.len > total * 4:
                    raise ValueError(f"the parts hold more than {total} page ids")
                memcpy(<char*>ob.buf + at, pb.buf, pb.len)
            finally:
                PyBuffer_Release(&pb)
            at += pb.len
    finally:
        PyBuffer_Release(&ob)
    if at != total * 4:
        raise ValueError(f"the parts hold {at // 4} page ids, not {total}")
    return out


include "pools.pxi"
include "table.pxi"


include "ids.pxi"
include "kv.pxi"


# ---------------------------------------------------------------- the tree
def match(tree, namespace, object tokens, object priority=0, Py_ssize_t end=-1):
    """``RadixTree.match`` (its arguments, then the walk below)."""
    return _match(tree, namespace, tokens, priority, end)


cdef MatchResult _match(tree, namespace, object tokens, object priority, Py_ssize_t end, bint concat=True):
    """``match`` (``concat``: see ``_walk``)."""
    cdef Py_ssize_t p = tree.page_size
    cdef Py_ssize_t n = _len(tokens)
    if 0 <= end < n:
        n = end
    n -= n % p
    root = tree._roots.get(namespace)
    if root is None or n == 0:
        return _match_result(0, _NO_PAGES if concat else [], None, 0, ())
    tick = tree.tick + 1
    tree.tick = tick
    return _walk(tree, <Node?>root, tokens, n, p, priority, tick, concat)


cdef MatchResult _walk(tree, Node root, object tokens, Py_ssize_t n, Py_ssize_t p, object priority,
                       object tick, bint concat=True):
    """``RadixTree._walk``: the loop of ``match`` and its result (see there);
    without ``concat`` the result's ``device_pages`` is the list of the
    nodes' page arrays (for a caller that copies them where it wants them)."""
    cdef Py_buffer tb
    cdef Py_ssize_t pos = 0, device_len = 0, matched
    cdef const int32_t* t
    cdef Node node = root, child, last_device = None
    cdef list parts = []
    cdef list host_nodes = []
    lower = tree.lower
    _read(tokens, &tb)
    try:
        t = <const int32_t*>tb.buf
        while pos < n:
            found = node.children.get(PyBytes_FromStringAndSize(<char*>(t + pos), p * 4))
            if found is None:
                break
            child = <Node>found
            matched = _common(child.key, t, pos, n, p)
            if matched < _len(child.key):
                child = tree.split(child, matched // p)
            child.last_access = tick
            child.hit_count += 1
            if priority > child.priority:
                child.priority = priority
            if child.device is not None and not host_nodes:
                parts.append(child.device)
                device_len += matched
                last_device = child
            elif lower.resident(child):
                host_nodes.append(child)
            else:
                break
            pos += matched
            node = child
    finally:
        PyBuffer_Release(&tb)
    return _match_result(device_len, (concat_pages(parts) if parts else _NO_PAGES) if concat else parts,
                         last_device, pos - device_len, tuple(host_nodes))


include "victims.pxi"
include "eviction.pxi"
include "insert.pxi"
include "lifecycle.pxi"


# ---------------------------------------------------------------- namespaces
def namespace_hash(self):
    """``Namespace.__hash__`` (radixcache/namespace.py): the hash taken once
    at construction, without a Python frame per dict lookup."""
    return self._hash

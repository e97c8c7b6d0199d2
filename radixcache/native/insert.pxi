# Included in _core.pyx (one extension module): the walk of an insert.
# Reference: radixcache/tree/radix_tree.py, ``RadixTree._insert_walk``.

GPU = "GPU"  # the device medium as the tree records it (radix_tree.GPU)

cdef object _RADIX_TREE = None  # RadixTree itself: its attach_pages is ``_attach`` here


def bind_tree(radix_tree):
    """``RadixTree`` (radixcache/tree/radix_tree.py): an insert into a tree
    of exactly that class attaches pages without a method call (``_attach``);
    a subclass keeps its own ``attach_pages``."""
    global _RADIX_TREE
    _RADIX_TREE = radix_tree


cdef int _attach(tree, Node node, object pages) except -1:
    """``tree.attach_pages(node, pages)``: for a ``RadixTree``, that method's
    body (counters, the tenant ledger, the eviction candidates)."""
    cdef Node parent = node.parent
    cdef Py_ssize_t n
    cdef bint free
    if type(tree) is not _RADIX_TREE:
        tree.attach_pages(node, pages)
        return 0
    assert node.device is None and parent is not None, "attach_pages to a node with pages, or a root"
    n = _len(pages)
    free = node.lock_ref == 0
    node.device = pages
    tree.device_pages += n
    if free:
        tree.evictable_pages += n
    ledger = tree.ledger
    if ledger is not None:
        _add_device(ledger, node.namespace, n, free)
    parent.device_children += 1
    ev = tree.eviction
    candidates = ev.candidates
    candidates.discard(parent)
    if type(ev) is _DEVICE_EVICTION:
        _update(ev, candidates, node)
    else:
        ev.update(node)
    return 0


cdef object _copy_range(object arr, Py_ssize_t start, Py_ssize_t stop):
    """``arr[start:stop].copy()`` of a C-contiguous int32 array: one
    allocation and one memcpy."""
    cdef Py_buffer ab, ob
    out = _empty(stop - start, _I32)
    if stop > start:
        _read(arr, &ab)
        try:
            _write(out, &ob)
            memcpy(ob.buf, <int32_t*>ab.buf + start, (stop - start) * 4)
            PyBuffer_Release(&ob)
        finally:
            PyBuffer_Release(&ab)
    return out


cdef bint _can_extend(tree, Node node) except -1:
    """``tree._can_extend(node)``: for a ``RadixTree``, that method's body
    (its lower tiers' ``bare`` asked only of a plain device leaf)."""
    if type(tree) is not _RADIX_TREE:
        return bool(tree._can_extend(node))
    if node.parent is None or node.children or node.lock_ref != 0 or node.device is None:
        return False
    lower = tree.lower
    return type(lower) is _NO_LOWER or bool(lower.bare(node))


def insert(tree, namespace, object tokens, object pages, object priority=0):
    """``RadixTree.insert`` (see there): the checks, the namespace's root, the
    tick, the walk (``_insert_walk``: the C one below for a ``RadixTree``,
    the method for a subclass) and its ``InsertResult``."""
    cdef Py_ssize_t p = tree.page_size
    cdef Py_ssize_t total = tokens.size
    if total % p:
        raise ValueError(f"insert takes whole pages: {total} tokens is not a multiple of {p}")
    if pages.size * p != total:
        raise ValueError(f"{total} tokens need {total // p} pages, got {pages.size}")
    return _insert(tree, namespace, tokens, pages, priority, total)


cdef InsertResult _insert(tree, namespace, object tokens, object pages, object priority, Py_ssize_t total):
    """``insert`` after its checks, of the first ``total`` of ``tokens``
    (whole pages) and the first ``total // page_size`` of ``pages``."""
    roots = tree._roots
    root = roots.get(namespace)
    if root is None:
        root = Node(tokens[:0].copy(), None, namespace, -1)
        roots[namespace] = root
    tick = tree.tick + 1
    tree.tick = tick
    if type(tree) is _RADIX_TREE:
        return _insert_walk(tree, <Node?>root, namespace, tokens, pages, priority, tick, total)
    walked = tree._insert_walk(root, namespace, tokens[:total], pages[:total // tree.page_size], priority, tick)
    return InsertResult(*walked)


def insert_walk(tree, Node root, namespace, object tokens, object pages, object priority, object tick):
    """``RadixTree._insert_walk``: the steps of ``insert`` below ``root``
    (``tokens`` and ``pages`` checked; any integer arrays); the fields of
    its ``InsertResult``, in order."""
    cdef InsertResult r = _insert_walk(tree, root, namespace, tokens, pages, priority, tick, len(tokens))
    return r.existing_pages, r.device_parts, r.last_node, r.new_nodes, r.new_node_offsets, r.inserted_pages


cdef InsertResult _insert_walk(tree, Node root, namespace, object tokens, object pages, object priority,
                               object tick, Py_ssize_t total):
    """``insert_walk`` of the first ``total`` tokens. Splits and adoptions go
    through the tree's own methods, as there; page attachment and the
    stores' event records are those methods' bodies in C for the project's
    own tree and recorder (``_attach``, ``_record_stored``), the methods for
    any other."""
    cdef Py_buffer tb
    cdef Py_ssize_t p = tree.page_size
    cdef Py_ssize_t pos = 0, existing = 0, matched
    cdef const int32_t* t
    cdef Node node = root, child = None, leaf
    cdef list parts = [], new_nodes = [], offsets = []
    eviction = tree.eviction
    cdef set candidates = eviction.candidates
    lower = tree.lower
    recorder = tree.recorder
    cdef Py_buffer pb
    key = b""
    pages = _int32_view(pages, &pb)  # (as numpy would convert them into a node's int32 pages)
    PyBuffer_Release(&pb)
    tokens = _int32_view(tokens, &tb)
    try:
        t = <const int32_t*>tb.buf
        assert total <= tb.len // 4
        while pos < total:
            key = PyBytes_FromStringAndSize(<char*>(t + pos), p * 4)
            found = node.children.get(key)
            if found is None:
                child = None
                break
            child = <Node>found
            matched = _common(child.key, t, pos, total, p)
            if child.device is None and not lower.adoptable(child):
                break  # being loaded back: no adoption; the insert stops here
            if matched < _len(child.key):
                child = tree.split(child, matched // p)
            child.last_access = tick
            if priority > child.priority:
                child.priority = priority
            if child in candidates:
                eviction.push(child)  # its key changed: keep the heap fresh
            if child.device is None:
                _attach(tree, child, _copy_range(pages, pos // p, (pos + matched) // p))
                _record_stored(recorder, child, 0, matched // p, GPU)
                new_nodes.append(child)
                offsets.append(pos // p)
            elif existing * p == pos:
                existing += matched // p
            parts.append(child.device)
            pos += matched
            node = child
    finally:
        PyBuffer_Release(&tb)
    if pos < total and child is not None:
        # stopped at a node being loaded back: the rest stays with the caller
        return _insert_result(existing, parts, node, new_nodes, offsets, pos // p)
    if pos < total and _can_extend(tree, node):
        old_pages = _len(node.key) // p
        tree._extend_leaf(node, tokens[pos:total], pages[pos // p:total // p])
        _record_stored(recorder, node, old_pages, (total - pos) // p, GPU)
        new_nodes.append(node)
        offsets.append(pos // p)
        parts.append(_copy_range(pages, pos // p, total // p))
    elif pos < total:
        leaf = _new_node(_copy_range(tokens, pos, total), node, namespace, tick)
        leaf.last_access = tick
        leaf.priority = priority
        node.children[key] = leaf
        tree.node_count += 1
        _attach(tree, leaf, _copy_range(pages, pos // p, total // p))
        _record_stored(recorder, leaf, 0, (total - pos) // p, GPU)
        new_nodes.append(leaf)
        offsets.append(pos // p)
        parts.append(leaf.device)
        node = leaf
    return _insert_result(existing, parts, node, new_nodes, offsets, total // p)


cdef InsertResult _insert_result(existing, list parts, last, list new_nodes, list offsets, inserted):
    """``InsertResult(existing, parts, last, new_nodes, offsets, inserted)``."""
    cdef InsertResult r = InsertResult.__new__(InsertResult)
    r.existing_pages, r.device_parts, r.last_node = existing, parts, last
    r.new_nodes, r.new_node_offsets, r.inserted_pages = new_nodes, offsets, inserted
    return r

# Included in _core.pyx (one extension module, for the typed ``Node``): device
# eviction, and the locks that keep nodes from it. References:
# radixcache/tree/eviction.py, ``DeviceEviction.evict`` / ``drop_device`` /
# ``update`` / ``push``; radixcache/tree/radix_tree.py, ``RadixTree.lock`` / ``unlock``.

cdef object _DEVICE_EVICTION = None  # DeviceEviction itself: its push and drop are the C ones here


def bind_eviction(device_eviction):
    """``DeviceEviction`` (radixcache/tree/eviction.py): for an object of
    exactly that class, eviction calls ``_push`` and ``_drop`` below without
    a method call; a subclass keeps its own methods."""
    global _DEVICE_EVICTION
    _DEVICE_EVICTION = device_eviction


cdef int _update(ev, set candidates, Node node) except -1:
    """``DeviceEviction.update`` on ``ev`` (whose ``candidates`` is given):
    ``node`` joins the candidates if it qualifies (its heap entry through
    ``ev.push``, which a subclass may override)."""
    if (node.lock_ref == 0 and node.device is not None and node.device_children == 0
            and node.parent is not None and node not in candidates):
        candidates.add(node)
        _push_of(ev, node)
    return 0


cdef inline int _push_of(ev, Node node) except -1:
    """``ev.push(node)``: the C body for a ``DeviceEviction``, the method otherwise."""
    if type(ev) is _DEVICE_EVICTION:
        return _push(ev, node)
    ev.push(node)
    return 0


cdef int _push(ev, Node node) except -1:
    """``DeviceEviction.push``: a fresh heap entry for ``node``."""
    seq = next(ev._seq)
    node.heap_seq = seq
    _heappush(ev.heap, tuple(_policy_key(ev.policy, node)) + (seq, node))
    return 0


def eviction_update(ev, Node node not None):
    """``DeviceEviction.update`` (see ``_update``)."""
    _update(ev, ev.candidates, node)


def eviction_push(ev, Node node not None):
    """``DeviceEviction.push``: a fresh heap entry for ``node``."""
    _push(ev, node)


def evict_loop(ev, Py_ssize_t num_pages, before_drop):
    """The loop of ``DeviceEviction.evict`` (see there): the released device
    page ids, concatenated."""
    cdef list dev = []
    cdef list skipped = None
    cdef Py_ssize_t count = 0, short, last
    cdef set candidates = ev.candidates
    cdef tuple entry
    cdef Node node
    cdef list heap
    if len(ev.heap) > len(candidates) + 64:
        ev._rebuild_heap()  # mostly superseded entries: cheaper to start over
    heap = ev.heap
    policy = ev.policy
    tree = ev.tree
    lower = tree.lower
    cdef bint own = type(ev) is _DEVICE_EVICTION  # (its push and drop: the C bodies, no method call)
    drop = None if own else ev.drop_device
    while count < num_pages and heap:
        entry = _heappop(heap)
        last = len(entry) - 1
        node = entry[last]
        if entry[last - 1] != node.heap_seq or node not in candidates:
            continue  # superseded by a newer entry, or no longer a candidate
        if _policy_key(policy, node) != entry[:last - 1]:
            _push_of(ev, node)  # touched since it was pushed
            continue
        short = num_pages - count
        if short < _len(node.device):
            node = ev._tail_victim(node, short)
        if before_drop is not None:
            before_drop(node)
        if node.children and not _resident(lower, node) and tree.removal.held_below(node):
            if skipped is None:
                skipped = []
            skipped.append(node)  # descendants held by jobs: not now
            continue
        pages = _drop(ev, node) if own else drop(node)
        dev.append(pages)
        count += _len(pages)
    if skipped is not None:
        for node in skipped:  # still candidates: give them their heap entry back
            if node in candidates:
                _push_of(ev, node)
    return concat_pages(dev)


def drop_device(ev, Node node not None):
    """``DeviceEviction.drop_device`` (see there)."""
    return _drop(ev, node)


cdef object _drop(ev, Node node):
    """``drop_device`` (C callers: no Python call)."""
    cdef Node parent = node.parent
    cdef Node child
    cdef Py_ssize_t n
    cdef set candidates = ev.candidates
    tree = ev.tree
    pages = node.device
    assert pages is not None and parent is not None, "drop_device on a node without pages"
    assert node.lock_ref == 0 and node.device_children == 0, "drop_device on a protected node"
    _record_removed(tree.recorder, node, "GPU")
    node.device = None
    n = _len(pages)
    tree.device_pages -= n
    tree.evictable_pages -= n
    ledger = tree.ledger
    if ledger is not None:
        _sub_device(ledger, node.namespace, n)
    candidates.discard(node)
    parent.device_children -= 1
    if not _resident(tree.lower, node):  # (so it holds nothing below the device)
        removal = tree.removal
        if node.children:
            for child in list(node.children.values()):
                assert child.lock_ref == 0, "a locked node under a victim"
                del node.children[child.key[: tree.page_size].tobytes()]
                for gone in removal.subtree(child):
                    removal.discount(gone, [])
        _unlink(tree, removal, node)
    _update(ev, candidates, parent)
    return pages


cdef object _tenant_key(ledger, namespace):
    """``ledger.key(namespace)`` as a ``TenantLedger`` finds it (its cache,
    the method when it is not known yet); ``_MISSING`` for a ledger of
    another kind (no ``_keys`` dict), whose own methods the caller calls."""
    keys = getattr(ledger, "_keys", None)
    if type(keys) is not dict:
        return _MISSING
    key = (<dict>keys).get(namespace, _MISSING)
    return ledger.key(namespace) if key is _MISSING else key


cdef int _sub_device(ledger, namespace, Py_ssize_t n) except -1:
    """``TenantLedger.sub_device(namespace, n, True)`` (radixcache/tenants/ledger.py)."""
    key = _tenant_key(ledger, namespace)
    if key is _MISSING:  # another ledger: its own method
        ledger.sub_device(namespace, n, True)
        return 0
    _count_sub(ledger.device, key, n)
    if ledger.book is not None:
        _count_sub(ledger.evictable, key, n)
    return 0


cdef int _add_device(ledger, namespace, Py_ssize_t n, bint evictable) except -1:
    """``TenantLedger.add_device(namespace, n, evictable)`` (radixcache/tenants/ledger.py)."""
    key = _tenant_key(ledger, namespace)
    if key is _MISSING:  # another ledger: its own method
        ledger.add_device(namespace, n, evictable)
        return 0
    _count_sub(ledger.device, key, -n)
    if evictable and ledger.book is not None:
        _count_sub(ledger.evictable, key, -n)
    return 0


cdef int _count_sub(dict counts, key, Py_ssize_t n) except -1:
    """The ledger's ``_add(counts, key, -n)``: a count that reaches 0 leaves the dict."""
    cdef Py_ssize_t left = <Py_ssize_t>counts.get(key, 0) - n
    if left < 0:
        raise AssertionError(f"tenant {key!r}: a count went below zero ({left})")
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)
    return 0


cdef int _unlink(tree, removal, Node node) except -1:
    """``TreeRemoval.unlink`` (radixcache/tree/removal.py): a childless
    ``node`` out of its parent; a root left empty goes."""
    cdef Node parent = node.parent
    assert parent is not None and not node.children, "removing an inner node"
    del parent.children[_first_page(node.key, 0, tree.page_size)]
    tree.node_count -= 1
    if parent.parent is None and not parent.children:
        roots = removal.roots
        if roots.get(parent.namespace) is parent:
            del roots[parent.namespace]
        elif parent in removal.detached:
            removal.detached.remove(parent)
    return 0


def lock(tree, Node node):
    """``RadixTree.lock``."""
    _lock(tree, node)


cdef int _lock(tree, Node node) except -1:
    """``lock``."""
    cdef set candidates = tree.eviction.candidates
    cdef Py_ssize_t locked = 0
    cdef Node n = node
    while n is not None:
        if n.lock_ref == 0:
            if n.device is not None:
                locked += _len(n.device)
            candidates.discard(n)
        n.lock_ref += 1
        n = n.parent
    if locked:
        tree.evictable_pages -= locked
    return 0


def unlock(tree, Node node):
    """``RadixTree.unlock``."""
    _unlock(tree, node)


cdef int _unlock(tree, Node node) except -1:
    """``unlock``."""
    cdef Py_ssize_t freed = 0
    cdef Node n = node
    if node.lock_ref <= 0:
        raise ValueError(f"unlock of a node that is not locked: {node!r}")
    update = None
    while n is not None:
        n.lock_ref -= 1
        if n.lock_ref == 0 and n.device is not None:
            freed += _len(n.device)
            if n.device_children == 0 and n.parent is not None:  # (update's own first checks)
                if update is None:
                    update = tree.eviction.update
                update(n)
        n = n.parent
    if freed:
        tree.evictable_pages += freed
    return 0

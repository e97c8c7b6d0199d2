# Included in _core.pyx: the per-victim calls of device eviction, in C where
# the object is one of the project's own classes (bound at import by the
# module that defines it), and the object's own method for anything else
# (a subclass, a test's stand-in):
#
#   _policy_key      EvictionPolicy.key        radixcache/tree/policies.py
#   _resident        NoLowerTiers.resident     radixcache/tree/lower.py
#   _record_removed  EventRecorder.removed     radixcache/recorder.py
#   _record_stored   EventRecorder.stored      radixcache/recorder.py (an insert's)
#
# Each C branch is the method's body; the eviction tests hold both paths to
# the same victims and events (tests/radixcache/native/test_victims.py).

cdef object _LRU = None, _LFU = None, _FIFO = None, _PRIORITY = None
cdef object _NO_LOWER = None
cdef object _RECORDER = None
cdef object _REMOVAL = None  # the recorder's record of consecutive removals on one medium
cdef object _STORED = None  # ... and a store's record, its event (radixcache/events/types.py)


def bind_policies(lru, lfu, fifo, priority):
    """The four built-in policy classes (radixcache/tree/policies.py)."""
    global _LRU, _LFU, _FIFO, _PRIORITY
    _LRU, _LFU, _FIFO, _PRIORITY = lru, lfu, fifo, priority


def bind_lower(no_lower):
    """``NoLowerTiers`` (radixcache/tree/lower.py)."""
    global _NO_LOWER
    _NO_LOWER = no_lower


# ``BlockStored``'s slots in the order of its ``__init__``'s arguments (an
# insert's store record is built through them: slots.pxi).
STORED_SLOTS = ("_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                "cache_salt", "extra_keys")
cdef _Slots _STORED_AT = None


def bind_recorder(recorder, removal, stored):
    """``EventRecorder`` and its records: ``_Removal`` (radixcache/recorder.py)
    and ``BlockStored``, which a store's record is (TypeError when its slots
    are not ``STORED_SLOTS``)."""
    global _RECORDER, _REMOVAL, _STORED, _STORED_AT
    at = _slots_of(stored, STORED_SLOTS)
    _RECORDER, _REMOVAL, _STORED, _STORED_AT = recorder, removal, stored, at


def new_stored(hashes, parent, token_ids, block_size, lora_id, medium, lora_name, salt, extra):
    """``BlockStored(...)``, all nine arguments, as an insert's record is
    built (tests hold it to the class's own)."""
    if _STORED_AT is None:
        raise RuntimeError("bind_recorder() has not run: the compiled core is not in use in this process")
    return _new_stored(hashes, parent, token_ids, block_size, lora_id, medium, lora_name, salt, extra)


cdef object _new_stored(hashes, parent, token_ids, block_size, lora_id, medium, lora_name, salt, extra):
    """``BlockStored(hashes, parent, token_ids, ...)``, every argument given."""
    cdef _Slots s = _STORED_AT
    o = _alloc(s)
    _put(o, s.at[0], hashes)
    _put(o, s.at[1], parent)
    _put(o, s.at[2], token_ids)
    _put(o, s.at[3], block_size)
    _put(o, s.at[4], lora_id)
    _put(o, s.at[5], medium)
    _put(o, s.at[6], lora_name)
    _put(o, s.at[7], salt)
    _put(o, s.at[8], extra)
    return o


cdef inline object _policy_key(policy, Node node):
    """``policy.key(node)``."""
    cdef object t = type(policy)
    if t is _LRU:
        return (node.last_access,)
    if t is _LFU:
        return (node.hit_count, node.last_access)
    if t is _PRIORITY:
        return (node.priority, node.last_access)
    if t is _FIFO:
        return (node.uid,)
    return policy.key(node)


def policy_key(policy, Node node not None):
    """``policy.key(node)`` as eviction computes it (tests)."""
    return _policy_key(policy, node)


cdef inline bint _resident(lower, Node node) except -1:
    """``lower.resident(node)``."""
    if type(lower) is _NO_LOWER:
        return False
    return bool(lower.resident(node))


cdef int _record_removed(recorder, Node node, object medium) except -1:
    """``recorder.removed(node, medium)``: for an ``EventRecorder``, that
    method's body and its ``_remove``'s: the pending removal joins the last
    record when that is a removal on the same medium, or starts one."""
    cdef list records
    if type(recorder) is not _RECORDER:
        recorder.removed(node, medium)
        return 0
    if node.forgotten:
        return 0
    pending = (node.key, recorder.ids.chain_start(node))
    records = recorder._records
    if records:
        last = records[len(records) - 1]
        if type(last) is _REMOVAL and last.medium == medium:
            last.parts.append(pending)
            return 0
    records.append(_REMOVAL([pending], medium))
    return 0


cdef int _record_stored(recorder, Node node, Py_ssize_t start, Py_ssize_t count, object medium) except -1:
    """``recorder.stored(node, start, count, medium)`` for a device medium (an
    insert's stores): for an ``EventRecorder``, that method's body and its
    ``_append``'s (a read-only view of the pages' tokens; no storage keys)."""
    cdef Py_ssize_t p
    if type(recorder) is not _RECORDER:
        recorder.stored(node, start, count, medium)
        return 0
    if count <= 0 or node.forgotten:
        return 0
    parent, run = recorder.ids.run_ids(node, start, count)
    p = recorder.page_size
    key = node.key
    view = key.view() if start == 0 and count * p == _len(key) else key[start * p:(start + count) * p]
    _read_only(view)
    ns = node.namespace
    fields = recorder._ns.get(ns)  # (``event_fields``'s cache, the method when it misses)
    salt, extra = recorder.event_fields(ns) if fields is None else fields
    recorder._records.append(_new_stored(run, parent, view, p, ns.lora_id, medium, ns.lora_name, salt,
                                         None if extra is None else [extra] * len(run)))
    return 0

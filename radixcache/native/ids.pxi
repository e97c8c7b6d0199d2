# Included in _core.pyx (one extension module): event block ids.
# References: radixcache/keys/hashing.py ``block_ids``, radixcache/keys/event_ids.py
# ``EventIds.run_ids``, ``node_ids``, ``last_id`` and ``chain_start``.

# The page ids' loop, in C so that the common page sizes get a loop of
# their own: with the size a constant, the compiler unrolls and vectorizes
# a page's 16 (32, 64) multiplies; with the size a variable it ran ~2.5x
# slower at 16 tokens a page (17 against 6.8 ns a page here). At 16 tokens
# a page an x86-64 CPU with AVX2 gets a loop of 32-bit multiplies, four
# pages at a time (~1.7x faster than the plain one; chosen at run time, so
# the build itself asks for no instruction set). The ids are the same every
# way (the tests hold each to radixcache/keys/hashing.py).
cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>

    /* The id of a page whose token x weight sum is x, chained from prev. */
    static inline __attribute__((always_inline)) uint64_t rc_ids_step(uint64_t prev, uint64_t x) {
        x ^= x >> 29;
        return (0x9E3779B97F4A7C15ULL * prev + 0xBF58476D1CE4E5B9ULL * x) & 0x7FFFFFFFFFFFFFFFULL;
    }

    static inline __attribute__((always_inline)) uint64_t rc_ids_loop(
            const uint32_t* t, ptrdiff_t n, ptrdiff_t p, uint64_t prev, const uint64_t* k, int64_t* o) {
        for (ptrdiff_t i = 0; i < n; i++) {
            uint64_t x = 0;
            for (ptrdiff_t j = 0; j < p; j++) x += (uint64_t)t[i * p + j] * k[j];
            prev = rc_ids_step(prev, x);
            if (o) o[i] = (int64_t)prev;
        }
        return prev;
    }

    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #include <immintrin.h>
    #define RC_IDS_AVX2 1
    /* 16 tokens a page with AVX2: a page's sum of token x weight, mod 2**64,
       is the sum of token x (weight mod 2**32) in 64-bit lanes plus, shifted
       up 32 bits, the sum of token x (weight >> 32) in 32-bit lanes (only its
       low 32 bits survive the shift): 32-bit multiplies, which AVX2 has, in
       place of 64-bit ones, which it has not. Four pages' sums are formed
       side by side, then chained one by one as in rc_ids_loop. */
    static inline __attribute__((always_inline, target("avx2"))) __m256i rc_lo4(
            const uint32_t* q, __m256i l0, __m256i l1, __m256i l2, __m256i l3) {
        __m256i a = _mm256_mul_epu32(_mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(q + 0))), l0);
        __m256i b = _mm256_mul_epu32(_mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(q + 4))), l1);
        __m256i c = _mm256_mul_epu32(_mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(q + 8))), l2);
        __m256i d = _mm256_mul_epu32(_mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(q + 12))), l3);
        return _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    }
    static inline __attribute__((always_inline, target("avx2"))) __m256i rc_hi8(
            const uint32_t* q, __m256i h0, __m256i h1) {
        return _mm256_add_epi32(_mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)q), h0),
                                _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)(q + 8)), h1));
    }
    static __attribute__((target("avx2"))) uint64_t rc_ids16_avx2(
            const uint32_t* t, ptrdiff_t n, uint64_t prev, const uint64_t* k, int64_t* o) {
        uint32_t kl[16], kh[16];
        uint64_t xs[4];
        ptrdiff_t i = 0;
        for (int j = 0; j < 16; j++) { kl[j] = (uint32_t)k[j]; kh[j] = (uint32_t)(k[j] >> 32); }
        __m256i l0 = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(kl + 0)));
        __m256i l1 = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(kl + 4)));
        __m256i l2 = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(kl + 8)));
        __m256i l3 = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(kl + 12)));
        __m256i h0 = _mm256_loadu_si256((const __m256i*)(kh + 0));
        __m256i h1 = _mm256_loadu_si256((const __m256i*)(kh + 8));
        for (; i + 4 <= n; i += 4) {
            const uint32_t* q = t + i * 16;
            __m256i s0 = rc_lo4(q, l0, l1, l2, l3), s1 = rc_lo4(q + 16, l0, l1, l2, l3);
            __m256i s2 = rc_lo4(q + 32, l0, l1, l2, l3), s3 = rc_lo4(q + 48, l0, l1, l2, l3);
            __m256i a = _mm256_add_epi64(_mm256_unpacklo_epi64(s0, s1), _mm256_unpackhi_epi64(s0, s1));
            __m256i b = _mm256_add_epi64(_mm256_unpacklo_epi64(s2, s3), _mm256_unpackhi_epi64(s2, s3));
            __m256i lo = _mm256_add_epi64(_mm256_permute2x128_si256(a, b, 0x20),
                                          _mm256_permute2x128_si256(a, b, 0x31));  /* the 4 pages' low sums */
            __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(rc_hi8(q, h0, h1), rc_hi8(q + 16, h0, h1)),
                                          _mm256_hadd_epi32(rc_hi8(q + 32, h0, h1), rc_hi8(q + 48, h0, h1)));
            __m128i hi = _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
            _mm256_storeu_si256((__m256i*)xs, _mm256_add_epi64(lo, _mm256_slli_epi64(_mm256_cvtepu32_epi64(hi), 32)));
            for (int j = 0; j < 4; j++) {
                prev = rc_ids_step(prev, xs[j]);
                if (o) o[i + j] = (int64_t)prev;
            }
        }
        return rc_ids_loop(t + i * 16, n - i, 16, prev, k, o ? o + i : NULL);  /* the last pages */
    }
    static int rc_avx2 = -1;  /* -1: not asked yet; 0: off (no AVX2, or switched off) */
    static inline int rc_use_avx2(void) {
        if (rc_avx2 < 0) {
            __builtin_cpu_init();
            rc_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
        }
        return rc_avx2;
    }
    #endif

    static int rc_ids_simd(int on) {  /* on: 1 where the CPU has it, 0 off; returns what is used now */
    #ifdef RC_IDS_AVX2
        rc_avx2 = -1;
        if (!on) rc_avx2 = 0;
        return rc_use_avx2();
    #else
        (void)on;
        return 0;
    #endif
    }

    static uint64_t rc_fill_ids(const uint32_t* t, ptrdiff_t n, ptrdiff_t p, uint64_t prev,
                                const uint64_t* k, int64_t* o) {
        switch (p) {
            case 16:
    #ifdef RC_IDS_AVX2
                if (rc_use_avx2()) return rc_ids16_avx2(t, n, prev, k, o);
    #endif
                return rc_ids_loop(t, n, 16, prev, k, o);
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
    int _ids_simd "rc_ids_simd"(int on) noexcept nogil


def ids_simd(bint on=True):
    """Whether the page ids of 16-token pages use the AVX2 loop: ``on``
    (the default) uses it where the CPU has it, False the plain loop (the
    tests run both against the definition). Returns whether it is in use."""
    return bool(_ids_simd(on))


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

"""What the tenant tests share: distinct prompts of whole pages, and one
request served start to end."""

from __future__ import annotations

import numpy as np

from radixcache import Namespace, RadixCache, Request

P = 4  # the page size of these tests' caches


def prompt(i: int, pages: int) -> np.ndarray:
    """``pages`` whole pages of tokens plus one, distinct per ``i``."""
    return np.arange(i * 1000, i * 1000 + pages * P + 1, dtype=np.int32)


def serve(cache: RadixCache, ns: Namespace, tokens: np.ndarray, release: bool = True) -> Request:
    """Admit ``tokens``, compute and commit the rest, release (unless not
    ``release``); the cache's integrity is checked after."""
    req = cache.admit(tokens, ns)
    n = tokens.size - req.num_computed
    cache.reserve(req, n)
    cache.commit(req, n)
    if release:
        cache.release(req)
    cache.check_integrity()
    return req

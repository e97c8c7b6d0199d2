"""What every backend checks of what a caller hands it, the same way.

A call is refused when it enters, on the owner thread, with a ``ValueError``
or ``TypeError`` that names the problem; nothing invalid reaches a backend's
threads. The checks return private copies (token ids, page ids, record keys)
so that a caller may reuse its buffers as soon as the call returns.

The backends' frozen configs validate their numbers with ``positive_int``
and ``positive_float``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from radixcache.offload.storage.contract import (
    MAX_KEY_BYTES,
    HostPages,
    PageBuffer,
    PutMeta,
    TokenPages,
)
from radixcache.transfer.layout import KVSpec


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int (not a bool) above 0; else ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def positive_float(name: str, value: object) -> float:
    """``value`` as a float if it is a finite number above 0; else ValueError."""
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def check_key(i: int, key: object) -> bytes:
    """Page key ``i`` of a call, if it is bytes of 1 to ``MAX_KEY_BYTES``."""
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"page keys are 1 to {MAX_KEY_BYTES} bytes; key {i} is {key!r}")
    return key


def record_keys(prefix: bytes, keys: Sequence[bytes]) -> list[bytes]:
    """The record keys (``prefix``, the fingerprint digest, + page key) of
    ``keys``, each checked with ``check_key``."""
    return [prefix + check_key(i, key) for i, key in enumerate(keys)]


def check_namespace(namespace: object) -> bytes:
    """``namespace`` if it is bytes; else TypeError."""
    if not isinstance(namespace, bytes):
        raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
    return namespace


def check_tenant(tenant: object) -> bytes | None:
    """``tenant`` if it is bytes (a namespace's cache salt, encoded) or None
    (the default tenant); else TypeError. Never shown in a message."""
    if tenant is not None and not isinstance(tenant, bytes):
        raise TypeError(f"tenant must be bytes or None, got {type(tenant).__name__}")
    return tenant


def check_pages(
    n: int,
    tokens: TokenPages | None,
    host: PageBuffer,
    host_pages: HostPages,
    spec: KVSpec,
    what: str,
) -> tuple[TokenPages | None, HostPages]:
    """Validate the pages of a ``get``/``put`` of ``n`` keys against a
    backend's ``spec`` (``what``: "storage" or "pool", for messages); returns
    private int32 copies of ``tokens`` (None for raw pages) and ``host_pages``.
    Raises ValueError naming the problem."""
    if host.page_bytes != spec.page_bytes:
        raise ValueError(
            f"the page buffer has pages of {host.page_bytes} B; {what} pages "
            f"({spec.describe()}) are {spec.page_bytes} B"
        )
    pages = np.asarray(host_pages)
    if pages.shape != (n,) or pages.dtype.kind not in "iu":
        raise ValueError(
            f"host_pages must be an int array of shape ({n},), got {pages.dtype} {pages.shape}"
        )
    if n and (int(pages.min()) < 0 or int(pages.max()) >= host.num_pages):
        raise ValueError(
            f"host page ids must lie in [0, {host.num_pages}): min {pages.min()}, max {pages.max()}"
        )
    if tokens is None:
        return None, pages.astype(np.int32)
    p = spec.page_size
    toks = np.asarray(tokens)
    if toks.shape != (n, p) or toks.dtype.kind not in "iu":
        raise ValueError(
            f"tokens must be an int array of shape ({n}, {p}), got {toks.dtype} {toks.shape}"
        )
    if n and (int(toks.min()) < -(2**31) or int(toks.max()) >= 2**31):
        raise ValueError("token ids must fit in int32")
    return toks.astype(np.int32), pages.astype(np.int32)


MAX_TAG_CHARS = 128  # characters of one tag (PutMeta.tags, invalidate_tag)


def check_tag(tag: object, what: str = "tag") -> str:
    """``tag`` if it is 1-128 printable ASCII characters without spaces (a
    store keeps tags as keys); else TypeError / ValueError naming ``what``."""
    if type(tag) is not str:
        raise TypeError(f"{what} must be a str, got {type(tag).__name__}")
    printable = tag.isascii() and tag.isprintable() and " " not in tag
    if not 0 < len(tag) <= MAX_TAG_CHARS or not printable:
        shown = tag if len(tag) <= 40 else tag[:40] + "..."
        raise ValueError(
            f"{what} must be 1-{MAX_TAG_CHARS} printable ASCII characters without spaces, "
            f"got {shown!r} ({len(tag)} characters)"
        )
    return tag


def check_retention(meta: PutMeta | None) -> None:
    """Refuse a ``PutMeta`` whose ``expires_at`` is not None or a finite
    number of seconds, or whose ``tags`` is not a tuple of valid tags."""
    if meta is None:
        return
    deadline = meta.expires_at
    if deadline is not None and (
        not isinstance(deadline, (int, float))
        or isinstance(deadline, bool)
        or not math.isfinite(deadline)
    ):
        raise ValueError(
            f"meta.expires_at must be None or a finite number of seconds, got {deadline!r}"
        )
    if type(meta.tags) is not tuple:
        raise TypeError(f"meta.tags must be a tuple of str, got {type(meta.tags).__name__}")
    for i, tag in enumerate(meta.tags):
        check_tag(tag, f"meta.tags[{i}]")

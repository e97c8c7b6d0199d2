"""The cost of sealing records, in CPU time: what ``bench storage`` and
``bench pool`` add to their wall-clock figures.

On a shared machine wall-clock rates measure the scheduler as much as the
code; the CPU time of the thread that frames or verifies a record does not.
``codec_cpu`` frames ``pages`` records from host pages and verifies them
back into host pages, in the clear (``record.py``: a copy and the KV
checksum) and sealed (``crypt/sealed.py``: one AES-256-GCM pass), each timed
by the thread's CPU clock, best of ``repeat`` rounds, rounds alternating::

    clear_write / sealed_write   encode_into: host page -> record buffer
    clear_read / sealed_read     read_into: record -> host page, verified
    gcm_only                     AESGCM.encrypt_into of the page alone
    gcm_and_checksum             the same plus the KV checksum of clear records:
                                 what a sealed record would cost if it kept
                                 the checksum (it does not: the tag covers it)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from radixcache.offload.storage import ModelFingerprint, kv_checksum
from radixcache.offload.storage.crypt import PLAIN, Framing
from radixcache.offload.storage.crypt.keys import KeyRing
from radixcache.offload.storage.crypt.sealed import SealedRecords


def codec_cpu(
    fingerprint: ModelFingerprint,
    pages: npt.NDArray[np.uint8],
    tokens: npt.NDArray[np.int32],
    repeat: int,
) -> dict[str, Any]:
    """CPU GB/s of each figure over ``pages`` ([n, page_bytes]) and the
    sealed / clear ratios (see the module docstring)."""
    n, page_bytes = pages.shape
    sealed = SealedRecords(KeyRing([os.urandom(32)], "a random benchmark key"), fingerprint)
    framings: dict[str, Framing] = {"clear": PLAIN, "sealed": sealed.framing(b"bench-tenant")}
    keys = [fingerprint.digest() + i.to_bytes(16, "little") for i in range(n)]
    tag = bytes(16)
    records = {
        name: [bytearray(f.record_size(len(keys[0]), 0, tokens.shape[1], page_bytes))
               for _ in range(n)]
        for name, f in framings.items()
    }
    dst = np.empty_like(pages)
    aead, nonce, sink = AESGCM(os.urandom(32)), os.urandom(12), bytearray(page_bytes + 16)

    def write(name: str) -> Callable[[], None]:
        def run() -> None:
            f, out = framings[name], records[name]
            for i in range(n):
                f.encode_into(out[i], key=keys[i], ns_tag=tag, tokens=tokens[i], kv=pages[i],
                              seq=i)
        return run

    def read(name: str) -> Callable[[], None]:
        def run() -> None:
            f, values = framings[name], records[name]
            for i in range(n):
                assert f.read_into(memoryview(values[i]),
                                   key=keys[i], ns_tag=tag, tokens=tokens[i], dst=dst[i])
        return run

    def gcm_only() -> None:
        for i in range(n):
            aead.encrypt_into(nonce, pages[i], None, sink)

    def gcm_and_checksum() -> None:
        for i in range(n):
            aead.encrypt_into(nonce, pages[i], None, sink)
            kv_checksum(pages[i])

    figures = {
        "clear_write": write("clear"), "sealed_write": write("sealed"),
        "clear_read": read("clear"), "sealed_read": read("sealed"), "gcm_only": gcm_only,
        "gcm_and_checksum": gcm_and_checksum,
    }
    best = dict.fromkeys(figures, float("inf"))
    for _ in range(repeat + 1):  # round 0 warms up (and writes the records the reads read)
        for name, run in figures.items():
            start = time.thread_time()
            run()
            best[name] = min(best[name], time.thread_time() - start)
    assert np.array_equal(dst, pages), "sealed records read back other bytes"
    nbytes = n * page_bytes
    rate = {k: round(nbytes / max(v, 1e-9) / 1e9, 3) for k, v in best.items()}
    return {
        "cpu_gb_per_s": rate,
        "sealed_write_vs_clear": round(rate["sealed_write"] / rate["clear_write"], 3),
        "sealed_read_vs_clear": round(rate["sealed_read"] / rate["clear_read"], 3),
    }

"""The LMDB read path: a small thread pool that reads, verifies and copies pages.

    get(keys) --> pool thread:
                    one read txn for the batch (MVCC: never waits for the writer)
                    for each key, in order:
                        value = txn.get(key)          zero-copy view of the map
                        verify layout and tokens, copy KV into the host page
                        (numpy, straight from the map: no bytes object),
                        checksum the copy             offload/record.py
                                                      (v3: offload/kv_checksum.py)
                    stop at the first miss or failed check
                  then: touch the hits (recency), queue the deletion of a
                  failed record on the writer, count, finish the ticket

A ticket always finishes: an LMDB error fails it, nothing escapes the thread.
Read transactions hold the ``MapGate`` shared, so the writer never replaces
the memory map under a page being copied.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import lmdb
import numpy as np
import numpy.typing as npt

from radixcache.offload import record as rec
from radixcache.offload.lmdb_index import RecencyIndex
from radixcache.offload.lmdb_space import MapGate
from radixcache.offload.lmdb_writer import DeleteJob, LmdbWriter
from radixcache.offload.storage import Counters, HostPages, PageBuffer, StorageError, TokenPages
from radixcache.transfer.ticket import FutureTicket

log = logging.getLogger(__name__)


class LmdbReader:
    """Serves ``get`` on ``num_readers`` threads."""

    def __init__(
        self,
        *,
        env: lmdb.Environment,
        path: str,
        pages: lmdb._Database,
        gate: MapGate,
        index: RecencyIndex,
        counters: Counters,
        writer: LmdbWriter,
        num_readers: int,
    ) -> None:
        self._env = env
        self._path = path  # for messages
        self._pages = pages  # record key -> record
        self._gate = gate  # held shared by every read transaction
        self._index = index  # recency: hits are touched
        self._counters = counters
        self._writer = writer  # deletes records that fail verification
        self._pool = ThreadPoolExecutor(num_readers, thread_name_prefix="radixcache-lmdb-read")

    def submit(
        self,
        rkeys: list[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        ns_tag: bytes | None,
        ticket: FutureTicket,
    ) -> None:
        """Read ``rkeys`` into ``host_pages`` on a pool thread; ``ticket`` gets the count."""
        self._pool.submit(self._read, rkeys, tokens, host, host_pages, ns_tag, ticket)

    def close(self) -> None:
        """Finish every submitted read, then stop the threads."""
        self._pool.shutdown(wait=True)

    def _read(
        self,
        rkeys: list[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        ns_tag: bytes | None,
        ticket: FutureTicket,
    ) -> None:
        try:
            served, corrupt = self._read_pages(rkeys, tokens, host.as_bytes(), host_pages, ns_tag)
            if served:
                self._index.touch(rkeys[:served])
            if corrupt is not None:  # its removal is published once the delete commits
                self._writer.submit(DeleteJob([corrupt], None))
            self._counters.add(hits=served, misses=len(rkeys) - served, corrupt=corrupt is not None)
        except Exception as exc:  # any LMDB error fails the ticket, not the thread
            self._counters.add(failed_ops=1)
            ticket.fail(StorageError(f"LMDB read from {self._path!r} failed: {exc!r}"))
            return
        ticket.finish(served)

    def _read_pages(
        self,
        rkeys: list[bytes],
        tokens: TokenPages | None,
        host_bytes: npt.NDArray[np.uint8],
        host_pages: HostPages,
        ns_tag: bytes | None,
    ) -> tuple[int, bytes | None]:
        """Returns (leading pages served, key of a record that failed its checks)."""
        with self._gate.reading(), self._env.begin(db=self._pages, buffers=True) as txn:
            for i, rkey in enumerate(rkeys):
                value = txn.get(rkey)
                if value is None:
                    return i, None
                ok = rec.read_into(
                    value,
                    key=rkey,
                    ns_tag=ns_tag,
                    tokens=None if tokens is None else tokens[i],
                    dst=host_bytes[host_pages[i]],
                )
                if not ok:
                    log.warning(
                        "storage %s: record %s failed verification; deleting it",
                        self._path,
                        rkey.hex(),
                    )
                    return i, rkey
        return len(rkeys), None

"""The pool's read path: reader threads that fetch, verify and copy pages.

    get --> reader pool (num_readers): per chunk of batch_pages keys, one
            pipelined GET (the next chunk's GET runs meanwhile on the fetch
            pool); on one server the KV bytes are received straight into the
            host pages (offload/valkey_bulk.py), on a cluster copied there
            from redis-py's replies; verify each record; stop at the first
            miss or failed check

A ticket always finishes: a pool that is down or times out ends the read with
the pages served so far (a miss for the rest), counted; a record that fails
verification is deleted (through the writer) and counted as corrupt.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import Counters, HostPages, PageBuffer, TokenPages
from radixcache.offload.valkey_link import PoolLink, PoolUnavailable
from radixcache.offload.valkey_records import verify_in_place, verify_record
from radixcache.offload.valkey_writer import DeleteJob, PoolWriter
from radixcache.transfer.ticket import FutureTicket

log = logging.getLogger(__name__)


class PoolReader:
    """Serves ``get`` on ``num_readers`` threads."""

    def __init__(
        self,
        *,
        link: PoolLink,
        counters: Counters,
        writer: PoolWriter,
        batch_pages: int,
        num_readers: int,
        key_cut: int,
        direct: bool,
    ) -> None:
        self._cut = key_cut  # pool key[key_cut:] is the record key
        self._direct = direct  # values straight into host pages (one server, not a cluster)
        self._link = link
        self._counters = counters
        self._writer = writer  # deletes records that fail verification
        self._batch = batch_pages
        self._pool = ThreadPoolExecutor(num_readers, thread_name_prefix="radixcache-pool-read")
        self._fetcher = ThreadPoolExecutor(num_readers, thread_name_prefix="radixcache-pool-fetch")
        self.unavailable = 0  # reads cut short because the pool was down

    def submit(
        self,
        rkeys: list[bytes],
        pkeys: list[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        ns_tag: bytes | None,
        ticket: FutureTicket,
    ) -> None:
        self._pool.submit(self._read, rkeys, pkeys, tokens, host, host_pages, ns_tag, ticket)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._fetcher.shutdown(wait=True)

    def _read(
        self,
        rkeys: list[bytes],
        pkeys: list[bytes],
        tokens: TokenPages | None,
        host: PageBuffer,
        host_pages: HostPages,
        ns_tag: bytes | None,
        ticket: FutureTicket,
    ) -> None:
        served = 0
        try:
            served, corrupt = self._read_pages(rkeys, tokens, host.as_bytes(), host_pages, ns_tag)
            if corrupt is not None:
                log.warning("pool record %s failed verification; deleting it", rkeys[corrupt].hex())
                self._writer.submit(DeleteJob([rkeys[corrupt]], [pkeys[corrupt]], None))
            self._counters.add(corrupt=corrupt is not None)
        except _Partial as exc:
            served = exc.served  # those pages were read and verified
            self.unavailable += 1
            self._counters.add(failed_ops=1)
        except Exception:  # a bug must not hang the ticket: a miss, logged
            log.exception("pool read failed")
            self._counters.add(failed_ops=1)
        self._counters.add(hits=served, misses=len(rkeys) - served)
        ticket.finish(served)

    def _read_pages(
        self,
        rkeys: list[bytes],
        tokens: TokenPages | None,
        host_bytes: npt.NDArray[np.uint8],
        host_pages: HostPages,
        ns_tag: bytes | None,
    ) -> tuple[int, int | None]:
        """Returns (leading pages served, index of a record that failed its checks).

        Raises ``_Partial`` (with the pages served so far) when the pool is
        lost. Chunk k+1 is fetched (on the fetch pool) while chunk k is
        verified and copied; after a miss, at most one prefetched chunk is
        dropped unread.
        """
        starts = list(range(0, len(rkeys), self._batch))
        fetch = partial(self._fetch_async, rkeys, host_bytes, host_pages)
        nxt = fetch(starts[0], len(starts) > 1)
        for k, start in enumerate(starts):
            try:
                values = nxt.result()
            except PoolUnavailable as exc:
                raise _Partial(start) from exc
            if k + 1 < len(starts):
                nxt = fetch(starts[k + 1], True)
            for j, value in enumerate(values):
                i = start + j
                if value is None:  # gone (evicted, expired)
                    return i, None
                dst = host_bytes[host_pages[i]]
                key = rkeys[i][self._cut :]
                tok = None if tokens is None else tokens[i]
                if self._direct:  # the KV bytes are in the host page already
                    ok = verify_in_place(value, dst, key=key, ns_tag=ns_tag, tokens=tok)
                else:
                    ok = isinstance(value, bytes) and verify_record(
                        value, key=key, ns_tag=ns_tag, tokens=tok, dst=dst
                    )
                if not ok:
                    return i, i
        return len(rkeys), None

    def _fetch_async(
        self,
        rkeys: list[bytes],
        host_bytes: npt.NDArray[np.uint8],
        host_pages: HostPages,
        start: int,
        background: bool,
    ) -> Future[list[Any]]:
        """GET one chunk: on the fetch pool, or here when nothing can overlap it.
        On one server the values' KV bytes go straight into their host pages
        (offload/valkey_bulk.py) and the answers are the records' heads."""
        chunk = rkeys[start : start + self._batch]

        def fetch() -> list[Any]:
            if self._direct:
                pages = host_pages[start : start + len(chunk)]
                return self._link.get_into(chunk, [host_bytes[p].data for p in pages])
            return self._link.run(lambda pipe: [pipe.get(k) for k in chunk])

        if background:
            return self._fetcher.submit(fetch)
        done: Future[list[Any]] = Future()
        try:
            done.set_result(fetch())
        except PoolUnavailable as exc:
            done.set_exception(exc)
        return done


class _Partial(PoolUnavailable):
    """The pool went away after ``served`` leading pages were read."""

    def __init__(self, served: int) -> None:
        super().__init__(f"pool lost after {served} pages")
        self.served = served

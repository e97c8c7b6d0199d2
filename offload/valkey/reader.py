"""The pool's read transport: pipelined GETs, the next chunk fetched while one is verified.

    get --> PageReader (offload/storage/reader.py), on a pool thread:
              _values: per chunk of batch_pages keys, one pipelined GET (the
              next chunk's GET runs meanwhile on the fetch pool); the base
              verifies each value and stops at the first miss or failed check

Two readers, by where the KV bytes land:

* ``PoolReader`` (a cluster): redis-py's replies are the records; the base
  verifies each and copies its KV bytes into the host page.
* ``DirectPoolReader`` (one server): the KV bytes are received straight into
  the host pages (offload/valkey/bulk.py); the values are the records'
  heads, verified together with the bytes already in place.

A pool that is down or times out raises ``PoolUnavailable`` here, which the
base turns into a short read (the pages served so far, a miss for the rest,
counted); after a miss, at most one prefetched chunk is dropped unread.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from radixcache.offload.storage import JobWriter, PageReader, ReadJob, StoredValue
from radixcache.offload.storage.reader import Page
from radixcache.offload.valkey.link import PoolLink, PoolUnavailable

log = logging.getLogger(__name__)


class PoolReader(PageReader):
    """Serves ``get`` on ``num_readers`` threads from a pool (see the module docstring)."""

    def __init__(self, link: PoolLink, writer: JobWriter) -> None:
        config = link.config
        super().__init__(writer, num_readers=config.num_readers, thread_name="radixcache-pool-read")
        self._key_prefix = config.key_prefix  # pool key = key prefix + record key
        self._link = link
        self._batch = config.batch_pages  # keys per pipelined GET
        self._fetcher = ThreadPoolExecutor(
            config.num_readers, thread_name_prefix="radixcache-pool-fetch"
        )

    def close(self) -> None:
        super().close()
        self._fetcher.shutdown(wait=True)

    def _read_failed(self, job: ReadJob, exc: Exception) -> None:
        """A bug must not hang the ticket: a miss, logged."""
        log.exception("pool read failed", exc_info=exc)
        self._counters.add(misses=len(job.keys))
        job.ticket.finish(0)

    def _values(
        self, job: ReadJob, host_bytes: npt.NDArray[np.uint8]
    ) -> Generator[StoredValue, None, None]:
        """The values of ``job.keys``, chunk by chunk: chunk k+1 is fetched (on
        the fetch pool) while chunk k is verified and copied."""
        pkeys = [self._key_prefix + k for k in job.keys]
        batch = self._batch

        def chunk(s: int) -> tuple[list[bytes], list[Page]]:  # keys and host pages from s
            return pkeys[s : s + batch], [host_bytes[p] for p in job.host_pages[s : s + batch]]

        starts = range(0, len(pkeys), batch)
        nxt = self._fetch_async(*chunk(starts[0]), background=len(starts) > 1)
        for k in range(len(starts)):
            values = nxt.result()  # PoolUnavailable: the base's short read
            if k + 1 < len(starts):
                nxt = self._fetch_async(*chunk(starts[k + 1]), background=True)
            yield from values

    def _fetch(self, keys: list[bytes], dsts: list[Page]) -> list[Any]:
        """GET ``keys`` (host pages ``dsts``) in one pipeline; the replies are the records."""
        return self._link.run(lambda pipe: [pipe.get(k) for k in keys])

    def _fetch_async(
        self, keys: list[bytes], dsts: list[Page], *, background: bool
    ) -> Future[list[Any]]:
        """``_fetch`` one chunk: on the fetch pool, or here when nothing can overlap it."""
        fetch = partial(self._fetch, keys, dsts)
        if background:
            return self._fetcher.submit(fetch)
        done: Future[list[Any]] = Future()
        try:
            done.set_result(fetch())
        except PoolUnavailable as exc:
            done.set_exception(exc)
        return done


class DirectPoolReader(PoolReader):
    """A ``PoolReader`` on one server: the KV bytes go straight into the host
    pages (offload/valkey/bulk.py) and the replies are the records' heads."""

    def _fetch(self, keys: list[bytes], dsts: list[Page]) -> list[Any]:
        """GET ``keys`` in one pipeline, each value's KV bytes received into its
        host page in ``dsts``; the replies are the records' heads."""
        return self._link.get_into(keys, [dst.data for dst in dsts])

    def _verify(self, value: StoredValue, dst: Page, job: ReadJob, i: int) -> bool:
        """Verify a record read as its head ``value`` plus its last bytes,
        already in ``dst`` (the job's framing: in the clear or sealed)."""
        assert value is not None, "a missing record is a miss, not a value to verify"
        return job.framing.verify_parts(
            value, dst, key=job.keys[i], ns_tag=job.ns_tag, tokens=job.token_row(i)
        )

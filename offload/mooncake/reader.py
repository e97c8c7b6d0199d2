"""The pool's read transport: zero-copy batch gets, checked against the namespace markers.

    get --> PageReader (offload/storage/reader.py), on a reader thread:
              _values, per chunk of batch_pages keys:
                1. batch_get_into_multi_buffers: each record lands in two
                   registered buffers, its head in this thread's staging
                   area and its KV bytes straight in the host page
                2. a size other than the one asked for: one get_size learns
                   the head size, the keys are read again with it
                3. batch_is_exist of the pages' namespace markers
              the base then verifies each record in place (verify_parts) and
              stops at the first miss or failed check

A record's head has a length that depends on its key and on the namespace's
info bytes, which a reader does not know before reading; the KV bytes must
land in the host page, so the split has to be right. The reader remembers
the last head size seen per (key length, tokens per page) and asks for
exactly that (Mooncake refuses a destination of another total size:
INVALID_PARAMS or TRANSFER_FAIL, writing nothing); a refusal costs one
``get_size`` and one more read, once per namespace of another info length.

What a result means (anything but the exact size asked for is never read)::

    the size asked for     the record's head and KV bytes: verified next
    OBJECT_NOT_FOUND       a miss (never stored, evicted, removed, segment gone)
    LEASE_EXPIRED          a miss: the read outlived its lease, the bytes may
                           have been overwritten meanwhile
    a size no record of this key can have
                           not a record of this page: counted corrupt, deleted
    RPC_FAIL               the master is unreachable: the read ends short
    anything else          a miss

Markers (offload/mooncake/keys.py): a record is served only while its
namespace marker exists; one whose marker is gone was forgotten (by any
engine) and is a miss, and its deletion is queued here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator

import numpy as np
import numpy.typing as npt

from radixcache.offload.mooncake.keys import PoolKeys
from radixcache.offload.mooncake.link import (
    INVALID_PARAMS,
    OBJECT_NOT_FOUND,
    RPC_FAIL,
    TRANSFER_FAIL,
    MooncakeLink,
    PoolUnavailable,
)
from radixcache.offload.storage import DeleteJob, JobWriter, PageReader, ReadJob, StoredValue
from radixcache.offload.storage import record as rec
from radixcache.offload.storage.reader import Page

log = logging.getLogger(__name__)

_MISMATCH = (INVALID_PARAMS, TRANSFER_FAIL)  # possibly a wrong split: its size is asked for
_BAD_SIZE = 1  # a result code of ours: the object has a size no record of its key can have
_NOT_A_RECORD = memoryview(b"")  # a value that fails verification: counted corrupt, deleted


class _Head(bytes):
    """A record's head, read apart from its KV bytes (which are in the host page)."""


class MooncakeReader(PageReader):
    """Serves ``get`` on ``num_readers`` threads (see the module docstring)."""

    def __init__(self, link: MooncakeLink, keys: PoolKeys, writer: JobWriter, page_size: int) -> None:
        config = link.config
        super().__init__(writer, num_readers=config.num_readers, thread_name="radixcache-mooncake-read")
        self._link = link
        self._keys = keys
        self._batch = config.batch_pages
        self._head_cap = rec.head_size(rec.MAX_KEY_BYTES, rec.MAX_INFO_BYTES, page_size)
        self._local = threading.local()  # per reader thread: its registered head staging
        self._heads: dict[tuple[int, int], int] = {}  # (key length, tokens) -> last head size seen
        self.size_lookups = 0  # get_size calls made to learn a head size
        self.orphans = 0  # records found without their namespace marker (deleted)

    def _read_failed(self, job: ReadJob, exc: Exception) -> None:
        """A bug must not hang the ticket: a miss, logged."""
        log.error("pool read failed", exc_info=exc)
        self._counters.add(misses=len(job.keys))
        job.ticket.finish(0)

    def _verify(self, value: StoredValue, dst: Page, job: ReadJob, i: int) -> bool:
        if isinstance(value, _Head):  # the KV bytes are in ``dst`` already
            return rec.verify_parts(value, dst, key=job.keys[i], ns_tag=job.ns_tag, tokens=job.token_row(i))
        return False  # _NOT_A_RECORD

    def _values(
        self, job: ReadJob, host_bytes: npt.NDArray[np.uint8]
    ) -> Generator[StoredValue, None, None]:
        """The values of ``job.keys``, chunk by chunk, up to the first miss."""
        if not host_bytes.flags.c_contiguous:
            raise ValueError("the host buffer must be one contiguous block of pages")
        self._link.register(host_bytes)
        names = self._keys.records(job.keys)
        for start in range(0, len(names), self._batch):
            end = min(start + self._batch, len(names))
            try:
                values = self._chunk(job, names, start, end, host_bytes)
            except _Cut as cut:  # served what came before, then the base's short read
                yield from cut.values
                raise PoolUnavailable(str(cut)) from None
            yield from values
            if len(values) < end - start or values[-1] is None or values[-1] is _NOT_A_RECORD:
                return

    # -- one chunk ---------------------------------------------------------------------
    def _chunk(
        self, job: ReadJob, names: list[str], start: int, end: int, host_bytes: npt.NDArray[np.uint8]
    ) -> list[StoredValue]:
        """The values of keys ``start:end``, up to and including the first miss
        (None) or non-record. Raises ``_Cut`` when the master is lost."""
        n = end - start
        staging = self._staging(n)
        base, page, cap = staging.ctypes.data, host_bytes.shape[1], self._head_cap
        pages = host_bytes.ctypes.data + job.host_pages[start:end].astype(np.int64) * page
        tokens = 0 if job.tokens is None else int(job.tokens.shape[1])
        heads = [self._heads.get((len(job.keys[start + j]), tokens)) or
                 rec.head_size(len(job.keys[start + j]), 0, tokens) for j in range(n)]  # fmt: skip
        chunk = names[start:end]

        def read(idx: list[int]) -> list[int]:
            ptrs = [[base + j * cap, int(pages[j])] for j in idx]
            sizes = [[heads[j], page] for j in idx]
            got: list[int] = self._link.run(
                lambda store: store.batch_get_into_multi_buffers([chunk[j] for j in idx], ptrs, sizes)
            )
            return got

        rcs = read(list(range(n)))
        refused = [j for j in range(n) if rcs[j] in _MISMATCH]
        if refused:
            again = self._learn_heads(job, chunk, start, refused, heads, page, tokens, rcs)
            for j, rc in zip(again, read(again) if again else []):
                rcs[j] = rc
        values: list[StoredValue] = []
        lost = False
        for j in range(n):
            rc = rcs[j]
            if rc == heads[j] + page:
                values.append(_Head(staging[j * cap : j * cap + heads[j]].tobytes()))
                continue
            if rc == _BAD_SIZE:
                values.append(_NOT_A_RECORD)
            elif rc == RPC_FAIL:
                lost = True
            else:
                if rc != OBJECT_NOT_FOUND:
                    log.debug("pool read of %s: %d (a miss)", chunk[j], rc)
                values.append(None)
            break
        values = self._check_markers(job, start, values, host_bytes)
        if lost:
            self._link.mark_down("a read found the master unreachable")
            raise _Cut(values)
        return values

    def _learn_heads(
        self, job: ReadJob, chunk: list[str], start: int, refused: list[int],
        heads: list[int], page: int, tokens: int, rcs: list[int],
    ) -> list[int]:  # fmt: skip
        """The keys ``refused`` (a size the store would not fill): learn their
        head sizes (one get_size per key length; the rest of the chunk is
        alike) and return those worth reading again with ``heads[j]`` updated.
        The others get their final code in ``rcs``: OBJECT_NOT_FOUND, RPC_FAIL,
        TRANSFER_FAIL (the size was right: the transfer failed), or
        ``_BAD_SIZE`` (no record of this key has that size)."""
        learnt: dict[int, int] = {}  # key length -> head size, from this chunk's lookups
        again: list[int] = []
        for j in refused:
            klen = len(job.keys[start + j])
            head = learnt.get(klen)
            if head is None:
                size: int = self._link.run(lambda store: store.get_size(chunk[j]))
                self.size_lookups += 1
                if size < 0:
                    rcs[j] = RPC_FAIL if size == RPC_FAIL else OBJECT_NOT_FOUND
                    continue
                head = size - page
                if not rec.head_size(klen, 0, tokens) <= head <= rec.head_size(klen, rec.MAX_INFO_BYTES, tokens):
                    rcs[j] = _BAD_SIZE
                    continue
                learnt[klen] = head
                self._heads[(klen, tokens)] = head
            if head == heads[j]:
                rcs[j] = TRANSFER_FAIL
                continue
            heads[j] = head
            again.append(j)
        return again

    def _check_markers(
        self, job: ReadJob, start: int, values: list[StoredValue], host_bytes: npt.NDArray[np.uint8]
    ) -> list[StoredValue]:
        """Cut ``values`` at the first record whose namespace marker is gone:
        a record that passes every check was forgotten (a miss, its deletion
        queued here); one that fails them is left for the base to count as
        corrupt (a foreign or damaged record names a namespace of no marker).
        Raises ``_Cut`` when the master is lost."""
        known = [(j, rec.read_namespace_tag(v)) for j, v in enumerate(values) if isinstance(v, _Head)]
        known = [(j, t) for j, t in known if t is not None]
        if not known:
            return values
        keys = [job.keys[start + j] for j, _t in known]
        markers = self._keys.markers([t for _j, t in known if t is not None], keys)
        exist: list[int] = self._link.run(lambda store: store.batch_is_exist(markers))
        for (j, _t), found in zip(known, exist):
            if found == 1:
                continue
            if found == RPC_FAIL:
                self._link.mark_down("a marker check found the master unreachable")
                raise _Cut(values[:j])
            dst = host_bytes[job.host_pages[start + j]]
            if not self._verify(values[j], dst, job, start + j):
                return values[: j + 1]  # not a record of this page: corrupt, deleted by the base
            self.orphans += 1
            self._writer.submit(DeleteJob([job.keys[start + j]], None))
            return [*values[:j], None]
        return values

    def _staging(self, n: int) -> npt.NDArray[np.uint8]:
        """This thread's registered staging area for ``n`` heads."""
        staging: npt.NDArray[np.uint8] | None = getattr(self._local, "staging", None)
        if staging is None or staging.size < n * self._head_cap:
            staging = np.zeros(max(n, self._batch) * self._head_cap, dtype=np.uint8)
            self._local.staging = staging
        self._link.register(staging)
        return staging


class _Cut(PoolUnavailable):
    """The master was lost after ``values`` (to be served first)."""

    def __init__(self, values: list[StoredValue]) -> None:
        super().__init__("the master became unreachable during a read")
        self.values = values

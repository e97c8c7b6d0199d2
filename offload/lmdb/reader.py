"""The LMDB read transport: stored values straight from the memory map.

    get(keys) --> PageReader (offload/storage/reader.py), on a pool thread:
                    _values: one read txn for the whole read (MVCC: never
                    waits for the writer), each key's value as a zero-copy
                    view of the map; the base verifies it and copies the KV
                    bytes into the host page (numpy, straight from the map:
                    no bytes object), then checksums the copy
                  _served: the hits are touched in the recency index

A record past its retention deadline (offload/lmdb/retention.py) is a miss,
like a record not stored: the read stops there, and asks the writer for a
sweep, which removes it (and announces the removal).

A record whose KV bytes lie in the slot file (offload/lmdb/slots.py) is read
in two parts: its lead from the map, its tail straight from the slot into
the host page (copied out of the mapped slot file and summed in one pass,
as from LMDB's map), verified with the lead. The read
registers with the slot file for as long as its transaction lasts, so no
slot its snapshot names is written meanwhile.

A thread that waits on a read's ticket without a timeout (an engine's
blocking get, the tiers' drain) runs queued reads itself meanwhile
(``PageReader.helping``): it starts at once instead of waking a reader,
and the reads run on one thread more.

A record that cannot be authenticated (encryption at rest) is deleted like
a corrupt one: the store is this engine's alone (``delete_unreadable``).

The read transaction and the ``MapGate`` are held exactly while the base
uses the values: the generator is closed at the first miss or failed check,
so the writer never replaces the memory map under a page being copied. An
LMDB error fails the ticket (the base's default).
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import nullcontext

import numpy as np
import numpy.typing as npt

from radixcache.offload.lmdb.env import LmdbEnv
from radixcache.offload.lmdb.slots import unwrap
from radixcache.offload.lmdb.writer import LmdbWriter
from radixcache.offload.storage import PageReader, ReadJob, StoredValue
from radixcache.offload.storage.reader import Page
from radixcache.offload.storage.contract import Clock


class LmdbReader(PageReader):
    """Serves ``get`` on ``num_readers`` threads, from one environment."""

    delete_unreadable = True  # one process owns the store: nobody else's records
    helping = True  # a read is copies out of the map: a waiting thread may do it

    def __init__(
        self, store: LmdbEnv, writer: LmdbWriter, clock: Clock, *, num_readers: int
    ) -> None:
        super().__init__(writer, num_readers=num_readers, thread_name="radixcache-lmdb-read")
        self._env = store.env
        self._pages = store.pages  # record key -> record
        self._gate = store.gate  # held shared by every read transaction
        self._index = store.index  # recency: hits are touched
        self._deadlines = store.deadlines  # retention: expired records are misses
        self._clock = clock  # what deadlines are compared with
        self._lmdb_writer = writer  # sweeps expired records
        self._slots = store.slots  # the records' KV bytes outside the map (may be None)

    def _values(
        self, job: ReadJob, host_bytes: npt.NDArray[np.uint8]
    ) -> Generator[StoredValue, None, None]:
        # The deadlines are looked up before the read transaction begins: a
        # record the writer removed since (and whose deadline it forgot) is
        # then not in the transaction's snapshot either.
        at = self._deadlines.at
        dated = [at(rkey) for rkey in job.keys] if len(self._deadlines) else None
        now: float | None = None  # the clock, read once, when a record has a deadline
        slots = nullcontext() if self._slots is None else self._slots.reading()
        with slots, self._gate.reading(), self._env.begin(db=self._pages, buffers=True) as txn:
            for i, rkey in enumerate(job.keys):
                deadline = None if dated is None else dated[i]
                if deadline is not None:
                    now = self._clock() if now is None else now
                    if deadline <= now:
                        self._lmdb_writer.ask_sweep()
                        yield None  # a miss: the read stops here
                        return
                yield txn.get(rkey)

    def _verify(self, value: StoredValue, dst: Page, job: ReadJob, i: int) -> bool:
        parts = None if value is None else unwrap(value)
        if parts is None:
            return super()._verify(value, dst, job, i)
        lead, slot, tail = parts
        view = None if self._slots is None else self._slots.view(slot, tail)
        if view is None:
            return False  # larger than a slot, or the slot file ends short
        return job.framing.read_split_into(
            lead, view, key=job.keys[i], ns_tag=job.ns_tag, tokens=job.token_row(i), dst=dst
        )

    def _served(self, keys: list[bytes]) -> None:
        self._index.touch(keys)

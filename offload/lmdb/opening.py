"""Opening the LMDB store so that a serving engine always comes up.

A store may be impossible to open: its B-tree pages are corrupted
(``MDB_CORRUPTED``, ``MDB_PAGE_NOTFOUND``, ...), its directory became
unwritable, or another process holds it. With ``on_open_error="strict"``
the engine refuses to start (``StorageOpenError``). With the default
``"recover"`` it starts anyway and says so in one log line and in
``StorageOpening.state`` (a metric):

* a damaged store is moved aside (renamed ``<path>.damaged-<UTC time>``,
  never deleted: it may be inspected or salvaged) and a fresh store is opened
  in its place: ``state == "recovered"``;
* anything else (an unwritable directory, a store held by another process,
  or a fresh store that cannot be opened either) disables the storage tier:
  ``NullStorage``, ``state == "disabled"``.
"""

from __future__ import annotations

import logging
import os
import time

import lmdb

from radixcache.offload.lmdb.config import StorageConfig
from radixcache.offload.lmdb.storage import LmdbStorage
from radixcache.offload.storage import (
    ModelFingerprint,
    NullStorage,
    StorageOpenError,
    StorageOpening,
)
from radixcache.transfer.layout import KVSpec

log = logging.getLogger(__name__)

# LMDB errors that mean the files themselves are damaged (not the directory).
DAMAGE = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.BadTxnError,
    lmdb.PageFullError,
)

def _damaged(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, DAMAGE) or isinstance(exc, DAMAGE)


def open_lmdb_storage(
    config: StorageConfig, spec: KVSpec, fingerprint: ModelFingerprint
) -> StorageOpening:
    """Open the store of ``config`` (see the module docstring for what happens
    when it cannot be opened). Raises StorageOpenError only in strict mode."""
    try:
        return StorageOpening(LmdbStorage(config, spec, fingerprint), "opened")
    except StorageOpenError as exc:
        if config.on_open_error == "strict":
            raise
        error = str(exc)
        path = os.path.abspath(os.fspath(config.path))
        if _damaged(exc):
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            moved = f"{path}.damaged-{stamp}"
            n = 1
            while os.path.exists(moved):
                moved = f"{path}.damaged-{stamp}-{n}"
                n += 1
            try:
                os.rename(path, moved)
                fresh = LmdbStorage(config, spec, fingerprint)
            except (OSError, StorageOpenError) as again:
                log.warning(
                    "storage tier disabled: the store in %r is damaged (%s) and no fresh "
                    "store could replace it (%s)",
                    path,
                    error,
                    again,
                )
                return StorageOpening(NullStorage(), "disabled", None, error)
            log.warning(
                "storage: the store in %r is damaged (%s); moved it to %r and started a "
                "fresh one",
                path,
                error,
                moved,
            )
            return StorageOpening(fresh, "recovered", moved, error)
        log.warning("storage tier disabled: %s", error)
        return StorageOpening(NullStorage(), "disabled", None, error)

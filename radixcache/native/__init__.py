"""The compiled hot loops of the request path, and the switch between them
and the pure-Python modules.

``_core.pyx`` (Cython) holds C versions of the loops a request spends its
time in: the tree's node (a C struct), the walk of ``match``, locks, token
comparison and copy, page-id concatenation, event block ids. Each has a
pure-Python reference where it is used (listed in ``_core.pyx``); those
references are the specification, and the tests hold the compiled loops to
them (tests/radixcache/native).

The extension is built at install time when a C compiler is there
(``setup.py``: an optional build, a failure leaves the pure-Python modules
in charge). At import:

* ``RADIXCACHE_PURE=1`` selects the pure-Python modules even when the
  extension is built (CI runs the suite both ways);
* ``RADIXCACHE_REQUIRE_COMPILED=1`` makes a missing or broken extension an
  ImportError instead of a silent fall-back (CI's compiled leg sets it).

``compiled`` is the extension module, or None on the pure path; ``COMPILED``
says which path this process runs; ``REASON`` why it is not compiled.

The storage layer (``radixcache.offload``) imports nothing above it; the
engine modules that open stores hand it the core's copy-and-checksum pass
(``hand_to_storage``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_ENV = "RADIXCACHE_PURE"
REQUIRE_ENV = "RADIXCACHE_REQUIRE_COMPILED"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _load() -> tuple[ModuleType | None, str]:
    if _flag(PURE_ENV):
        if _flag(REQUIRE_ENV):
            raise ImportError(f"{PURE_ENV} and {REQUIRE_ENV} are both set")
        return None, f"{PURE_ENV} is set"
    try:
        core = importlib.import_module("radixcache.native._core")
    except ImportError as exc:
        if _flag(REQUIRE_ENV):
            raise ImportError(f"{REQUIRE_ENV} is set but the compiled core does not load: {exc}") from exc
        return None, f"the compiled core is not built or does not load ({exc})"
    return core, ""


compiled, REASON = _load()
COMPILED = compiled is not None


def hand_to_storage() -> None:
    """Storage records' KV bytes are copied and summed in one C pass from now
    on, and summed where they lie in another
    (``radixcache.offload.storage.kv_checksum.use_copy_sums`` and
    ``use_sums``); on the pure path, numpy's copy and sums. Imports the
    storage layer: called by the engine modules that open stores, never at
    this module's import."""
    from radixcache.offload.storage.kv_checksum import use_copy_sums, use_sums

    use_copy_sums(None if compiled is None else compiled.copy_sums)
    use_sums(None if compiled is None else compiled.kv_sums)


__all__ = ["COMPILED", "PURE_ENV", "REASON", "REQUIRE_ENV", "compiled", "hand_to_storage"]

"""Public names of a package, imported from their modules on first use.

``radixcache.offload`` and ``radixcache.offload.valkey`` export names whose
modules pull optional or heavy dependencies (the Valkey client library, LMDB,
torch). Listing them in a ``LazyNames`` table keeps ``import`` of the package
free of those: a name's module is imported when the name is first read, and
the value is then kept in the package's namespace. In the package::

    _NAMES = LazyNames(__name__, {"ValkeyStorage": "radixcache.offload.valkey.storage"})
    __all__ = _NAMES.all

    def __getattr__(name: str) -> Any:
        return _NAMES.resolve(name)

    def __dir__() -> list[str]:
        return _NAMES.dir()

Type checkers see the same names through ``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


class LazyNames:
    """``name -> defining module`` for one package (see the module docstring)."""

    def __init__(self, package: str, table: dict[str, str], eager: tuple[str, ...] = ()) -> None:
        self.package = package  # the package's module name
        self.table = table  # public name -> module that defines it
        self.all = sorted({*table, *eager})  # the package's __all__ (eager: names it binds itself)

    def resolve(self, name: str) -> Any:
        """The value of ``name``, imported and kept in the package; AttributeError if unknown."""
        module = self.table.get(name)
        if module is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[self.package], name, value)  # resolve once
        return value

    def dir(self) -> list[str]:
        """The package's names: those bound already and every lazy one."""
        return sorted({*vars(sys.modules[self.package]), *self.table})

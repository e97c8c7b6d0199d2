"""Build of radixcache's optional compiled core (``radixcache/native/_core.pyx``).

Everything else is in pyproject.toml. The extension is optional: without
Cython, without a C compiler, or when the compiler fails, the build warns
and goes on, and radixcache runs on its pure-Python modules (the reference
the compiled loops are tested against). ``RADIXCACHE_NO_COMPILE=1`` skips the
build on purpose.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

CORE = "radixcache/native/_core.pyx"


class OptionalBuildExt(build_ext):
    """build_ext that turns any failure of the compiled core into a warning."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, or a broken toolchain
            _skip(exc)

    def build_extension(self, ext: object) -> None:
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as exc:
            _skip(exc)


def _skip(exc: BaseException) -> None:
    print(f"radixcache: compiled core not built ({type(exc).__name__}: {exc}); "
          "the pure-Python modules will be used", file=sys.stderr)


def extensions() -> list[object]:
    if os.environ.get("RADIXCACHE_NO_COMPILE", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        _skip(exc)
        return []
    from setuptools import Extension

    # Loops start on 32-byte boundaries: the token copy's loop (26 bytes)
    # ran ~1.6x slower when it happened to straddle one (a 32k-token prompt's
    # copy 4.4 -> 7.2 us here, after an unrelated function was added).
    flags = ["-O3", "-falign-loops=32"]
    ext = Extension("radixcache.native._core", [CORE], extra_compile_args=flags, optional=True)
    try:
        return list(cythonize([ext], compiler_directives={"language_level": 3}, quiet=True,
                              build_dir="build"))  # (the generated C stays out of the package)
    except Exception as exc:  # Cython itself failed (a broken source tree, an old Cython)
        _skip(exc)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})

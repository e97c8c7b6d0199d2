"""``python -m radixcache.cli.bench {tree,copy,storage,events,pool} [args]``."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("tree", "copy", "storage", "events", "pool")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in BENCHMARKS:
        print(f"usage: python -m radixcache.cli.bench {{{','.join(BENCHMARKS)}}} [options]")
        return 2
    module = importlib.import_module(f"radixcache.cli.bench.{args[0]}")
    code: int = module.main(args[1:])
    return code


if __name__ == "__main__":
    raise SystemExit(main())

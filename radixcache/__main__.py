"""``python -m radixcache``: the same command line as ``radixcache``."""

from __future__ import annotations

import sys

from radixcache.cli import main

if __name__ == "__main__":
    sys.exit(main())

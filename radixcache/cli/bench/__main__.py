"""``python -m radixcache.cli.bench NAME [options]``: the same as
``radixcache bench NAME [options]``."""

from __future__ import annotations

import sys

from radixcache.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

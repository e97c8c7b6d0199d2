"""A pool holder: a process that gives a Mooncake pool memory and does nothing else.

    python -m radixcache.offload.mooncake.holder mooncake://HOST:PORT?... --segment-mib 8192

It sets up a Mooncake client that contributes ``--segment-mib`` MiB (the URL
names the master and metadata server, as for engines), prints ``ready`` once
its segment is mounted, and waits. On SIGTERM or SIGINT it closes the client,
which unmounts the segment: its pages leave the pool at once (readers get
misses), and the master stops placing new pages there. (The wheel's
``mooncake_client`` binary also holds memory, but ends on SIGTERM without
unmounting: its dead segment stays in the pool, unreadable, until the
master's ``client_ttl``.)

Engines run with no segment of their own (the default), so pages outlive
the engines that wrote them; run one holder (or several, with
``replicas=2`` in the engines' URL to survive one) per machine.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from radixcache.offload.mooncake.config import MooncakeConfig  # light: no torch, no client yet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hold memory for a Mooncake pool until stopped")
    parser.add_argument("url", help="the pool, as engines name it: mooncake://HOST:PORT?...")
    parser.add_argument("--segment-mib", type=int, required=True, help="memory to contribute (MiB)")
    parser.add_argument("--connect-timeout-s", type=float, default=60.0,
                        help="give up when no setup succeeded within this long")
    args = parser.parse_args(argv)
    if args.segment_mib <= 0:
        parser.error(f"--segment-mib must be positive, got {args.segment_mib}")
    try:
        config = MooncakeConfig.from_url(args.url, segment_mib=args.segment_mib)
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config.configure_client_environment()
    from mooncake.store import MooncakeDistributedStore

    deadline = time.monotonic() + args.connect_timeout_s
    while True:  # the master may still be starting
        store = MooncakeDistributedStore()
        rc = store.setup(config.client_settings())
        if rc == 0:
            break
        if stop.is_set() or time.monotonic() > deadline:
            print(f"error: no client of {config.describe()} could be set up ({rc})", file=sys.stderr, flush=True)
            return 1
        time.sleep(config.retry_after_s)
    try:
        print(f"ready: {args.segment_mib} MiB in the pool at {config.describe()}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        store.close()  # unmounts the segment: its pages leave the pool
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``radixcache`` command line (also ``python -m radixcache``).

    radixcache demo      the offload demo: device, host and LMDB tiers, events
    radixcache replay    replay a Mooncake trace: hit ratios per tier, sweeps
    radixcache bench     benchmarks: tree, copy, storage, events (JSON on stdout)

Every mistake (a bad option, a missing or malformed trace, a storage folder
that cannot be used) ends in one line ``radixcache <command>: error: ...``
and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from radixcache.cli.config_option import apply_config, given_dests
from radixcache.cli.parser import CLOSE_GRACE_S, CliParser, UsageError, interrupt_exits, run_guarded

# Modules with a ``register(subparsers)`` that adds one subcommand, in the
# order ``radixcache -h`` lists them. They import neither torch nor the engine
# (seconds), so help and usage errors come at once; each sets the default
# ``entry``, the ``"module:function"`` that runs the command, imported only
# when it runs (``command_function``).
COMMANDS: list[str] = [
    "radixcache.cli.demo.command",
    "radixcache.cli.replay.command",
    "radixcache.cli.bench_command",
]


def build_parser() -> CliParser:
    """The ``radixcache`` parser with every subcommand registered."""
    parser = CliParser(prog="radixcache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:  # each adds its subcommand and sets entry
        importlib.import_module(module).register(sub)
    for command in sub.choices.values():  # unknown options are reported by the command's parser
        command.set_defaults(command_parser=command)
    return parser


def command_function(entry: str) -> Callable[[argparse.Namespace], int]:
    """The function a command's ``entry`` (``"module:function"``) names, its
    module imported (torch and the engine, for most: seconds)."""
    module, _, function = entry.partition(":")
    run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
    return run


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (2: a user mistake, 130: Ctrl-C)."""
    with interrupt_exits("radixcache"):  # start-up: parsing, then the command's imports
        parser = build_parser()
        try:
            args, unknown = parser.parse_known_args(argv)
            if unknown:
                args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
            if getattr(args, "config", None) is not None:  # the file under the flags given
                given = given_dests(build_parser, sys.argv[1:] if argv is None else argv)
                try:
                    apply_config(args, given)
                except UsageError as err:
                    args.command_parser.error(str(err))
        except SystemExit as done:  # -h, or a usage error already reported on one line
            return done.code if isinstance(done.code, int) else 2
        run = command_function(args.entry)
    prog = f"radixcache {args.command}"
    with interrupt_exits(prog, grace_s=CLOSE_GRACE_S):  # Ctrl-C: close, within a bound
        return run_guarded(prog, lambda: int(run(args)))


if __name__ == "__main__":
    sys.exit(main())

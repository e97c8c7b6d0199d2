"""The command line's front door: how every subcommand parses and fails.

A user mistake (a bad option value, a missing or malformed trace, a storage
folder that cannot be used) ends in exactly one line on stderr and exit
status 2::

    radixcache demo: error: storage directory '/etc/passwd/x' is not writable: Not a directory

Commands raise ``UsageError`` for such mistakes; ``CliParser`` reports
argparse's own (unknown option, bad value) the same way, without the usage
block argparse prints by default. A reader that closes the pipe early
(``radixcache replay ... | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

USAGE_ERROR = 2  # exit status of every user mistake (argparse's, too)


class UsageError(Exception):
    """A mistake of the user's (options, input files, storage folder); the
    message is shown as is, after ``<prog>: error:``."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions kept as written; every option's help ends with its default."""


def plain_text(text: str) -> str:
    """Help text as a terminal shows it: docstrings' reST literals
    (````--storage URL````) lose their backquotes."""
    return text.replace("``", "").replace("::\n", ":\n")


def describe(err: BaseException) -> str:
    """An exception as the text after ``error:`` (no ``[Errno 2]`` prefix)."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename!r}: {err.strerror}" if err.filename else err.strerror
    return str(err)


def _one_line_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(USAGE_ERROR, f"{parser.prog}: error: {message} (see {parser.prog} -h)\n")


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and whose help shows defaults."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        _one_line_error(self, message)

    def format_help(self) -> str:
        return plain_text(super().format_help())


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Parsers built inside this block by code that uses plain
    ``argparse.ArgumentParser`` also report errors on one line."""
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _one_line_error  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def _silence_stdout() -> None:
    """After a closed pipe: send what is still buffered nowhere, so the
    interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (e.g. captured in a test)
        pass
    finally:
        os.close(devnull)


INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT), as shells report it
CLOSE_GRACE_S = 10.0  # how long a command may take to close after Ctrl-C


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while a command runs, already reported on stderr."""


@contextmanager
def interrupt_exits(prog: str, grace_s: float | None = None) -> Iterator[None]:
    """While the block runs, Ctrl-C prints one line and ends with status 130.

    ``grace_s`` None (start-up: imports, parsing): the process ends at once.
    A KeyboardInterrupt raised inside an import can leave a half-imported
    module behind (numpy, torch), and what fails next is some unrelated
    error with a long traceback; nothing needs cleaning up before the
    command starts. With ``grace_s`` (a command running): ``Interrupted`` is
    raised so that the command closes what it opened, and if closing takes
    longer than ``grace_s`` seconds, or Ctrl-C comes again, the process ends
    (every store is crash-safe; a cache loses only writes in flight). Outside
    the main thread (a caller running ``main`` in a thread) signals cannot
    be handled: no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum: int, frame: object) -> None:
        os._exit(INTERRUPTED)

    def on_interrupt(signum: int, frame: object) -> None:
        os.write(2, f"{prog}: interrupted\n".encode())
        if grace_s is None:
            os._exit(INTERRUPTED)
        signal.signal(signal.SIGINT, exit_now)  # a second Ctrl-C: at once
        watchdog = threading.Timer(grace_s, exit_now, args=(signum, None))
        watchdog.daemon = True
        watchdog.start()
        raise Interrupted

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_guarded(prog: str, command: Callable[[], int]) -> int:
    """Run ``command``; a UsageError becomes one line on stderr and status 2,
    a closed stdout pipe a quiet status 0, Ctrl-C one line and status 130."""
    try:
        return command()
    except UsageError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except KeyboardInterrupt as err:
        if not isinstance(err, Interrupted):  # (an Interrupted was reported when it came)
            print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED

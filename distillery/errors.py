"""User-facing errors and the one error boundary every command shares.

`UserError` is a problem the user can fix (a params key, an input file, a path, a model directory): its
message names the file (and line or key) and what to change. The command lines (`distillery ...`,
`python -m flows.pipeline`, `python -m flows.stage`, ...) print it as one line, ``error: <message>``, and exit
with code 2; `--debug` (or DISTILLERY_DEBUG=1) re-raises it with its traceback instead. Anything else is a
bug and keeps its traceback.

The project's error types derive from it: ConfigError, GlueFileError, UnknownTaskError, RecipeError,
CheckpointMismatchError, TeacherGateError, ExportError, ...
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A problem with the user's input (params, files, paths, models): one line naming it and the fix."""


class InputNotFoundError(UserError, FileNotFoundError):
    """A file or directory the user named (or a params key points to) does not exist."""


class OutputExistsError(UserError, FileExistsError):
    """An output path holds something this command did not write; nothing is replaced."""


class DiskFullError(UserError, OSError):
    """The disk filled up while a stage wrote its outputs (`disk_full`)."""


#: what PyTorch's checkpoint writer says when a write of it came up short (its own words, no errno)
_SHORT_WRITES = ("file write failed", "unexpected pos", "No space left on device")


def disk_full(exc: BaseException, where: "str | os.PathLike", writing: str | None = None) -> DiskFullError | None:
    """One line for a full disk, whatever raised it: an OSError with ENOSPC (EDQUOT: a quota) anywhere in the chain
    of `exc`, or PyTorch's writer failing on a disk with almost nothing free; None for any other error. The line
    names the file being written (else `writing`, e.g. the stage's outputs, else `where`) and the space left on its
    filesystem."""
    import errno
    import shutil

    seen, cause, path = set(), exc, None
    full = False
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            full, path = True, cause.filename or path
        elif isinstance(cause, RuntimeError) and any(s in str(cause) for s in _SHORT_WRITES):
            try:
                full = full or shutil.disk_usage(where).free < 64 * 2**20
            except OSError:
                pass
        cause = cause.__cause__ or cause.__context__
    if not full:
        return None
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"no space left on device writing {path or writing or where} ({free} on the filesystem of "
                         f"{where}): free some space and run again (what the stage half-wrote is not kept: it runs "
                         "again)")


def debug_requested(argv: list[str] | None = None) -> bool:
    """`--debug` on the command line or DISTILLERY_DEBUG set to a true value."""
    args = sys.argv[1:] if argv is None else argv
    return "--debug" in args or os.environ.get("DISTILLERY_DEBUG", "").lower() in ("1", "true", "yes")


def error_lines(exc: BaseException) -> list[str]:
    """``error: ...`` lines for a user error: one per line of its message (a params file with several
    problems lists each)."""
    lines = [line for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return [f"error: {line}" for line in lines]


def report(exc: BaseException) -> int:
    """Print a user error to stderr; return the exit code."""
    for line in error_lines(exc):
        print(line, file=sys.stderr)
    return EXIT_USER_ERROR


def run_main(main: Callable[[], int], *, debug: bool = False) -> int:
    """Call `main()`; a UserError becomes its ``error:`` line(s) and exit code 2 (re-raised with `debug`)."""
    try:
        return main()
    except UserError as exc:
        if debug:
            raise
        return report(exc)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error line: a bad, missing or unknown option prints one line,
    ``error: <prog>: <what argparse says> (see <prog> --help)``, and exits with code 2 (argparse prints the usage
    block first). Sub-command parsers made with `add_subparsers` are of this class too."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(EXIT_USER_ERROR, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: an integer >= `minimum`; argparse names the option in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int>={minimum}"  # what argparse calls the type in its messages
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def probability(text: str) -> float:
    """An argparse `type`: a number from 0 to 1 (nan and inf refused); argparse names the option in its error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a probability from 0 to 1, got {text}")
    return value

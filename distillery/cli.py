"""The `distillery` console command. Each feature module registers its own sub-commands.

A user error (a bad input file, model directory or output path) prints one line, ``error: <message>``, and
exits with code 2; ``--debug`` (anywhere on the line) shows its traceback instead."""

from __future__ import annotations

import argparse
import importlib
import sys

from distillery.errors import ArgumentParser, debug_requested, run_main

# module path -> each exposes `add_commands(subparsers)` adding parsers whose `func(args) -> int` runs them.
COMMAND_MODULES = [
    "distillery.glue.cli",
    "distillery.augment.cli",
    "distillery.efficiency.cli",
    "distillery.squad.cli",
    "distillery.recipes.cli",
    "distillery.predict",
]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="distillery", description=__doc__)  # a bad option: one `error:` line, exit code 2
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    return run_main(lambda: int(args.func(args) or 0), debug=debug)


if __name__ == "__main__":
    sys.exit(main())

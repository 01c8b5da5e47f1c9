"""The `distillery` console command. Each feature module registers its own sub-commands."""

from __future__ import annotations

import argparse
import importlib
import sys

# module path -> each exposes `register(subparsers)` adding parsers whose `func(args) -> int` runs them.
COMMAND_MODULES = [
    "distillery.glue.cli",
    "distillery.augment.cli",
    "distillery.efficiency.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distillery", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

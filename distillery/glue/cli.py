"""`distillery glue ...` sub-commands."""

from __future__ import annotations

import argparse
import json

from distillery.errors import InputNotFoundError
from distillery.glue.stats import glue_stats


def _stats(args: argparse.Namespace) -> int:
    stats = glue_stats(args.data_dir)
    if not stats:
        raise InputNotFoundError(f"glue stats: no GLUE task found in {args.data_dir} (the GLUE download layout: "
                                 "<dir>/SST-2/train.tsv, <dir>/CoLA/dev.tsv, ...)")
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{'task':<10} {'split':<13} {'rows':>8}  labels")
    for task, splits in stats.items():
        for split, s in splits.items():
            labels = ", ".join(f"{k}: {v}" for k, v in s["labels"].items()) or "-"
            print(f"{task:<10} {split:<13} {s['rows']:>8}  {labels}")
    return 0


def add_commands(subparsers) -> None:
    """Add `glue stats --data-dir DIR [--json]`."""
    glue = subparsers.add_parser("glue", help="GLUE tasks: data statistics")
    sub = glue.add_subparsers(dest="glue_command", required=True)
    stats = sub.add_parser("stats", help="examples per split and label counts of every task in DIR")
    stats.add_argument("--data-dir", required=True, help="GLUE download layout root (<dir>/<Task>/*.tsv)")
    stats.add_argument("--json", action="store_true", help="print JSON {task: {split: {rows, labels}}}")
    stats.set_defaults(func=_stats)

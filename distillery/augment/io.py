"""Augmented training files: a quoting-safe TSV streamed to disk.

Header ``text_a[\\ttext_b]\\tlabel\\tsource_idx`` (the convention `distillery.glue.load_split_file`
recognises); ``source_idx`` is the index of the example each row was made from. Fields are written with
the csv module (tab delimiter, minimal quoting), so sentences holding quotes, tabs or newlines read back
unchanged with `read_augmented` (the official script wrote with quoting but read without, corrupting
quotes). Rows are written as they come to a temporary file renamed into place at the end.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from distillery.io import atomic_path

__all__ = ["augmented_header", "write_augmented", "read_augmented"]


def augmented_header(pair: bool) -> list[str]:
    return ["text_a"] + (["text_b"] if pair else []) + ["label", "source_idx"]


def write_augmented(rows: Iterable[Mapping], path: str | os.PathLike, *, pair: bool) -> int:
    """Stream `rows` (dicts with the header's keys) to `path` atomically; returns the number of rows."""
    header = augmented_header(pair)
    n = 0
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
            writer.writerow(header)
            for row in rows:
                try:
                    writer.writerow([row[c] for c in header])
                except KeyError as exc:
                    raise KeyError(f"{path}: augmented row {n + 1} lacks column {exc.args[0]!r}") from None
                n += 1
    return n


def read_augmented(path: str | os.PathLike) -> Iterator[dict[str, str]]:
    """Rows of an augmented TSV as dicts of strings keyed by its header (a generator: memory flat)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"augmented file not found: {path}")
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header not in (augmented_header(False), augmented_header(True)):
            raise ValueError(f"{path}:1: header {header} is not text_a[,text_b],label,source_idx")
        for fields in reader:
            if len(fields) != len(header):
                raise ValueError(f"{path}:{reader.line_num}: expected {len(header)} fields, got {len(fields)}")
            yield dict(zip(header, fields))

"""Per-split example and label counts of the GLUE tasks found in a data directory."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from distillery.errors import InputNotFoundError
from distillery.glue.loaders import available_splits, is_unlabeled, load_local, task_dir
from distillery.glue.tasks import TASKS, TaskSpec, get_task

if TYPE_CHECKING:
    import datasets


def split_stats(task: str | TaskSpec, ds: datasets.Dataset) -> dict:
    """{"rows": n, "labels": {label: count}}; label names from the registry, STS-B in unit bins,
    unlabeled rows not counted (a test split has labels {})."""
    spec = get_task(task)
    counts: Counter = Counter()
    lows: dict[str, int] = {}  # a regression bin's name -> its lower bound
    for v in ds["label"][:]:
        if is_unlabeled(spec, v):
            continue
        if spec.is_regression:  # unit bins: GLUE's [0, 5] (5.0 in the last), a target of your own of any sign
            low = min(int(v), 4) if 0 <= v <= 5 else math.floor(v)
            name = f"{low}-{low + 1}"
            lows[name] = low
            counts[name] += 1
        else:
            counts[spec.labels[int(v)]] += 1
    order = sorted(counts, key=lows.__getitem__) if spec.is_regression else spec.labels
    return {"rows": len(ds), "labels": {k: counts[k] for k in order if counts[k]}}


def glue_stats(data_dir: str | os.PathLike) -> dict[str, dict[str, dict]]:
    """{task: {split: {"rows": n, "labels": {...}}}} for every registry task with files under data_dir."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputNotFoundError(f"GLUE data directory {data_dir} not found")
    out: dict[str, dict[str, dict]] = {}
    for name, spec in TASKS.items():
        if not task_dir(spec, data_dir).is_dir() or not available_splits(spec, data_dir):
            continue
        dsdict = load_local(spec, data_dir)
        out[name] = {split: split_stats(spec, ds) for split, ds in dsdict.items()}
    return out

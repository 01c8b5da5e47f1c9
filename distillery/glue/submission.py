"""Test-set prediction files in the format the GLUE server (gluebenchmark.com) accepts, and the zip.

One file per task, named as the server expects (CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv,
MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv, AX.tsv), header `index\\tprediction`, one row per
test example: label strings for the NLI tasks (entailment / not_entailment / contradiction / neutral),
0/1 for CoLA, SST-2, MRPC, QQP and WNLI, and a score clipped to [0, 5] with 3 decimals for STS-B.
AX is predicted by the MNLI model (same labels). The zip holds the files at its top level.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from distillery.glue.metrics import as_predictions
from distillery.glue.tasks import GLUE_TASKS, TaskSpec, get_task
from distillery.io import atomic_path, write_text

HEADER = "index\tprediction"

# Number of test examples the GLUE server expects per file.
GLUE_TEST_ROWS: dict[str, int] = {
    "CoLA.tsv": 1063, "SST-2.tsv": 1821, "MRPC.tsv": 1725, "STS-B.tsv": 1379, "QQP.tsv": 390965,
    "MNLI-m.tsv": 9796, "MNLI-mm.tsv": 9847, "QNLI.tsv": 5463, "RTE.tsv": 3000, "WNLI.tsv": 146,
    "AX.tsv": 1104,
}


def submission_filename(task: str | TaskSpec) -> str:
    """The server's file name for `task` (demo tasks, not on the server, get `<name>.tsv`)."""
    spec = get_task(task)
    return spec.submission_file or f"{spec.name}.tsv"


def format_predictions(task: str | TaskSpec, predictions) -> list[str]:
    """Prediction strings: label names (class ids or logits in), or clipped 3-decimal STS-B scores."""
    spec = get_task(task)
    raw = np.asarray(predictions)
    if not spec.is_regression and raw.ndim == 1 and not np.issubdtype(raw.dtype, np.integer):
        raise ValueError(f"{spec.name}: class-id predictions must be integers, got dtype {raw.dtype}")
    p = as_predictions(spec, raw)
    if spec.is_regression:
        if not np.all(np.isfinite(p)):
            raise ValueError(f"{spec.name}: non-finite score predictions")
        return [f"{v:.3f}" for v in (np.clip(p, *spec.score_range) if spec.score_range else p)]
    if np.any(p < 0) or np.any(p >= spec.num_labels):
        raise ValueError(f"{spec.name}: class ids outside 0..{spec.num_labels - 1}")
    return [spec.labels[int(i)] for i in p]


def write_submission(task: str | TaskSpec, predictions, out_dir: str | os.PathLike,
                     indices: Sequence[int] | None = None) -> Path:
    """Write `<out_dir>/<server file name>` for `task`'s test predictions; returns the path.

    indices: the test split's `idx` column (defaults to 0..N-1), written in the `index` column.
    """
    spec = get_task(task)
    values = format_predictions(spec, predictions)
    idx = list(range(len(values))) if indices is None else [int(i) for i in indices]
    if len(idx) != len(values):
        raise ValueError(f"{spec.name}: {len(values)} predictions but {len(idx)} indices")
    if len(set(idx)) != len(idx):
        raise ValueError(f"{spec.name}: duplicate indices in the test predictions")
    body = "".join(f"{i}\t{v}\n" for i, v in zip(idx, values))
    return write_text(Path(out_dir) / submission_filename(spec), HEADER + "\n" + body)


def check_submission(sub_dir: str | os.PathLike, tasks: Sequence[str] = GLUE_TASKS) -> list[str]:
    """Problems that would make the GLUE server reject `sub_dir` (missing files, wrong row counts)."""
    sub_dir = Path(sub_dir)
    problems = []
    for task in tasks:
        name = submission_filename(task)
        path = sub_dir / name
        if not path.is_file():
            problems.append(f"missing {name}")
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        if not lines or lines[0] != HEADER:
            problems.append(f"{name}: header must be {HEADER!r}")
        expected = GLUE_TEST_ROWS.get(name)
        if expected is not None and len(lines) - 1 != expected:
            problems.append(f"{name}: {len(lines) - 1} rows, the server expects {expected}")
    return problems


def zip_submission(sub_dir: str | os.PathLike, zip_path: str | os.PathLike) -> Path:
    """Zip every `*.tsv` of `sub_dir` at the zip's top level (what the GLUE server uploads)."""
    sub_dir = Path(sub_dir)
    if not sub_dir.is_dir():
        raise FileNotFoundError(f"submission directory {sub_dir} not found")
    files = sorted(p for p in sub_dir.glob("*.tsv") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no .tsv prediction files in {sub_dir}")
    with atomic_path(zip_path) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for p in files:
                zf.write(p, arcname=p.name)
    return Path(zip_path)

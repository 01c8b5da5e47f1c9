"""Per-step training logs: every value the Trainer logs (each distillation loss term separately,
learning rate, evaluation metrics) collected in memory and written as `train_log.csv`.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from transformers import ProgressCallback, TrainerCallback

from distillery.io import atomic_path

LOG_NAME = "train_log.csv"


class LossHistory(TrainerCallback):
    """Collect `Trainer.log` records as rows `{"step", "epoch", <logged keys>...}`.

    `history` holds the rows; `write_csv(path)` writes them atomically (columns: the union of keys, `step`
    first). Rows restored on resume are not duplicated: a row for a step already seen replaces the old one.
    """

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D401 - Trainer callback API
        if not logs:
            return
        row: dict[str, Any] = {"step": int(state.global_step), "epoch": state.epoch}
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
        self.history.append(row)

    def rows(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """Rows that carry at least one key starting with `prefix` (all rows when None)."""
        if prefix is None:
            return list(self.history)
        return [r for r in self.history if any(k.startswith(prefix) for k in r)]

    def write_csv(self, path: str | os.PathLike) -> Path:
        return write_log(path, self.history)


class QuietProgress(ProgressCallback):
    """The Trainer's progress bar, showing the latest loss on the bar instead of printing a dict per logging
    step (every logged value still reaches `train_log.csv` and MLflow), and no second bar per evaluation."""

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        pass

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(loss=f"{logs['loss']:.4g}", refresh=False)


def quiet_progress(trainer):
    """Replace the Trainer's default progress callback with `QuietProgress` (no change when tqdm is off)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(QuietProgress())
    return trainer


def rows_from_state(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`TrainerState.log_history` (restored on resume, so complete across restarts) as numeric rows.

    The end-of-training row's `train_loss` is the mean of the logged training losses weighted by the steps each
    covers: the Trainer's own figure counts only the steps of its process, so a resumed run reported the mean of the
    resumed steps over all steps (0.362 instead of 0.453 in a probe). The weighted mean is the same whether the run
    was resumed or not (it leaves out the steps after the last log, fewer than `logging_steps`)."""
    rows = []
    covered, total, last = 0, 0.0, 0
    for rec in log_history:
        row = {"step": int(rec.get("step", 0)), "epoch": rec.get("epoch")}
        row.update({k: v for k, v in rec.items() if k not in row and isinstance(v, (int, float))})
        if "loss" in row and row["step"] > last:
            total += row["loss"] * (row["step"] - last)
            covered, last = covered + row["step"] - last, row["step"]
        if "train_loss" in row and covered:
            row["train_loss"] = total / covered
        rows.append(row)
    return rows


def write_log(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    """Write rows atomically as CSV; columns are the union of keys, `step` and `epoch` first."""
    keys: list[str] = ["step", "epoch"]
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
    return Path(path)


def read_log(path: str | os.PathLike) -> list[dict[str, float]]:
    """Read a `train_log.csv` back as a list of dicts with float values (empty cells dropped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training log not found: {path}")
    with open(path, newline="", encoding="utf-8") as fh:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(fh)]

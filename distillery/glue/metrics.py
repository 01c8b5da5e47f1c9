"""GLUE metrics (Wang et al., 2019, Table 1) with scikit-learn / scipy, and the model-selection score.

accuracy = mean(pred == gold); f1 = binary F1 with positive label 1 (MRPC, QQP); macro_f1 = the mean of the
per-class F1 (a task of your own);
mcc = Matthews correlation (CoLA); pearson / spearman = correlation of predicted and gold scores (STS-B).

`main_score` is the single number used to select checkpoints on dev:
CoLA mcc; STS-B (pearson + spearman) / 2; MRPC and QQP (f1 + accuracy) / 2, or accuracy alone with
selection="accuracy" (the official TinyBERT code's choice); every other task accuracy. MNLI selects on
matched dev: call `main_score(get_task(t).selection_task, dev_metrics_of_that_task)`.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal, Mapping

import numpy as np

from distillery.glue.tasks import TaskSpec, get_task

Selection = Literal["default", "accuracy"]


def as_predictions(spec: TaskSpec, predictions) -> np.ndarray:
    """Scores (N,) for regression, class ids (N,) otherwise; accepts logits (N, C) or (N, 1)."""
    p = np.asarray(predictions)
    if spec.is_regression:
        if p.ndim == 2 and p.shape[1] == 1:
            p = p[:, 0]
        if p.ndim != 1:
            raise ValueError(f"{spec.name}: regression predictions must be (N,) or (N, 1), got {p.shape}")
        return p.astype(np.float64)
    if p.ndim == 2:  # logits -> class ids
        if p.shape[1] != spec.num_labels:
            raise ValueError(f"{spec.name}: logits have {p.shape[1]} classes, task has {spec.num_labels}")
        p = p.argmax(axis=-1)
    if p.ndim != 1:
        raise ValueError(f"{spec.name}: predictions must be class ids (N,) or logits (N, C), got {p.shape}")
    return p.astype(np.int64)


def _correlation(fn, a: np.ndarray, b: np.ndarray) -> float:
    """Correlation; 0.0 when undefined (a constant input), instead of NaN."""
    if np.all(a == a[0]) or np.all(b == b[0]):
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = float(fn(a, b)[0])
    return 0.0 if math.isnan(value) else value


def compute_metrics(task: str | TaskSpec, predictions, labels) -> dict[str, float]:
    """The task's GLUE metrics (only those of the task: `TaskSpec.metrics`) for dev predictions.

    predictions: class ids (N,) or logits (N, C) for classification; scores (N,) or (N, 1) for STS-B.
    labels: gold ids / scores; unlabeled rows (-1, NaN for scores) are an error (test splits cannot be scored).
    """
    spec = get_task(task)
    p = as_predictions(spec, predictions)
    y = np.asarray(labels)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != p.shape:
        raise ValueError(f"{spec.name}: predictions of shape {p.shape} vs labels of shape {y.shape}")
    if y.size == 0:
        raise ValueError(f"{spec.name}: no examples to score")
    if spec.is_regression:
        y = y.astype(np.float64)
        if np.any(np.isnan(y)):  # a target may be of any sign; a row without one is NaN
            raise ValueError(f"{spec.name}: labels contain unlabeled rows (NaN)")
    else:
        y = y.astype(np.int64)
        if np.any(y < 0) or np.any(y >= spec.num_labels):
            raise ValueError(f"{spec.name}: labels outside 0..{spec.num_labels - 1} (unlabeled rows are -1)")
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef  # lazy: ~1 s to import

    out: dict[str, float] = {}
    for name in spec.metrics:
        if name == "accuracy":
            out[name] = float(accuracy_score(y, p))
        elif name == "f1":
            out[name] = float(f1_score(y, p, pos_label=1, average="binary", zero_division=0))
        elif name == "macro_f1":  # the unweighted mean of the per-class F1, over every label of the task
            out[name] = float(f1_score(y, p, labels=list(range(spec.num_labels)), average="macro", zero_division=0))
        elif name == "mcc":
            out[name] = float(matthews_corrcoef(y, p))
        elif name == "pearson":
            from scipy.stats import pearsonr  # lazy: scipy.stats costs seconds to import

            out[name] = _correlation(pearsonr, p, y)
        elif name == "spearman":
            from scipy.stats import spearmanr

            out[name] = _correlation(spearmanr, p, y)
        else:  # pragma: no cover - registry and this table are kept in step
            raise ValueError(f"{spec.name}: unknown metric {name!r}")
    return out


def main_score(task: str | TaskSpec, metrics: Mapping[str, float], *, selection: Selection = "default") -> float:
    """The model-selection score of `task` from its `compute_metrics` output.

    selection="accuracy" selects MRPC/QQP on accuracy alone (official TinyBERT); other tasks ignore it.
    """
    spec = get_task(task)
    if selection not in ("default", "accuracy"):
        raise ValueError(f"selection must be 'default' or 'accuracy', got {selection!r}")

    def need(key: str) -> float:
        if key not in metrics:
            raise KeyError(f"{spec.name}: metric {key!r} missing from {sorted(metrics)}")
        return float(metrics[key])

    kind = spec.main_metric
    if kind == "f1_accuracy":
        if selection == "accuracy":
            return need("accuracy")
        return (need("f1") + need("accuracy")) / 2
    if kind == "pearson_spearman":
        return (need("pearson") + need("spearman")) / 2
    return need(kind)


def trivial_predictions(task: str | TaskSpec, train_labels, n: int) -> np.ndarray:
    """`n` predictions of the trivial predictor learned from the training labels alone: the majority class id for
    classification, the mean training score for regression (what the BERT paper submitted for WNLI)."""
    spec = get_task(task)
    y_train = np.asarray(train_labels)
    if y_train.size == 0:
        raise ValueError(f"{spec.name}: no training labels to build the trivial baseline from")
    if spec.is_regression:
        return np.full(n, float(np.mean(y_train)), dtype=np.float64)
    counts = np.bincount(y_train.astype(np.int64), minlength=spec.num_labels)
    return np.full(n, int(np.argmax(counts)), dtype=np.int64)


def trivial_baseline(task: str | TaskSpec, train_labels, dev_labels) -> dict[str, float]:
    """Dev metrics of the trivial predictor (`trivial_predictions`; a constant, so its correlations are 0).

    A teacher that does not beat this has learned nothing from the task's text."""
    y_dev = np.asarray(dev_labels)
    return compute_metrics(task, trivial_predictions(task, train_labels, len(y_dev)), y_dev)

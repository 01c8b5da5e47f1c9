"""Bridge between task metrics (`predictions, labels -> dict`) and the Trainer's `EvalPrediction` API.

The Trainer selects the best checkpoint on one logged key; GLUE main scores are not always a single metric
(STS-B: (Pearson + Spearman) / 2), so the bridge adds the main score under the key `"main"`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from transformers import EvalPrediction

MetricFn = Callable[[np.ndarray, np.ndarray], dict]
MAIN = "main"


def predictions_from_logits(logits: np.ndarray) -> np.ndarray:
    """Class ids (argmax) for classification logits (N, C>1); the squeezed score for regression (N, 1)."""
    logits = logits[0] if isinstance(logits, tuple) else logits
    logits = np.asarray(logits)
    if logits.ndim == 2 and logits.shape[1] == 1:
        return logits[:, 0]
    if logits.ndim == 1:
        return logits
    return logits.argmax(axis=-1)


def trainer_metrics(metric_fn: MetricFn, main_score: Callable[[dict], float] | str | None = None):
    """Wrap `metric_fn(predictions, labels) -> dict` for `Trainer(compute_metrics=...)`, adding `"main"`. A
    `metric_fn` with a true `takes_logits` attribute (a span task's, `distillery.squad.evaluate.SpanMetrics`) gets the
    Trainer's raw predictions and labels instead of class ids, and the input ids (`inputs=`) when the Trainer was
    asked for them (`include_for_metrics=["inputs"]`)."""
    raw = getattr(metric_fn, "takes_logits", False)

    def compute(pred: EvalPrediction) -> dict:
        if raw:
            inputs = {"inputs": pred.inputs} if pred.inputs is not None else {}
            metrics = dict(metric_fn(pred.predictions, pred.label_ids, **inputs))
        else:
            labels = pred.label_ids[0] if isinstance(pred.label_ids, tuple) else pred.label_ids
            metrics = dict(metric_fn(predictions_from_logits(pred.predictions), np.asarray(labels)))
        if callable(main_score):
            metrics[MAIN] = float(main_score(metrics))
        elif isinstance(main_score, str):
            if main_score not in metrics:
                raise KeyError(f"main metric {main_score!r} not among computed metrics {sorted(metrics)}")
            metrics[MAIN] = float(metrics[main_score])
        elif len(metrics) == 1:
            metrics[MAIN] = float(next(iter(metrics.values())))
        else:
            raise ValueError(f"several metrics {sorted(metrics)}: say which is main (main_score=...)")
        return metrics

    return compute


def glue_metrics(task: str):
    """`(metric_fn, main_score)` for a GLUE task from `distillery.glue` (imported lazily)."""
    from distillery.glue import compute_metrics, main_score

    return (lambda p, y: compute_metrics(task, p, y)), (lambda m: main_score(task, m))


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> dict:
    """Plain accuracy, for tests and tasks without a dedicated metric."""
    return {"accuracy": float((np.asarray(predictions) == np.asarray(labels)).mean())}

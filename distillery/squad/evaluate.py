"""A span model's dev score during training: the Trainer's start/end logits over the eval features -> one answer per
question (`postprocess`) -> the official EM/F1 (`metrics.evaluate`), 0-100 as the official scripts print them.

`SpanMetrics` is a `compute_metrics` for `distillery.training` (its `takes_logits` asks the bridge for the raw
logits instead of class ids). The Trainer hands the logits as a (start, end) pair of (features, tokens) arrays (a
`*ForQuestionAnswering` model) or one (features, 2, tokens) array (the `Distiller`'s stacked span logits); rows are
padded across batches with -100, and `postprocess` cuts every row to its feature's length.

Rows arrive in dataset order, except when training groups batches by length: transformers 5 then orders evaluation
batches by length too. The Trainer then also hands the input ids (`include_for_metrics=["inputs"]`,
`distillery.training.trainer` asks for them), and `in_feature_order` puts each row back beside its feature by its
tokens (features with the same tokens have the same logits, so any of them may take the row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distillery.squad.data import gold_answers
from distillery.squad.metrics import evaluate
from distillery.squad.postprocess import Answer, Table, null_odds, postprocess, prediction_texts

#: the dev score a span task selects checkpoints and reports retention on
MAIN = "f1"


def span_logits(predictions: Any) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) logits from either layout the Trainer hands over."""
    if isinstance(predictions, (tuple, list)):
        return np.asarray(predictions[0]), np.asarray(predictions[1])
    predictions = np.asarray(predictions)
    if predictions.ndim != 3 or predictions.shape[1] != 2:
        raise ValueError(f"span logits: a (start, end) pair or a (features, 2, tokens) array, got {predictions.shape}")
    return predictions[:, 0], predictions[:, 1]


def _key(ids: np.ndarray, pad: set[int]) -> bytes:
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    while n and int(ids[n - 1]) in pad:
        n -= 1
    return ids[:n].tobytes()


def in_feature_order(start: np.ndarray, end: np.ndarray, inputs: np.ndarray, features: Table, pad_id: int = 0
                     ) -> tuple[np.ndarray, np.ndarray]:
    """`start`/`end` rows (one per row of `inputs`, the input ids the Trainer padded with `pad_id` within a batch
    and -100 across batches) reordered to the order of `features`."""
    inputs = np.asarray(inputs)
    if len(inputs) != len(features["input_ids"]):
        raise ValueError(f"span logits: {len(inputs)} evaluated rows for {len(features['input_ids'])} features")
    pad = {-100, int(pad_id)}
    rows: dict[bytes, list[int]] = {}
    for i, ids in enumerate(inputs):
        rows.setdefault(_key(ids, pad), []).append(i)
    order = []
    for ids in features["input_ids"]:
        taken = rows.get(_key(ids, pad))
        if not taken:
            raise ValueError("span logits: an evaluated row matches no feature's input ids")
        order.append(taken.pop())
    return start[order], end[order]


def predict_span_logits(model, tokenizer, features, *, session=None, batch_size: int = 64) -> np.ndarray:
    """(features, 2, tokens): the start and end logits of every feature of `features` (a Dataset with the model
    inputs), in its order, batches padded by `tokenizer` and rows padded with -1e4 past their batch's width. The
    logits of `model` (a `*ForQuestionAnswering` model), or of `session` (an exported model whose output is the
    (batch, 2, tokens) span logits, `distillery.efficiency.OnnxModel`; `model` may then be None)."""
    import torch

    from distillery import precision
    from distillery.evaluation import batches
    from distillery.training import cpu_kernels

    rows = []
    device = next(model.parameters()).device if model is not None else "cpu"
    with torch.inference_mode(), precision.forwards(model), cpu_kernels.used(model, device):
        for batch in batches(None if session is not None else model, tokenizer, features, batch_size=batch_size):
            if session is not None:
                rows += list(np.asarray(session(**{k: v.numpy() for k, v in batch.items()})))
            else:
                out = model(**batch)
                rows += list(torch.stack((out.start_logits, out.end_logits), 1).float().cpu().numpy())
    width = max((r.shape[-1] for r in rows), default=0)
    return np.stack([np.pad(r, ((0, 0), (0, width - r.shape[-1])), constant_values=-1e4) for r in rows]) if rows \
        else np.zeros((0, 2, 0), dtype=np.float32)


class SpanMetrics:
    """`compute_metrics(predictions, labels)` of a span task: {"em", "f1"} (v2.0 adds the official HasAns/NoAns and
    best-threshold keys). `answers` holds the last evaluation's answers (for the predictions file)."""

    takes_logits = True

    def __init__(self, examples: Table, features: Table, version: str = "1.1", pad_id: int = 0,
                 **postprocess_options: Any) -> None:
        self.examples, self.features, self.version, self.pad_id = examples, features, version, pad_id
        self.options = postprocess_options
        self.gold = gold_answers(examples)
        self.answers: dict[str, Answer] = {}

    def __call__(self, predictions: Any, labels: Any = None, inputs: Any = None) -> dict[str, float]:
        """`inputs`: the evaluated rows' input ids when they may not be in the features' order."""
        start, end = span_logits(predictions)
        if inputs is not None:
            start, end = in_feature_order(start, end, inputs, self.features, self.pad_id)
        self.answers = postprocess(self.examples, self.features, start, end, version=self.version, **self.options)
        odds = null_odds(self.answers) if self.version == "2.0" else None
        scores = evaluate(self.gold, prediction_texts(self.answers), self.version, odds)
        scores["em"] = scores.pop("exact_match") if "exact_match" in scores else scores.pop("exact")
        return scores

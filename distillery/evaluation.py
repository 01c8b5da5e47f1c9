"""Evaluate a saved model on a GLUE-style task: dev metrics and test-set predictions.

Models are loaded from a `save_pretrained` directory with `AutoModelForSequenceClassification` (no project
code), exactly as a user would deploy them. Forwards run at the precision in force (`distillery.precision`).
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from distillery import glue, precision


def batches(model, tokenizer, encoded: datasets.Dataset, *, batch_size: int = 64):
    """The model inputs of an encoded dataset, in dataset order, padded per batch, on the model's device (the CPU
    for `model=None`: inputs of an exported model)."""
    device = next(model.parameters()).device if model is not None else torch.device("cpu")
    keep = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in encoded.column_names]
    collate = DataCollatorWithPadding(tokenizer)
    rows = encoded.select_columns(keep)
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = collate([dict(zip(keep, values)) for values in zip(*(chunk[c] for c in keep))])
        yield {k: v.to(device) for k, v in batch.items()}


@torch.inference_mode()
def predict_logits(model, tokenizer, encoded: datasets.Dataset, *, batch_size: int = 64) -> np.ndarray:
    """Logits (N, num_labels) of `model` on an encoded dataset, in dataset order."""
    from distillery.training import cpu_kernels, unpadding

    model.eval()
    device = next(model.parameters()).device
    with precision.forwards(model), cpu_kernels.used(model, device), unpadding.inferring(model, device):
        out = [model(**batch).logits.float().cpu().numpy() for batch in batches(model, tokenizer, encoded,
                                                                                  batch_size=batch_size)]
    return np.concatenate(out) if out else np.zeros((0, model.config.num_labels), dtype=np.float32)


def evaluate_model(
    model_dir: str | os.PathLike, task: str, data: datasets.DatasetDict, *, max_length: int,
    batch_size: int = 64,
) -> tuple[dict[str, float], np.ndarray | None]:
    """Dev metrics (GLUE names; {} without a dev split) and test logits (None without a test split)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_dir}")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    encoded = glue.encode(datasets.DatasetDict({s: data[s] for s in ("dev", "test") if s in data}), tokenizer, task,
                          max_length)  # the splits it reads
    metrics: dict[str, float] = {}
    if "dev" in encoded:
        dev = encoded["dev"]
        logits = predict_logits(model, tokenizer, dev, batch_size=batch_size)
        metrics = glue.compute_metrics(task, logits, np.asarray(dev["labels"][:]))
    test = None
    if "test" in encoded:
        test = predict_logits(model, tokenizer, encoded["test"], batch_size=batch_size)
    return metrics, test

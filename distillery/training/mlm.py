"""Masked-language-model pre-training (BERT, Devlin et al. 2019, section 3.1 "Task #1: Masked LM").

Used for a teacher trained from scratch or continued from a checkpoint (e.g. an encoder without an MLM head:
`AutoModelForMaskedLM.from_pretrained` adds a freshly initialised head and training continues from there).
Masking is dynamic (`DataCollatorForLanguageModeling`: 15% of tokens, 80/10/10 [MASK]/random/keep).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import datasets
from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling, PreTrainedModel, Trainer

from distillery.training.spec import TrainRun
from distillery.training.trainer import train_and_export


def tokenize_texts(
    texts: Iterable[str] | datasets.Dataset,
    tokenizer,
    max_length: int = 128,
    *,
    pack: bool = False,
    text_column: str = "text",
) -> datasets.Dataset:
    """Turn raw texts into a dataset of `input_ids` (+ attention/token-type ids) for MLM.

    `pack=False`: one sequence per text, truncated to `max_length`. `pack=True`: texts are concatenated and cut
    into blocks of `max_length` tokens, each wrapped in [CLS] ... [SEP] (no padding wasted).
    Empty / whitespace-only texts are dropped. A dataset that already has `input_ids` is returned as is.
    """
    if isinstance(texts, datasets.Dataset):
        if "input_ids" in texts.column_names:
            return texts
        if text_column not in texts.column_names:
            raise KeyError(f"dataset has no column {text_column!r} (columns: {texts.column_names})")
        texts = texts[text_column]
    lines = [t for t in texts if isinstance(t, str) and t.strip()]
    if not lines:
        raise ValueError("no non-empty texts to train on")
    if not pack:
        enc = tokenizer(lines, truncation=True, max_length=max_length)
        return datasets.Dataset.from_dict(dict(enc))
    body = max_length - 2
    if body < 1:
        raise ValueError(f"max_length={max_length} leaves no room for tokens between [CLS] and [SEP]")
    ids = [i for piece in tokenizer(lines, add_special_tokens=False)["input_ids"] for i in piece]
    blocks = [ids[i : i + body] for i in range(0, len(ids), body)]
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if cls is None or sep is None:
        raise ValueError("pack=True needs a tokenizer with [CLS]/[SEP] (or BOS/EOS) tokens")
    seqs = [[cls, *b, sep] for b in blocks]
    return datasets.Dataset.from_dict(
        {"input_ids": seqs, "attention_mask": [[1] * len(s) for s in seqs]}
    )


def train_mlm(
    model: PreTrainedModel | str | os.PathLike,
    run: TrainRun,
    *,
    max_length: int = 128,
    pack: bool = False,
    mlm_probability: float = 0.15,
) -> Path:
    """Pre-train (or continue pre-training) `model` with the MLM objective; return `run.output_dir/model`.

    `model` is an MLM-headed model or a path/Hub name loaded with `AutoModelForMaskedLM` (a checkpoint without
    an MLM head gets a fresh one). `run.train_dataset` / `run.eval_dataset` are texts or datasets
    (`tokenize_texts` with `run.tokenizer`, `max_length`, `pack`). Trainer checkpoints go to
    `run.output_dir/checkpoints`; with `run.resume` training continues from the newest one there. The final model,
    tokenizer and per-step `train_log.csv` (step, loss, ...) are written atomically to `run.output_dir/model`; with
    an eval set, its MLM loss to `metrics.json`.
    """
    if not (0.0 < mlm_probability < 1.0):
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
    if not isinstance(model, PreTrainedModel):
        path = Path(model)
        if not path.exists() and os.sep in str(model):
            raise FileNotFoundError(f"model directory not found: {path}")
        model = AutoModelForMaskedLM.from_pretrained(str(model))
    tokenizer = run.tokenizer
    train_ds = tokenize_texts(run.train_dataset, tokenizer, max_length, pack=pack)
    eval_ds = tokenize_texts(run.eval_dataset, tokenizer, max_length, pack=pack) if run.eval_dataset is not None else None
    run = run.with_(train_dataset=train_ds, eval_dataset=eval_ds)
    targs = run.training_arguments({}, select=False)  # no loop options of its own; the final model, not a best one
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=targs.seed)
    return train_and_export(Trainer, model, run, targs, data_collator=collator, evaluate=eval_ds is not None)


def masked_lm_loss(
    model: PreTrainedModel,
    tokenizer,
    texts: Sequence[str] | datasets.Dataset,
    *,
    max_length: int = 128,
    mlm_probability: float = 0.15,
    seed: int = 0,
    batch_size: int = 64,
) -> float:
    """Mean cross-entropy over the masked tokens of `texts`, with masks drawn from `seed`: two models measured
    with the same arguments see exactly the same masked inputs (e.g. a teacher and its IB-BERT conversion). The batches
    go to the model's device (a model trained on a GPU is measured there)."""
    import torch

    data = tokenize_texts(texts, tokenizer, max_length)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=seed)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in data.column_names]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            batch = collator([{k: data[i][k] for k in keys} for i in range(start, min(start + batch_size, len(data)))])
            batch = {k: v.to(model.device) for k, v in batch.items()}
            labels = batch.pop("labels")
            logits = model(**batch).logits
            sel = labels != -100
            total += float(torch.nn.functional.cross_entropy(logits[sel].float(), labels[sel], reduction="sum"))
            count += int(sel.sum())
    model.train(was_training)
    return total / max(count, 1)

"""Tokenise a loaded GLUE task into model inputs (BERT input format, Devlin et al., 2019, sec. 3).

Single sentences become `[CLS] a [SEP]`, pairs `[CLS] a [SEP] b [SEP]` with segment ids 0/1; pairs
longer than `max_length` are cut one token at a time from the longer side ("longest_first"), as the
official BERT/TinyBERT `_truncate_seq_pair` does. No padding by default (pad per batch with
`transformers.DataCollatorWithPadding`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distillery.glue.loaders import is_unlabeled
from distillery.glue.tasks import TaskSpec, get_task

if TYPE_CHECKING:
    import datasets

TEXT_COLUMNS = ("text_a", "text_b", "label")


def encode(dsdict: datasets.DatasetDict, tokenizer, task: str | TaskSpec, max_length: int,
           *, padding: bool | str = False) -> datasets.DatasetDict:
    """Add input_ids / attention_mask / token_type_ids (when the tokenizer gives them) / labels.

    The text columns and `label` are dropped; `idx` (and any other column, e.g. source_idx) is kept.
    `labels` is an int class id, or a float score for STS-B. A split with no gold label at all (a test
    split, label -1 everywhere) gets no `labels` column, so `Trainer.predict` computes no loss on it;
    a split mixing labeled and unlabeled rows is an error.
    """
    import datasets  # lazy: see distillery.glue.loaders

    spec = get_task(task)
    if max_length < 4:
        raise ValueError(f"max_length must be >= 4, got {max_length}")
    out = {}
    for split, ds in dsdict.items():
        missing = [c for c in ("text_a", "label") + (("text_b",) if spec.is_pair else ()) if c not in ds.column_names]
        if missing:
            raise KeyError(f"{spec.name}[{split}]: missing columns {missing} (has {ds.column_names})")
        labels = ds["label"][:]
        unlabeled = sum(1 for v in labels if is_unlabeled(spec, v))
        if 0 < unlabeled < len(labels):
            raise ValueError(f"{spec.name}[{split}]: {unlabeled} of {len(labels)} rows are unlabeled")
        has_labels = unlabeled == 0 and len(labels) > 0

        def tokenize(batch: dict) -> dict:
            texts = (batch["text_a"], batch["text_b"]) if spec.is_pair else (batch["text_a"],)
            enc = dict(tokenizer(*texts, truncation=True, max_length=max_length, padding=padding))
            if has_labels:
                enc["labels"] = [float(v) for v in batch["label"]] if spec.is_regression else \
                    [int(v) for v in batch["label"]]
            return enc

        drop = [c for c in TEXT_COLUMNS if c in ds.column_names]
        encoded = ds.map(tokenize, batched=True, remove_columns=drop, desc=f"encode {spec.name}[{split}]")
        if has_labels:
            feature = datasets.Value("float32") if spec.is_regression else datasets.Value("int64")
            encoded = encoded.cast_column("labels", feature)
        out[split] = encoded
    return datasets.DatasetDict(out)

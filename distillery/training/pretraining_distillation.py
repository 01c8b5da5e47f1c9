"""MobileBERT's pre-training distillation (Sun et al., 2020, Sec. 3.5, eq. 4):

    L_PD = alpha L_MLM + (1 - alpha) L_KD + L_NSP

on the masked positions of the corpus (L_MLM: cross-entropy with the original token; L_KD: cross-entropy with the
IB-BERT teacher's MLM distribution), plus next-sentence prediction on sentence pairs built inside documents
(``distillery.corpus.sentence_pairs``). alpha = 0.5 (Appendix, after Kim and Rush 2016). The official code's single
cross-entropy against the mixed target ``alpha * one-hot + (1 - alpha) * teacher softmax``
(``distill_ground_truth_ratio``) is the same loss, term by term, at temperature 1, so it needs no switch.

With ``layer_wise`` the feature-map (eq. 2) and attention (eq. 3) transfer terms of every layer are added to the
same loss: the paper's auxiliary knowledge transfer (Figure 2 (a)). Training goes through
``distillery.training.distill`` like every other recipe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import datasets
from transformers import DataCollatorForLanguageModeling, PreTrainedModel

from distillery.models import num_layers
from distillery.training.distill import distill
from distillery.training.mlm import tokenize_texts
from distillery.training.progressive_transfer import layer_wise_map

__all__ = ["nsp_dataset", "pretraining_distillation"]


def nsp_dataset(pairs: list[tuple[str, str, int]], tokenizer, max_length: int) -> datasets.Dataset:
    """`(A, B, label)` pairs as `input_ids`, `token_type_ids`, `attention_mask`, `next_sentence_label`."""
    if not pairs:
        raise ValueError("no sentence pairs: the corpus needs documents of two or more sentences, or several documents")
    a, b, labels = zip(*pairs)
    enc = tokenizer(list(a), list(b), truncation="longest_first", max_length=max_length)
    return datasets.Dataset.from_dict({**dict(enc), "next_sentence_label": list(labels)})


def pretraining_distillation(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    train_data: datasets.Dataset | list[str],
    output_dir: str | os.PathLike,
    *,
    tokenizer,
    alpha: float = 0.5,
    mlm_probability: float = 0.15,
    layer_wise: Mapping[str, float] | None = None,
    max_length: int = 128,
    args: Mapping[str, Any] | None = None,
    **options: Any,
) -> Path:
    """Distil the IB teacher's MLM into `student` with eq. 4; return `output_dir/model`.

    `train_data`: an `nsp_dataset` (then `student` needs an NSP head: a `*ForPreTraining` model) or plain texts /
    a tokenized dataset (MLM + KD only). Masking is BERT's dynamic 15% with 80/10/10. `layer_wise`: objective
    weights of the feature-map / attention terms to add (auxiliary knowledge transfer)."""
    data = train_data if isinstance(train_data, datasets.Dataset) else tokenize_texts(train_data, tokenizer, max_length)
    objectives = {"pretraining_distillation_loss": 1.0, **dict(layer_wise or {})}
    layer_map = layer_wise_map(range(1, num_layers(student) + 1)) if layer_wise else None
    seed = int((args or {}).get("seed", 42))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=seed)
    return distill(teacher, student, data, None, output_dir, layer_map=layer_map, objectives=objectives,
                   stage="pretraining", mlm_alpha=alpha, tokenizer=tokenizer, data_collator=collator,
                   args=dict(args or {}), **options)

"""MobileBERT's pre-training distillation (Sun et al., 2020, Sec. 3.5, eq. 4):

    L_PD = alpha L_MLM + (1 - alpha) L_KD + L_NSP

on the masked positions of the corpus (L_MLM: cross-entropy with the original token; L_KD: cross-entropy with the
IB-BERT teacher's MLM distribution), plus next-sentence prediction on sentence pairs built inside documents
(``distillery.corpus.sentence_pairs``). alpha = 0.5 (Appendix, after Kim and Rush 2016). The official code's single
cross-entropy against the mixed target ``alpha * one-hot + (1 - alpha) * teacher softmax``
(``distill_ground_truth_ratio``) is the same loss, term by term, at temperature 1, so it needs no switch.

With the feature-map (eq. 2) and attention (eq. 3) transfer terms of every layer in the spec's objectives (and their
layer map), they are added to the same loss: the paper's auxiliary knowledge transfer (Figure 2 (a)). Training goes
through ``distillery.training.distill`` like every other recipe.
"""

from __future__ import annotations

from pathlib import Path

import datasets
from transformers import DataCollatorForLanguageModeling, PreTrainedModel

from distillery.training.distill import distill
from distillery.training.mlm import tokenize_texts
from distillery.training.spec import DistillSpec, TrainRun

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
    spec: DistillSpec,
    run: TrainRun,
    *,
    mlm_probability: float = 0.15,
    max_length: int = 128,
) -> Path:
    """Distil the IB teacher's MLM into `student` with eq. 4; return `run.output_dir/model`.

    `spec`: stage "pretraining", objectives `{"pretraining_distillation_loss": 1, ...}` (+ the layer-wise terms and
    their layer map for auxiliary transfer), alpha in `spec.options.mlm_alpha`. `run.train_dataset`: an
    `nsp_dataset` (then `student` needs an NSP head: a `*ForPreTraining` model) or plain texts (tokenized with
    `run.tokenizer` to `max_length`) / a tokenized dataset (MLM + KD only). Masking is BERT's dynamic
    `mlm_probability` with 80/10/10, drawn from `run.args["seed"]` (default 42)."""
    if spec.level != "pretraining":
        raise ValueError(f"pretraining distillation needs a 'pretraining' DistillSpec, got level {spec.level!r}")
    data = run.train_dataset
    if not isinstance(data, datasets.Dataset):
        data = tokenize_texts(data, run.tokenizer, max_length)
    seed = int(run.args.get("seed", 42))
    collator = DataCollatorForLanguageModeling(run.tokenizer, mlm_probability=mlm_probability, seed=seed)
    return distill(teacher, student, spec, run.with_(train_dataset=data, data_collator=collator))

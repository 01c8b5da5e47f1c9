"""Augmentation stage: TinyBERT Algorithm 1 over a task's training set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks import paths
from tasks.data import resolve, vectors_path
from tasks.execute import shards_dir
from tasks.stage import Stage
from tasks.teacher import load_task, teacher_gate

from distillery.config import ConfigError, Params


def mlm_source(p: Params) -> Path | str:
    """The MLM for augmentation: the pre-training stage's MLM, or any MLM directory / Hub name."""
    if p.augment.mlm == "teacher":
        if not p.pretrain.enabled:
            raise ConfigError("params: augment.mlm: 'teacher' needs pretrain.enabled (the teacher has no MLM "
                             "otherwise); give an MLM checkpoint path instead")
        return paths.teacher_mlm() / "model"
    path = resolve(p.augment.mlm)
    return path if path.exists() else p.augment.mlm


def run_augment(p: Params, task: str) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from distillery.augment import AugmentConfig, augment_dataset, load_word_vectors
    from distillery.augment.mlm import load_mlm_checked

    teacher_gate(p, task)  # augmentation only serves distillation from this task's teacher
    source = str(mlm_source(p))
    tokenizer = AutoTokenizer.from_pretrained(source)
    mlm = load_mlm_checked(source).eval()  # a checkpoint without an MLM head is an error, not a random head
    if torch.cuda.is_available():
        mlm = mlm.cuda()
    from distillery.training.distributed import main_process_first

    with main_process_first():  # under a launcher rank 0 writes the vectors' binary cache, the others read it
        vectors = load_word_vectors(vectors_path(p), max_words=p.word_vectors.max_words,
                                    cache_dir=paths.word_vectors_dir() / "cache")
    train = load_task(task)["train"]
    if p.augment.max_examples is not None and len(train) > p.augment.max_examples:
        train = train.select(range(p.augment.max_examples))
    config = AugmentConfig(k=p.augment.k, p_t=p.augment.p_t, n_aug=p.augment.n_aug, seed=p.seed,
                           batch_size=p.augment.batch_size, fast=p.augment.fast, chunk_size=p.augment.shard_size)
    out = augment_dataset(train, task, mlm, tokenizer, vectors, config, paths.augmented(task),
                          shards=shards_dir(paths.augmented(task)))
    rows = sum(1 for _ in open(out, encoding="utf-8")) - 1
    return {"metrics": {"source_examples": len(train), "augmented_rows": rows}}


def _deps(p: Params, task: str) -> list[Path]:
    mlm = mlm_source(p)
    made_here = p.augment.mlm == "teacher"  # the pre-training stage's output: a dep even before it exists
    return ([paths.task_data(task), vectors_path(p), paths.teacher(task) / "model"]
            + ([Path(mlm)] if made_here or Path(mlm).exists() else []))


AUGMENT = Stage(
    "augment", run_augment, device="shared", distributed=True,
    deps=_deps,
    outs=lambda p, t: [paths.augmented(t)],
    params=lambda p, t: {"seed": p.seed, "augment": p.augment.model_dump(mode="json"),
                         "max_words": p.word_vectors.max_words,
                         "min_gain_over_trivial": p.teacher_finetune.min_gain_over_trivial},
    code=("distillery/augment", "distillery/glue", "tasks/augment.py", "tasks/teacher.py"),
)

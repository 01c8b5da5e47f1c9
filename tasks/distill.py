"""Distillation stages: general distillation (per student) and two-step task distillation (per student
and task): step 1 intermediate layers on the augmented set, step 2 the prediction layer over the paper's
small grid (lr x batch size), best on dev."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.stage import Stage, split_item
from tasks.teacher import finish, load_task, teacher_source, train_options

from distillery.config import Params
from distillery.io import atomic_dir


def _student_shape(p: Params, student: str):
    from distillery.models import resolve_shape

    return resolve_shape(p.students[student].shape.as_spec())


def _layer_map(p: Params, student_model, teacher_model, student: str):
    from distillery.layer_map import build_layer_map
    from distillery.models import num_layers

    return build_layer_map(p.students[student].layer_map, num_layers(student_model), num_layers(teacher_model))


def run_general_distillation(p: Params, student: str) -> dict[str, Any]:
    from transformers import AutoModel, AutoTokenizer

    from distillery import corpus
    from distillery.models import build_student
    from distillery.training.distill import distill
    from distillery.training.mlm import tokenize_texts

    source = teacher_source(p)
    tokenizer = AutoTokenizer.from_pretrained(source)
    teacher = AutoModel.from_pretrained(source)
    model = build_student(_student_shape(p, student), len(tokenizer), head="base", base=teacher.config)
    layer_map = _layer_map(p, model, teacher, student)
    gd = p.general_distillation
    texts = corpus.pack_sequences(corpus.read_sentences(paths.corpus()), tokenizer, gd.max_length)
    train = tokenize_texts(texts, tokenizer, gd.max_length)
    out = paths.general_student(student)
    distill(teacher, model, train, None, out, layer_map=layer_map, objectives=dict(gd.objectives),
            stage="intermediate", tokenizer=tokenizer, args=train_options(gd, p.seed))
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics": {"sequences": len(texts)}}


def _train_set(p: Params, task: str, tokenizer):
    """The augmented set when augmentation is on (else the task's training split), encoded."""
    from datasets import DatasetDict

    from distillery import glue

    data = load_task(task)
    train = glue.load_split_file(task, paths.augmented(task)) if p.augment.enabled else data["train"]
    encoded = glue.encode(DatasetDict({"train": train, "dev": data["dev"]}), tokenizer, task, p.data.max_length)
    return encoded["train"], encoded["dev"]


def run_task_distillation(p: Params, item: str) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distillery import glue
    from distillery.models import build_student
    from distillery.training.distill import distill
    from distillery.training.grid import prediction_grid
    from distillery.training.metrics import glue_metrics

    student, task = split_item(item)
    spec = glue.get_task(task)
    teacher_dir = paths.teacher(task) / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(teacher_dir))
    teacher = AutoModelForSequenceClassification.from_pretrained(str(teacher_dir))
    labels = {"num_labels": spec.num_labels, "id2label": teacher.config.id2label, "label2id": teacher.config.label2id}
    general = paths.general_student(student) / "model"
    if p.general_distillation.enabled:
        model = AutoModelForSequenceClassification.from_pretrained(str(general), **labels)
    else:
        model = build_student(_student_shape(p, student), len(tokenizer), head="sequence-classification",
                              num_labels=spec.num_labels, base=teacher.config)
    layer_map = _layer_map(p, model, teacher, student)
    train, dev = _train_set(p, task, tokenizer)
    out = paths.student(student, task)
    td = p.task_distillation

    # Step 1: intermediate layers (attention + hidden + embedding), continuing the general projection.
    step1 = distill(teacher, model, train, None, out / "intermediate", layer_map=layer_map,
                    objectives=dict(td.intermediate.objectives), stage="intermediate",
                    projection=general if p.general_distillation.enabled else None, tokenizer=tokenizer,
                    args=train_options(td.intermediate, p.seed))
    shutil.rmtree(out / "intermediate" / "checkpoints", ignore_errors=True)

    # Step 2: prediction layer over the paper's grid; teacher logits computed once and reused by every run.
    pr = td.prediction
    compute, main = glue_metrics(task)
    grid = prediction_grid(
        teacher, lambda: AutoModelForSequenceClassification.from_pretrained(str(step1), **labels), train, dev,
        out / "grid", compute_metrics=compute, main_score=main, learning_rates=pr.lrs, batch_sizes=pr.batch_sizes,
        epochs=pr.epochs, cache=pr.cache_teacher_logits, tokenizer=tokenizer, temperature=pr.temperature,
        regression_target=pr.regression_target, warmup_steps=pr.warmup_ratio, seed=p.seed,
        per_device_eval_batch_size=64, save_total_limit=1, logging_steps=5,
    )
    for run in grid.results:
        shutil.rmtree(Path(run["model_dir"]).parent / "checkpoints", ignore_errors=True)
    with atomic_dir(out / "model") as tmp:
        shutil.copytree(grid.best_dir, tmp, dirs_exist_ok=True)
    best = grid.best
    return {"curve": step1 / "train_log.csv", "artifacts": [str(out / "grid" / "grid.json")],
            "metrics": {"best_lr": best["learning_rate"], "best_batch_size": best["batch_size"],
                        "best_dev_main": best["main"]}}


GENERAL_DISTILLATION = Stage(
    "general_distillation", run_general_distillation,
    deps=lambda p, s: [paths.corpus(), Path(teacher_source(p))] if Path(teacher_source(p)).exists() else [paths.corpus()],
    outs=lambda p, s: [paths.general_student(s) / "model"],
    params=lambda p, s: {"seed": p.seed, "student": p.students[s].model_dump(mode="json"),
                         "general_distillation": p.general_distillation.model_dump(mode="json")},
    code=("distillery/training", "distillery/objectives", "distillery/capture.py", "distillery/layer_map.py",
          "distillery/models.py", "tasks/distill.py"),
)
TASK_DISTILLATION = Stage(
    "task_distillation", run_task_distillation,
    deps=lambda p, item: [paths.task_data(split_item(item)[1]), paths.teacher(split_item(item)[1]) / "model"]
    + ([paths.augmented(split_item(item)[1])] if p.augment.enabled else [])
    + ([paths.general_student(split_item(item)[0]) / "model"] if p.general_distillation.enabled else []),
    outs=lambda p, item: [paths.student(*split_item(item)) / "model"],
    params=lambda p, item: {"seed": p.seed, "max_length": p.data.max_length,
                            "student": p.students[split_item(item)[0]].model_dump(mode="json"),
                            "task_distillation": p.task_distillation.model_dump(mode="json")},
    code=("distillery/training", "distillery/objectives", "distillery/capture.py", "distillery/layer_map.py",
          "distillery/models.py", "distillery/glue", "tasks/distill.py"),
)

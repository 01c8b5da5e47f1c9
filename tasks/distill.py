"""Distillation stages, driven by each student's recipe (`distillery.recipes`):

* `teacher_assistant` (MiniLM students that need one, Sec. 3.3): an L-layer, d'-wide assistant distilled from
  the teacher with the student's own objectives;
* `general_distillation` (per student): TinyBERT / MiniLM layer-wise distillation, DistilBERT's pre-training
  distillation, or MobileBERT's (eq. 4, after the stages of `tasks.transfer`), on the corpus; skipped for students
  initialised from a general checkpoint;
* `task_distillation` (per student and task): TinyBERT's two steps (intermediate layers on the augmented set,
  then the prediction layer over the grid), or fine-tuning over the grid for MiniLM / DistilBERT / MobileBERT
  (then, for DistilBERT with `task_distillation: true`, prediction-layer distillation from the fine-tuned teacher).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.launch import distributed, distributed_params
from tasks.stage import Stage, split_item
from tasks.teacher import checkpoint_options, finish, load_task, teacher_gate, teacher_source, train_options

from distillery.config import Params

TRAINING_CODE = ("distillery/training", "distillery/objectives", "distillery/capture.py", "distillery/layer_map.py",
                 "distillery/models.py", "distillery/recipes.py", "distillery/config.py")


def _assistant_dims(p: Params, student: str):
    """The teacher assistant's dims for a MiniLM student, or None (no assistant)."""
    from distillery.recipes import MiniLMRecipe, student_dims, teacher_assistant_dims

    recipe = p.students[student]
    if not isinstance(recipe, MiniLMRecipe) or not recipe.runs_general:
        return None
    teacher = _teacher_dims(p)
    return teacher_assistant_dims(recipe, student_dims(recipe, teacher, f"students.{student}"), teacher)


def _teacher_dims(p: Params):
    from transformers import AutoConfig

    from distillery.config import teacher_dims
    from distillery.recipes import Dims

    dims = teacher_dims(p, paths.ROOT)
    return dims if dims is not None else Dims.of_config(AutoConfig.from_pretrained(teacher_source(p)))


def needs_assistant(p: Params, student: str) -> bool:
    return _assistant_dims(p, student) is not None


def _corpus_dataset(p: Params, tokenizer):
    from distillery import corpus
    from distillery.training.mlm import tokenize_texts

    gd = p.general_distillation
    texts = corpus.pack_sequences(corpus.read_sentences(paths.corpus()), tokenizer, gd.max_length)
    return tokenize_texts(texts, tokenizer, gd.max_length), len(texts)


def _layer_map(recipe, n_student: int, n_teacher: int):
    from distillery.layer_map import build_layer_map
    from distillery.recipes import MiniLMRecipe

    if isinstance(recipe, MiniLMRecipe):
        return build_layer_map("last", n_student, n_teacher)
    return build_layer_map(recipe.layer_map, n_student, n_teacher)


def run_teacher_assistant(p: Params, student: str) -> dict[str, Any]:
    from transformers import AutoModel, AutoTokenizer

    from distillery.models import build_student
    from distillery.training.distill import distill

    recipe = p.students[student]
    dims = _assistant_dims(p, student)
    source = teacher_source(p)
    tokenizer = AutoTokenizer.from_pretrained(source)
    teacher = AutoModel.from_pretrained(source)
    shape = {"layers": dims.layers, "hidden": dims.hidden, "heads": dims.heads, "intermediate": dims.intermediate}
    assistant = build_student(shape, len(tokenizer), head="base", base=teacher.config)
    train, n = _corpus_dataset(p, tokenizer)
    out = paths.teacher_assistant(student)
    distill(teacher, assistant, train, None, out, layer_map=_layer_map(recipe, dims.layers, dims.layers),
            objectives=recipe.weights, stage="intermediate", tokenizer=tokenizer,
            args=train_options(p.general_distillation, p.seed), **recipe.options())
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics": {"sequences": n, "layers": dims.layers, "hidden": dims.hidden}}


def run_general_distillation(p: Params, student: str) -> dict[str, Any]:
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    from distillery.models import num_layers
    from distillery.recipes import DistilBertRecipe, MobileBertRecipe, init_student
    from distillery.training.distill import distill

    recipe = p.students[student]
    if isinstance(recipe, MobileBertRecipe):
        from tasks.transfer import run_pretraining_distillation

        return run_pretraining_distillation(p, student)
    source = str(paths.teacher_assistant(student) / "model") if needs_assistant(p, student) else teacher_source(p)
    tokenizer = AutoTokenizer.from_pretrained(teacher_source(p))
    out = paths.general_student(student)
    options = train_options(p.general_distillation, p.seed)
    train, n = _corpus_dataset(p, tokenizer)
    if isinstance(recipe, DistilBertRecipe):
        from distillery.training.masking import SmoothedMaskingCollator, masking_weights, token_counts

        teacher = AutoModelForMaskedLM.from_pretrained(source)
        model = init_student(recipe, teacher, tokenizer, head="mlm")
        train = train.select_columns(["input_ids"])
        weights = masking_weights(token_counts(train["input_ids"], len(tokenizer)), recipe.mask_smoothing,
                                  tokenizer.all_special_ids)
        collator = SmoothedMaskingCollator(tokenizer, weights, recipe.mlm_probability, seed=p.seed)
        distill(teacher, model, train, None, out, objectives=recipe.weights, stage="pretraining", tokenizer=tokenizer,
                data_collator=collator, args={**options, **recipe.train_options()}, **recipe.options())
    else:
        teacher = AutoModel.from_pretrained(source)
        model = init_student(recipe, teacher, tokenizer, head="base")
        distill(teacher, model, train, None, out, layer_map=_layer_map(recipe, num_layers(model), num_layers(teacher)),
                objectives=recipe.weights, stage="intermediate", tokenizer=tokenizer, args=options, **recipe.options())
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics": {"sequences": n}}


def _train_set(p: Params, task: str, tokenizer, augmented: bool):
    """The training set and dev, encoded. Augmented (when asked and augmentation is on): the augmented file (the
    first `augment.max_examples` training examples and their variants) plus the training examples it left out,
    so that distillation never sees fewer of the task's examples than fine-tuning does."""
    from datasets import DatasetDict, concatenate_datasets

    from distillery import glue

    data = load_task(task)
    splits = {"train": data["train"], "dev": data["dev"]}
    if augmented and p.augment.enabled:
        splits["train"] = glue.load_split_file(task, paths.augmented(task))
        covered = p.augment.max_examples or len(data["train"])
        if covered < len(data["train"]):
            splits["rest"] = data["train"].select(range(covered, len(data["train"])))
    encoded = glue.encode(DatasetDict(splits), tokenizer, task, p.data.max_length)
    train = encoded["train"]
    if "rest" in encoded:
        keep = [c for c in train.column_names if c in encoded["rest"].column_names]
        train = concatenate_datasets([train.select_columns(keep), encoded["rest"].select_columns(keep)])
    return train, encoded["dev"]


def _task_student(p: Params, student: str, teacher, tokenizer, labels: dict[str, Any]):
    """Where the task stage starts: the general student, or the recipe's init (teacher layers come from the
    fine-tuned teacher, whose classifier is copied too; a checkpoint gets a fresh classifier)."""
    from transformers import AutoModelForSequenceClassification

    from distillery.recipes import init_student

    recipe = p.students[student]
    if recipe.runs_general:
        return _with_student_dropout(p, lambda: AutoModelForSequenceClassification.from_pretrained(
            str(paths.general_student(student) / "model"), **labels))
    return _with_student_dropout(p, lambda: init_student(recipe, teacher, tokenizer, head="sequence-classification",
                                                         **labels))


def _with_student_dropout(p: Params, factory):
    """`factory`, its models given `task_distillation.student_dropout` (unchanged when that is unset)."""
    rate = p.task_distillation.student_dropout
    if rate is None:
        return factory
    from distillery.models import set_dropout

    return lambda: set_dropout(factory(), rate)


def _task_teacher(task: str):
    """(teacher, tokenizer, labels): the fine-tuned teacher of a task, its tokenizer, and the label settings
    (num_labels, id2label, label2id, problem_type) every student of the task is built with."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distillery import glue

    teacher_dir = paths.teacher(task) / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(teacher_dir))
    teacher = AutoModelForSequenceClassification.from_pretrained(str(teacher_dir))
    labels = {"num_labels": glue.get_task(task).num_labels, "id2label": teacher.config.id2label,
              "label2id": teacher.config.label2id}
    if glue.get_task(task).is_regression:
        labels["problem_type"] = "regression"
    return teacher, tokenizer, labels


def run_task_distillation(p: Params, item: str) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification

    from distillery.training.distill import distill
    from distillery.training.grid import prediction_grid

    student, task = split_item(item)
    teacher_gate(p, task)
    recipe = p.students[student]
    teacher, tokenizer, labels = _task_teacher(task)
    start = _task_student(p, student, teacher, tokenizer, labels)
    distilled = recipe.TASK_STAGE == "distill"
    train, dev = _train_set(p, task, tokenizer, augmented=distilled and recipe.augmentation)
    out = paths.student(student, task)
    pr = p.task_distillation.prediction

    def grid_args(g):
        return _grid_args(p, task, g, tokenizer)
    distill_args = dict(cache=pr.cache_teacher_logits, temperature=pr.temperature,
                        regression_target=pr.regression_target,
                        prediction_reduction=getattr(recipe, "prediction_reduction", "paper"))
    curve = None
    if distilled and not recipe.intermediate_step:  # step 2 alone, from where the task stage starts
        grid = prediction_grid(teacher, start, train, dev, out / "grid", **grid_args(pr), **distill_args)
    elif distilled:
        # Step 1: intermediate layers on the augmented set, continuing the general student's projection.
        from distillery.models import num_layers

        step1 = out / "intermediate" / "model"
        if not (step1 / "config.json").is_file():  # else finished before an interruption, under this stage key
            model = start()
            step1 = distill(teacher, model, train, None, out / "intermediate",
                            layer_map=_layer_map(recipe, num_layers(model), num_layers(teacher)),
                            objectives=recipe.weights, stage="intermediate",
                            projection=paths.general_student(student) / "model" if recipe.runs_general else None,
                            tokenizer=tokenizer, args=train_options(p.task_distillation.intermediate, p.seed),
                            **recipe.options())
        finish(out / "intermediate")
        curve = step1 / "train_log.csv"
        # Step 2: prediction layer over the grid; teacher logits computed once and reused by every run.
        # (step 1's saved config carries task_distillation.student_dropout, so the reload keeps it)
        grid = prediction_grid(teacher, lambda: AutoModelForSequenceClassification.from_pretrained(str(step1), **labels),
                               train, dev, out / "grid", **grid_args(pr), **distill_args)
    else:
        grid = prediction_grid(None, start, train, dev, out / "grid", mode="finetune",
                               **grid_args(p.task_distillation.finetune))
        if getattr(recipe, "task_distillation", False):
            best = grid.best_dir
            grid = prediction_grid(teacher, str(best), train, dev, out / "grid-distill", **grid_args(pr), **distill_args)
    result = _keep_best(grid, out)
    result["curve"] = curve or grid.best_dir / "train_log.csv"
    return result


def _grid_args(p: Params, task: str, g, tokenizer) -> dict[str, Any]:
    from distillery.training.metrics import glue_metrics

    compute, main = glue_metrics(task)
    return dict(compute_metrics=compute, main_score=main, learning_rates=g.lrs, batch_sizes=g.batch_sizes,
                epochs=g.epochs, tokenizer=tokenizer, warmup_steps=g.warmup_ratio, seed=p.seed,
                per_device_eval_batch_size=64, save_total_limit=1, logging_steps=5,
                **checkpoint_options(g.checkpoint_steps))


def _keep_best(grid, out: Path) -> dict[str, Any]:
    """Copy the grid's best run to out/model (atomically), drop the runs' checkpoints, report the choice (the files:
    rank 0, under a launcher)."""
    from distillery.io import atomic_dir
    from distillery.training.distributed import is_main

    for run in grid.results:
        finish(Path(run["model_dir"]).parent)
    if is_main():
        with atomic_dir(out / "model") as tmp:
            shutil.copytree(grid.best_dir, tmp, dirs_exist_ok=True)
    best = grid.best
    return {"artifacts": [str(grid.best_dir.parent.parent / "grid.json")], "curve": grid.best_dir / "train_log.csv",
            "metrics": {"best_lr": best["learning_rate"], "best_batch_size": best["batch_size"],
                        "best_dev_main": best["main"]}}


def run_baseline(p: Params, item: str) -> dict[str, Any]:
    """The student trained without distillation (TinyBERT's BERT-small row): its architecture and initialisation
    (random weights, or the fine-tuned teacher's layers, or its checkpoint), then the fine-tuning grid
    `task_distillation.finetune` on the gold labels of the task's own training set (no augmentation)."""
    from distillery.recipes import init_student
    from distillery.training.grid import prediction_grid

    student, task = split_item(item)
    teacher, tokenizer, labels = _task_teacher(task)
    train, dev = _train_set(p, task, tokenizer, augmented=False)
    out = paths.baseline(student, task)
    recipe = p.students[student]
    start = _with_student_dropout(p, lambda: init_student(recipe, teacher, tokenizer, head="sequence-classification",
                                                          **labels))
    grid = prediction_grid(None, start, train, dev, out / "grid", mode="finetune",
                           **_grid_args(p, task, p.task_distillation.finetune, tokenizer))
    return _keep_best(grid, out)


def _teacher_source_deps(p: Params) -> list[Path]:
    """The pre-training stage's MLM teacher (always, so DVC orders the stages), else a local teacher directory."""
    if p.pretrain.enabled:
        return [paths.teacher_mlm() / "model"]
    source = Path(teacher_source(p))
    return [source] if source.exists() else []


def _general_deps(p: Params, s: str) -> list[Path]:
    from distillery.recipes import MobileBertRecipe

    deps = [paths.corpus()]
    if isinstance(p.students[s], MobileBertRecipe):
        from tasks.transfer import pretraining_distillation_deps

        return deps + pretraining_distillation_deps(p, s)
    deps += [paths.teacher_assistant(s) / "model"] if needs_assistant(p, s) else _teacher_source_deps(p)
    return deps + _checkpoint_deps(p, s)


def _checkpoint_deps(p: Params, s: str) -> list[Path]:
    from tasks.data import resolve

    init = p.students[s].init
    if init.kind != "checkpoint":
        return []
    local = resolve(init.checkpoint)
    return [local] if local.exists() else []


def _task_deps(p: Params, item: str) -> list[Path]:
    student, task = split_item(item)
    recipe = p.students[student]
    deps = [paths.task_data(task), paths.teacher(task) / "model"]
    if recipe.TASK_STAGE == "distill" and recipe.augmentation and p.augment.enabled:
        deps.append(paths.augmented(task))
    if recipe.runs_general:
        deps.append(paths.general_student(student) / "model")
    return deps + _checkpoint_deps(p, student)


def _student_params(p: Params, s: str) -> dict[str, Any]:
    return {"seed": p.seed, "student": p.students[s].model_dump(mode="json"),
            "general_distillation": p.general_distillation.model_dump(mode="json"), **distributed_params(p)}


TEACHER_ASSISTANT = Stage(
    "teacher_assistant", distributed(run_teacher_assistant), device="shared",
    deps=lambda p, s: [paths.corpus()] + _teacher_source_deps(p),
    outs=lambda p, s: [paths.teacher_assistant(s) / "model"],
    params=_student_params,
    code=TRAINING_CODE + ("tasks/distill.py",),
)
GENERAL_DISTILLATION = Stage(
    "general_distillation", distributed(run_general_distillation), device="shared",
    deps=_general_deps,
    outs=lambda p, s: [paths.general_student(s) / "model"],
    params=_student_params,
    code=TRAINING_CODE + ("distillery/corpus.py", "distillery/ib_teacher.py", "tasks/distill.py", "tasks/transfer.py"),
)
BASELINE = Stage(
    "baseline", distributed(run_baseline), device="shared",
    deps=lambda p, item: [paths.task_data(split_item(item)[1]), paths.teacher(split_item(item)[1]) / "model"]
    + _checkpoint_deps(p, split_item(item)[0]),
    outs=lambda p, item: [paths.baseline(*split_item(item)) / "model"],
    params=lambda p, item: {"seed": p.seed, "max_length": p.data.max_length,
                            "student": p.students[split_item(item)[0]].model_dump(mode="json"),
                            "direct_finetune": p.task_distillation.finetune.model_dump(mode="json"),
                            "student_dropout": p.task_distillation.student_dropout,
                            **distributed_params(p)},
    code=TRAINING_CODE + ("distillery/glue", "tasks/distill.py", "tasks/teacher.py"),
)
TASK_DISTILLATION = Stage(
    "task_distillation", distributed(run_task_distillation), device="shared",
    deps=_task_deps,
    outs=lambda p, item: [paths.student(*split_item(item)) / "model"],
    params=lambda p, item: {"seed": p.seed, "max_length": p.data.max_length,
                            "student": p.students[split_item(item)[0]].model_dump(mode="json"),
                            "augment": p.augment.enabled,
                            "task_distillation": p.task_distillation.model_dump(mode="json"),
                            "min_gain_over_trivial": p.finetune.min_gain_over_trivial, **distributed_params(p)},
    code=TRAINING_CODE + ("distillery/glue", "tasks/distill.py", "tasks/teacher.py"),
)

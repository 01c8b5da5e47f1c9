"""Distillation stages. Each student's recipe (`distillery.recipes`) says what they do; this module prepares their
context (teacher, tokenizer, datasets, output directory, schedule, seed), asks the recipe, and writes the results:

* student stages (per student): one pipeline stage per student-level stage the registered recipes declare
  (`Recipe.STUDENT_STAGES`: its name and the folder of `models/` it writes), run for the students whose recipe adds
  it, in the recipe's order; the task stage starts from the last one's model;
* `task_distillation` (per student and task): the recipe's task stage (TinyBERT's two steps, BERT-PKD's patient
  distillation, or fine-tuning over the grid), its best grid run copied to the student's output;
* `baseline` (per student and task): the same student trained without a teacher.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from tasks import paths
from tasks.stage import SkipStage, Stage, skipped, split_item
from tasks.teacher import (checkpoint_options, encoding, finish, load_task, teacher_gate, teacher_source,
                           train_options)

from distillery.config import Params
from distillery.recipes import student_stage_folders
from distillery.task_kinds import task_kind

TRAINING_CODE = ("distillery/training", "distillery/objectives", "distillery/capture.py", "distillery/layer_map.py",
                 "distillery/models.py", "distillery/recipes", "distillery/ib_teacher.py", "distillery/pruning.py",
                 "distillery/ib_pruning.py", "distillery/corpus.py",
                 "distillery/config.py", "distillery/task_kinds.py", "distillery/squad", "tasks/distill.py")

#: Every student-level stage the recipes declare -> the folder of `models/` it writes.
STUDENT_STAGE_FOLDERS = student_stage_folders()


def stage_dir(stage: str, student: str) -> Path:
    """Where a student-level stage writes for one student (`<dir>/model`)."""
    return paths.student_stage(STUDENT_STAGE_FOLDERS[stage], student)


def teacher_dims(p: Params):
    """The teacher's dims: from params (a scratch shape, a local config.json), else its Hub config."""
    from transformers import AutoConfig

    from distillery.preflight import declared_teacher_dims
    from distillery.errors import InputNotFoundError
    from distillery.models import Dims

    dims = declared_teacher_dims(p, paths.ROOT)
    if dims is not None:
        return dims
    source = str(teacher_source(p))
    if source.startswith((".", "/", "~")) and not Path(source).expanduser().exists():  # a path, not a Hub id
        raise InputNotFoundError(f"teacher.name_or_path: {source}: no such directory")
    return Dims.of_config(AutoConfig.from_pretrained(source))


def chosen(student: str) -> dict[str, Any] | None:
    """A budgeted student's search result (`tasks.search`: search.json), None before its search ran or where it
    skipped."""
    import json

    f = paths.search(student) / "search.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else None


def recipe_of(p: Params, student: str):
    """The student's recipe; a budgeted student's with the shape its search chose (`tasks.search`). A stage of a
    budgeted student whose search skipped (no teacher passed the gate) skips too (`SkipStage`, with the reason)."""
    recipe = p.students[student]
    if recipe.budget is None:
        return recipe
    if (found := chosen(student)) is None:
        reason = skipped(paths.search(student))
        if reason is None:
            from distillery.errors import InputNotFoundError

            raise InputNotFoundError(f"{paths.search(student) / 'search.json'}: {student} has a budget and its search "
                                     f"has not run: run it first (python -m flows.stage search --item {student}, or "
                                     "--upstream)")
        raise SkipStage(f"{student}: its search skipped: {reason}", f"its search skipped: {reason}")
    return recipe.with_shape(found["winner"]["shape"])


def student_stages(p: Params, student: str) -> dict:
    """The student-level stages the student's recipe adds, in order."""
    return p.students[student].stages(teacher_dims(p))


def students_with(p: Params, stage: str) -> list[str]:
    return [s for s in p.students if stage in student_stages(p, s)]


def general_student(p: Params, student: str) -> Path | None:
    """The model the student's task stage starts from: its last student-level stage's, if it has any."""
    names = list(student_stages(p, student))
    return stage_dir(names[-1], student) / "model" if names else None


def _earlier(p: Params, student: str, stage: str) -> list[str]:
    names = list(student_stages(p, student))
    return names[:names.index(stage)] if stage in names else names


def _stage_context(p: Params, student: str, stage: str):
    from distillery.recipes import StageContext

    schedule = getattr(p, student_stages(p, student)[stage].schedule)  # a params section: pretrain / general_distillation
    return StageContext(student=student, teacher=teacher_source(p), corpus=paths.corpus(),
                        out=stage_dir(stage, student), schedule=schedule,
                        args=train_options(schedule, p.seed), seed=p.seed,
                        inputs={s: stage_dir(s, student) / "model" for s in _earlier(p, student, stage)})


def run_student_stage(p: Params, student: str, stage: str) -> dict[str, Any]:
    ctx = _stage_context(p, student, stage)
    result = student_stages(p, student)[stage].run(ctx)
    final = finish(ctx.out)
    return {"curve": final / "train_log.csv", **result}


# ------------------------------------------------------------------------------------------------ the task stage

def _task_teacher(task: str):
    """(teacher, tokenizer, labels): the fine-tuned teacher of a task, its tokenizer, and the label settings
    (num_labels, id2label, label2id, problem_type) every student of the task is built with."""
    from transformers import AutoTokenizer

    from distillery.models import load_model

    kind = task_kind(task)
    teacher_dir = paths.teacher(task) / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(teacher_dir))
    teacher = load_model(teacher_dir, head=kind.head)
    return teacher, tokenizer, kind.model_kwargs(teacher.config)


def _train_set(p: Params, task: str, tokenizer, augmented: bool, unlabeled: bool = False):
    """The training set and dev, encoded, and the training set's rows of each kind (gold, augmented, unlabelled).
    Augmented (when asked and augmentation is on): the augmented file (the first `augment.max_examples` training
    examples and their variants) plus the training examples it left out, so that distillation never sees fewer of the
    task's examples than fine-tuning does. Unlabeled (when asked): the task's unlabelled rows after them
    (`distillery.unlabeled`: the teacher labels them; their gold label is the unlabelled marker)."""
    from datasets import DatasetDict, concatenate_datasets

    from distillery import glue
    from distillery.unlabeled import SPLIT

    kind = task_kind(task, p.data)
    data = load_task(task, unlabeled=unlabeled)
    splits = {"train": data["train"], "dev": data["dev"]}
    if augmented and p.augment.enabled and kind.augmentable:
        splits["train"] = glue.load_split_file(task, paths.augmented(task))
        covered = p.augment.max_examples or len(data["train"])
        if covered < len(data["train"]):
            splits["rest"] = data["train"].select(range(covered, len(data["train"])))
    if unlabeled and SPLIT in data:
        splits[SPLIT] = data[SPLIT]
    encoded = kind.encode(DatasetDict(splits), tokenizer, p.data.max_length)
    if SPLIT in encoded and "labels" not in encoded[SPLIT].column_names:  # the encoder drops a split's no-labels
        from distillery.glue.loaders import unlabeled_value

        feature = encoded["train"].features["labels"]
        marker = [unlabeled_value(kind.spec)] * len(encoded[SPLIT])
        encoded[SPLIT] = encoded[SPLIT].add_column("labels", marker).cast_column("labels", feature)
    parts = [encoded[s] for s in ("train", "rest", SPLIT) if s in encoded]
    keep = [c for c in parts[0].column_names if all(c in part.column_names for part in parts)]
    train = concatenate_datasets([part.select_columns(keep) for part in parts]) if len(parts) > 1 else parts[0]
    n_unlabeled = len(encoded[SPLIT]) if SPLIT in encoded else 0
    rows = {"gold": len(data["train"]), "augmented": len(train) - len(data["train"]) - n_unlabeled,
            "unlabeled": n_unlabeled}
    return train, encoded["dev"], rows


def _grid(p: Params, task: str, tokenizer, section, dev: Callable[[], Any]):
    """A grid section of params as the training layer's `Grid` and a `TrainRun` template (metrics, seed, logging)."""
    from distillery.config import PredictionSection
    from distillery.training.spec import Grid, TrainRun

    kind = task_kind(task, p.data)
    compute, main = kind.training_metrics(lambda: (load_task(task)["dev"], dev()), tokenizer.pad_token_id)
    cache = section.cache_teacher_logits if isinstance(section, PredictionSection) else True
    cache = cache and kind.caches_teacher_logits
    grid = Grid(learning_rates=tuple(section.learning_rates), batch_sizes=tuple(section.batch_sizes),
                epochs=section.epochs, cache_teacher_logits=cache)
    args = {**kind.train_args, "warmup_steps": section.warmup_ratio, "seed": p.seed, "per_device_eval_batch_size": 64,
            "save_total_limit": 1, "logging_steps": 5, **checkpoint_options(section.checkpoint_steps)}
    return grid, TrainRun(paths.ROOT, None, tokenizer=tokenizer, args=args, compute_metrics=compute, main_score=main)


def task_context(p: Params, item: str, out: Path, *, general: bool = True):
    """The context of a student's task stage (``general``: start from its general student when it has one)."""
    from distillery.recipes import TaskContext

    student, task = split_item(item)
    kind = task_kind(task, p.data)
    seen: dict[str, int] = {}
    teacher, tokenizer, labels = _task_teacher(task)
    encoded: dict[tuple[bool, bool], tuple] = {}

    def data(augmented: bool, unlabeled: bool = False):
        key = (augmented, unlabeled and p.data.unlabeled is not None)
        if key not in encoded:
            train, dev, rows = _train_set(p, task, tokenizer, *key)
            encoded[key] = (train, dev)
            for kind_, n in rows.items():  # what the stage's students saw: the most of each kind any step read
                seen[kind_] = max(seen.get(kind_, 0), n)
        return encoded[key]

    return TaskContext(student=student, task=task, teacher=teacher, tokenizer=tokenizer, labels=labels, data=data,
                       out=out, sections=p.task_distillation,
                       train_args=lambda s: train_options(s, p.seed, **kind.train_args),
                       grid=lambda s: _grid(p, task, tokenizer, s, lambda: data(False)[1]), rows=seen,
                       general=general_student(p, student) if general else None,
                       head=kind.head, pretrained=teacher_source(p))


def run_task_distillation(p: Params, item: str) -> dict[str, Any]:
    student, task = split_item(item)
    teacher_gate(p, task)
    ctx = task_context(p, item, paths.student(student, task))
    grid, curve = recipe_of(p, student).run_task(ctx)
    result = _keep_best(grid, ctx.out)
    result["curve"] = curve or grid.best_dir / "train_log.csv"
    from distillery.io import write_json
    from distillery.training.distributed import is_main

    rows = {f"train_rows_{kind}": n for kind, n in ctx.rows.items()}  # the most rows of each kind one step read
    if is_main():
        write_json(ctx.out / "rows.json", rows)
    result["metrics"].update(rows)
    return result


def run_baseline(p: Params, item: str) -> dict[str, Any]:
    """The student trained without distillation (TinyBERT's BERT-small row): its architecture and initialisation,
    then the fine-tuning grid `task_distillation.finetune` on the gold labels of the task's own training set."""
    student, task = split_item(item)
    ctx = task_context(p, item, paths.baseline(student, task), general=False)
    return _keep_best(recipe_of(p, student).direct_stage(ctx), ctx.out)


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


# ------------------------------------------------------------------------------------------------ declarations

def _teacher_source_deps(p: Params) -> list[Path]:
    """The pre-training stage's MLM teacher (always, so DVC orders the stages), else a local teacher directory."""
    if p.pretrain.enabled:
        return [paths.teacher_mlm() / "model"]
    source = Path(teacher_source(p))
    return [source] if source.exists() else []


def _checkpoint_deps(p: Params, s: str) -> list[Path]:
    from tasks.data import resolve

    init = p.students[s].init
    if init.kind != "checkpoint":
        return []
    local = resolve(init.checkpoint)
    return [local] if local.exists() else []


def _student_stage(name: str) -> Stage:
    """A student-level stage: reads the corpus, the teacher and the student's earlier stages."""

    def run(p: Params, s: str) -> dict[str, Any]:
        return run_student_stage(p, s, name)

    def deps(p: Params, s: str) -> list[Path]:
        earlier = [stage_dir(e, s) / "model" for e in _earlier(p, s, name)]
        return [paths.corpus()] + _teacher_source_deps(p) + earlier + _checkpoint_deps(p, s)

    def params(p: Params, s: str) -> dict[str, Any]:
        schedule = student_stages(p, s)[name].schedule
        return {"seed": p.seed, "student": p.students[s].model_dump(mode="json"),
                schedule: getattr(p, schedule).model_dump(mode="json")}

    run.__name__ = run.__qualname__ = f"run_{name}"
    globals()[run.__name__] = run  # the launcher (tasks.launch) finds a stage body as MODULE:FUNCTION in its ranks
    return Stage(name, run, device="shared", distributed=True, deps=deps, curve=True,
                 outs=lambda p, s: [stage_dir(name, s) / "model"], params=params, code=TRAINING_CODE)


#: One pipeline stage per student-level stage the recipes declare, in their order.
STUDENT_STAGES = tuple(_student_stage(name) for name in STUDENT_STAGE_FOLDERS)


def search_deps(p: Params, student: str) -> list[Path]:
    """A budgeted student's search result (its shape and deployed form), for the stages that read it."""
    return [paths.search(student)] if p.students[student].budget is not None else []


def task_inputs(p: Params, item: str) -> list[Path]:
    """What a student's task stage reads besides its search: the task's data and teacher, the augmented set when its
    recipe trains on it, its general student or the pre-trained teacher it starts from, its init checkpoint."""
    student, task = split_item(item)
    recipe = p.students[student]
    deps = [paths.task_data(task), paths.teacher(task) / "model"]
    if recipe.uses_augmented_data and p.augment.enabled and task_kind(task).augmentable:
        deps.append(paths.augmented(task))
    if (start := general_student(p, student)) is not None:
        deps.append(start)
    elif recipe.starts_from_pretrained_layers:  # its layers come from the pre-trained teacher (`task_student`)
        deps += _teacher_source_deps(p)
    return deps + _checkpoint_deps(p, student)


def _task_deps(p: Params, item: str) -> list[Path]:
    return task_inputs(p, item) + search_deps(p, split_item(item)[0])


def _baseline_deps(p: Params, item: str) -> list[Path]:
    """The task's data and teacher; the pre-trained teacher too for a student that starts there (`task_student`)."""
    student, task = split_item(item)
    deps = [paths.task_data(task), paths.teacher(task) / "model"]
    if p.students[student].starts_from_pretrained_layers:
        deps += _teacher_source_deps(p)
    return deps + _checkpoint_deps(p, student) + search_deps(p, student)


BASELINE = Stage(
    "baseline", run_baseline, device="shared", distributed=True,
    deps=_baseline_deps,
    outs=lambda p, item: [paths.baseline(*split_item(item)) / "model"],
    params=lambda p, item: {"seed": p.seed, **encoding(p, split_item(item)[1]),
                            "student": p.students[split_item(item)[0]].model_dump(mode="json"),
                            "direct_finetune": p.task_distillation.finetune.model_dump(mode="json"),
                            "student_dropout": p.task_distillation.student_dropout},
    code=TRAINING_CODE + ("distillery/glue", "tasks/teacher.py"),
)
TASK_DISTILLATION = Stage(
    "task_distillation", run_task_distillation, device="shared", distributed=True, curve=True,
    deps=_task_deps,
    outs=lambda p, item: [paths.student(*split_item(item)) / "model"],
    params=lambda p, item: {"seed": p.seed, **encoding(p, split_item(item)[1]),
                            "student": p.students[split_item(item)[0]].model_dump(mode="json"),
                            "augment": p.augment.enabled,
                            "task_distillation": p.task_distillation.model_dump(mode="json"),
                            "min_gain_over_trivial": p.teacher_finetune.min_gain_over_trivial},
    code=TRAINING_CODE + ("distillery/glue", "tasks/teacher.py"),
)

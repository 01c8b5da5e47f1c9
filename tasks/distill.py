"""Distillation stages. Each student's recipe (`distillery.recipes`) says what they do; this module hands the library
their inputs as paths (the corpus, the teacher, the task's files, the output directory), asks for the stages and the
plan, and writes the results:

* student stages (per student): one pipeline stage per student-level stage the registered recipes declare
  (`Recipe.STUDENT_STAGES`: its name and the folder of `models/` it writes), run for the students whose recipe adds
  it, in the recipe's order; the task stage starts from the last one's model;
* `task_distillation` (per student and task): the recipe's plan (TinyBERT's two steps, BERT-PKD's patient
  distillation, or fine-tuning over the grid), run by `distillery.training.plan.run_plan`, its best grid run copied to
  the student's output;
* `baseline` (per student and task): the same student trained without a teacher (`distillery.recipes.direct_plan`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.stage import SkipStage, Stage, skipped, split_item
from tasks.teacher import encoding, finish, teacher_gate, teacher_source

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
    from distillery.shape import Dims

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
    from distillery.recipes import with_shape

    return with_shape(recipe, found["winner"]["shape"])


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
                        args=schedule.train_args(p.seed), seed=p.seed,
                        inputs={s: stage_dir(s, student) / "model" for s in _earlier(p, student, stage)})


def run_student_stage(p: Params, student: str, stage: str) -> dict[str, Any]:
    ctx = _stage_context(p, student, stage)
    result = student_stages(p, student)[stage].run(ctx)
    final = finish(ctx.out)
    return {"curve": final / "train_log.csv", **result}


# ------------------------------------------------------------------------------------------------ the task stage

def student_plan(p: Params, student: str, *, direct: bool = False):
    """The student's task-stage plan (its direct baseline's with ``direct``): its recipe's (`distillery.recipes.
    task_plan`). A budgeted student's before its search is planned at the teacher's width and depth: which data and
    starts a plan reads does not depend on the shape (its stage keys and DVC deps)."""
    from distillery.recipes import at_teacher_shape, direct_plan, task_plan

    recipe, dims = p.students[student], teacher_dims(p)
    if recipe.budget is not None:
        recipe = at_teacher_shape(recipe, dims)
    return direct_plan(recipe) if direct else task_plan(recipe, dims, p.task_distillation)


def task_files(p: Params, item: str):
    """What a student's task stage reads, as paths (`distillery.training.task_data.TaskFiles`)."""
    from distillery.training.task_data import TaskFiles

    student, task = split_item(item)
    kind = task_kind(task, p.data)
    augmented = p.augment.enabled and kind.augmentable
    return TaskFiles(task=task, kind=kind, prepared=paths.task_data(task), teacher=paths.teacher(task) / "model",
                     max_length=p.data.max_length, augmented=paths.augmented(task) if augmented else None,
                     covered=p.augment.max_examples, unlabeled=p.data.unlabeled is not None,
                     general=general_student(p, student), pretrained=teacher_source(p))


def run_task_distillation(p: Params, item: str) -> dict[str, Any]:
    from distillery.recipes import task_plan
    from distillery.shape import Dims
    from distillery.training.plan import run_plan
    from distillery.training.task_data import open_task

    student, task = split_item(item)
    teacher_gate(p, task)
    out, recipe, opened = paths.student(student, task), recipe_of(p, student), open_task(task_files(p, item), p.seed)
    dims = Dims.of_config(opened.teacher.config) if opened.teacher is not None else teacher_dims(p)  # predictions
    plan = task_plan(recipe, dims, p.task_distillation)
    done = run_plan(plan, opened, p.task_distillation, out)
    result = _keep_best(done.grid, out, done.rows)
    result["curve"] = done.curve
    return result


def run_baseline(p: Params, item: str) -> dict[str, Any]:
    """The student trained without distillation (TinyBERT's BERT-small row): its architecture and initialisation,
    then the fine-tuning grid `task_distillation.finetune` on the gold labels of the task's own training set."""
    from distillery.recipes import direct_plan
    from distillery.training.plan import run_plan
    from distillery.training.task_data import open_task

    student, task = split_item(item)
    out = paths.baseline(student, task)
    task = open_task(task_files(p, item), p.seed)
    done = run_plan(direct_plan(recipe_of(p, student)), task, p.task_distillation, out)
    return _keep_best(done.grid, out, done.rows)


def _keep_best(grid, out: Path, rows: dict[str, int]) -> dict[str, Any]:
    """Copy the grid's best run to out/model (atomically), drop the runs' checkpoints, report the choice and, in
    out/rows.json, the training rows of each kind (the most one step read; the files: rank 0, under a launcher)."""
    from distillery.io import atomic_dir, write_json
    from distillery.training.distributed import is_main

    rows = {f"train_rows_{kind}": n for kind, n in rows.items()}

    for run in grid.results:
        finish(Path(run["model_dir"]).parent)
    if is_main():
        with atomic_dir(out / "model") as tmp:
            shutil.copytree(grid.best_dir, tmp, dirs_exist_ok=True)
        write_json(out / paths.ROWS, rows)
    best = grid.best
    return {"artifacts": [str(grid.best_dir.parent.parent / "grid.json")], "curve": grid.best_dir / "train_log.csv",
            "metrics": {"best_lr": best["learning_rate"], "best_batch_size": best["batch_size"],
                        "best_dev_main": best["main"], **rows}}


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
    plan = student_plan(p, student)
    deps = [paths.task_data(task), paths.teacher(task) / "model"]
    if plan.augmented and p.augment.enabled and task_kind(task).augmentable:
        deps.append(paths.augmented(task))
    if (start := general_student(p, student)) is not None:
        deps.append(start)
    elif plan.pretrained:  # its layers come from the pre-trained teacher
        deps += _teacher_source_deps(p)
    return deps + _checkpoint_deps(p, student)


def _task_deps(p: Params, item: str) -> list[Path]:
    return task_inputs(p, item) + search_deps(p, split_item(item)[0])


def _baseline_deps(p: Params, item: str) -> list[Path]:
    """The task's data and teacher; the pre-trained teacher too for a student that starts there."""
    student, task = split_item(item)
    deps = [paths.task_data(task), paths.teacher(task) / "model"]
    if student_plan(p, student, direct=True).pretrained:
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

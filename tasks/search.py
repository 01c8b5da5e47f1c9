"""The search stage: a student with a latency budget instead of a shape (``students.<name>.budget``) gets its shape and
deployed form here, on the machine that runs the stage (AutoTinyBERT's constraint in, architecture out,
with every candidate timed instead of predicted).

1. Every candidate shape the recipe can train (`distillery.recipes.checks.budget_shapes`) is built with random
   weights in every deployed form and timed beside the fp32 teacher (`distillery.efficiency.budget`); those over the
   budget are dropped.
2. ``shapes`` of the shapes that meet it (each in its most faithful form that does; the largest of each depth first,
   `finalists`), each timed again alone beside the teacher (`confirm`: one that no longer meets the budget gives
   its place to the next), are trained with the task stage their recipe gives them, on ``train_examples`` training
   examples of each task, and scored by their mean dev retention over the tasks; the better half goes on with twice
   the examples until one is left (successive halving). Every task stage of this student then trains the winner fully
   (`tasks.distill.recipe_of`).

Writes ``models/search/<student>/search.json`` (the budget, the teacher's time, every candidate's time, speedup,
parameters and round scores, the winner) and ``pareto.png`` (latency vs mean retention).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.distill import TRAINING_CODE, chosen, task_files, task_inputs, teacher_dims
from tasks.execute import say
from tasks.stage import SkipStage, Stage
from tasks.teacher import encoding, gate_failure, teacher_main

from distillery.config import Params


def budgeted(p: Params) -> list[str]:
    """The students that give a budget instead of a shape."""
    return [s for s, recipe in p.students.items() if recipe.budget is not None]


def run_search(p: Params, student: str) -> dict[str, Any]:
    from distillery.efficiency.budget import (Candidate, available_forms, confirm, successive_halving, time_candidates,
                                              within_budget)
    from distillery.io import atomic_dir, write_json
    from distillery.models import load_model
    from distillery.recipes import budget_shapes, task_plan, with_shape
    from distillery.shape import Dims
    from distillery.training.plan import run_plan
    from distillery.training.task_data import open_task
    from distillery.report import retention, search_plot
    from distillery.task_kinds import task_kind

    tasks = [t for t in p.data.tasks if gate_failure(p, t) is None]
    if not tasks:
        raise SkipStage(f"search[{student}]: every task's teacher failed the gate: nothing to search on",
                        "every task's teacher failed the gate")
    recipe, key = p.students[student], f"students.{student}"
    spec = recipe.budget
    budget = spec.budget(p.evaluation.latency_seq_len)
    shapes = budget_shapes(recipe, teacher_dims(p), key)
    from distillery.precision import resolve

    # the forms the evaluate stage measures: bf16 only where the run's precision is bf16
    served = [f for f in available_forms() if f != "bf16" or resolve(p.precision) == "bf16"]
    forms = [f for f in (spec.forms or served) if f in served]
    cands = [Candidate(**shape, form=form) for shape in shapes for form in forms]
    teacher = load_model(paths.teacher(tasks[0]) / "model", head=task_kind(tasks[0]).head).eval()
    say(f"search[{student}]: timing the teacher and {len(cands)} candidates ({budget.describe()})")
    teacher_ms, timed = time_candidates(teacher, cands, budget)
    keep = within_budget(timed, teacher_ms, budget)
    final = confirm(teacher, keep, budget, spec.shapes)  # each finalist timed again alone beside the teacher
    del teacher
    by_name = {t.candidate.shape_name: t for t in final}
    teachers = {task: teacher_main(task) for task in tasks}
    opened = {task: open_task(task_files(p, f"{student}:{task}"), p.seed) for task in tasks}
    dims = {task: Dims.of_config(opened[task].teacher.config) for task in tasks}

    def score(name: str, examples: int) -> float:
        shaped = with_shape(recipe, by_name[name].candidate.shape)
        kept = []
        for task in tasks:  # the first `examples` of each shuffled training set (and its whole dev set)
            brief = dataclasses.replace(opened[task], train_examples=examples, rows={})
            with tempfile.TemporaryDirectory(prefix="distillery-search-") as tmp:
                done = run_plan(task_plan(shaped, dims[task], p.task_distillation), brief, p.task_distillation,
                                Path(tmp))
                main = done.grid.best["main"]
            kept.append(retention(main, teachers[task]) if teachers[task] > 0 else main)
        mean = sum(kept) / len(kept)
        say(f"search[{student}]: {name} ({by_name[name].candidate.form}, {by_name[name].ms:.2f} ms) on {examples} "
            f"examples per task: mean dev retention {mean:.3f}")
        return mean

    which = f"{len(final)} enter the halving" if len(final) > 1 else "the largest, untrained"
    say(f"search[{student}]: {len(keep)} of {len(timed)} candidates meet the budget; {which}: "
        + ", ".join(f"{t.candidate.name} ({t.ms:.2f} ms)" for t in final))
    winner, rounds = successive_halving(list(by_name), score, spec.train_examples)
    best = by_name[winner]
    limit = budget.limit_ms(teacher_ms)
    again = {t.candidate.name: t for t in final}  # the finalists' second timing, alone beside the teacher
    rows = [{"name": t.candidate.name, "shape": t.candidate.shape, "form": t.candidate.form, "ms": round(t.ms, 4),
             "ms_p90": round(t.ms_high, 4), "speedup": round(t.speedup, 3), "speedup_p10": round(t.speedup_low, 3),
             "params": t.params, "meets_budget": budget.met_by(t), "finalist": t.candidate.name in again,
             **({"alone": {"ms": round(a.ms, 4), "ms_p90": round(a.ms_high, 4), "speedup": round(a.speedup, 3),
                           "speedup_p10": round(a.speedup_low, 3)}} if (a := again.get(t.candidate.name)) else {}),
             "scores": [r[t.candidate.shape_name] for r in rounds
                        if t.candidate.name in again and t.candidate.shape_name in r]} for t in timed]
    result = {"budget": budget.describe(), "limit_ms": round(limit, 4), "teacher_ms": round(teacher_ms, 4),
              "tasks": tasks, "teacher_scores": teachers, "rounds": rounds, "candidates": rows,
              "winner": {"shape": best.candidate.shape, "form": best.candidate.form, "ms": round(best.ms, 4),
                         "speedup": round(best.speedup, 3), "speedup_p10": round(best.speedup_low, 3),
                         "params": best.params, "name": best.candidate.name}}
    out = paths.search(student)
    with atomic_dir(out) as tmp:
        write_json(tmp / "search.json", result)
        search_plot(rows, teacher_ms, limit, best.candidate.name, tmp / "pareto.png")
    say(f"search[{student}]: chosen {best.candidate.name}: {best.ms:.2f} ms, {best.speedup:.2f}x the fp32 "
        f"teacher ({teacher_ms:.2f} ms; at least {best.speedup_low:.2f}x in 9 of 10 rounds, timed alone beside it), "
        f"{best.params / 1e6:.2f} M parameters")
    return {"metrics": {"teacher_ms": teacher_ms, "chosen_ms": best.ms, "chosen_speedup": best.speedup,
                        "chosen_params": best.params, "candidates_timed": len(timed),
                        "candidates_in_budget": sum(r["meets_budget"] for r in rows), "finalists": len(final),
                        **{f"retention.{n}.r{i}": s for i, r in enumerate(rounds) for n, s in r.items()}},
            "artifacts": [out / "search.json", out / "pareto.png"]}


def _deps(p: Params, student: str) -> list[Path]:
    return list(dict.fromkeys(d for t in p.data.tasks for d in task_inputs(p, f"{student}:{t}")))


def _params(p: Params, student: str) -> dict[str, Any]:
    encodings = {k: v for t in p.data.tasks for k, v in encoding(p, t).items()}
    return {"seed": p.seed, "tasks": p.data.tasks, **encodings, "student": p.students[student].model_dump(mode="json"),
            "augment": p.augment.enabled, "task_distillation": p.task_distillation.model_dump(mode="json"),
            "min_gain_over_trivial": p.teacher_finetune.min_gain_over_trivial,
            "latency_seq_len": p.evaluation.latency_seq_len}


SEARCH = Stage("search", run_search, device="exclusive", deps=_deps, outs=lambda p, s: [paths.search(s)],
               params=_params, code=TRAINING_CODE + ("distillery/efficiency", "distillery/report.py", "distillery/glue",
                                                     "tasks/teacher.py", "tasks/search.py"))


def budget_lines(p: Params, summary: dict[str, Any]) -> list[str]:
    """One line per budgeted student and task: the shape and form its search chose, and what the evaluate stage
    measured of that form (retention, speedup at the budget's batch over the fp32 teacher, gain over the direct
    baseline)."""
    from distillery.efficiency.spread import describe_speedup, speed_of
    from distillery.report import retention, task_score

    lines = []
    for student in budgeted(p):
        if (found := chosen(student)) is None:
            continue
        w = found["winner"]
        row_name = student if w["form"] == "fp32" else f"{student}-{w['form']}"
        batch = p.students[student].budget.batch
        for task, models in summary.items():
            row, teacher = models.get(row_name), models.get("teacher", {})
            if row is None or task_score(task, teacher) is None:
                continue
            kept = retention(task_score(task, row), task_score(task, teacher))
            speed = describe_speedup(*speed_of(row, f"_b{batch}"))
            gain = models.get(student, {}).get("gain_over_direct")
            lines.append(f"{task}: budget {found['budget']}: {student} is {w['name']} (the search's choice of "
                         f"{len(found['candidates'])} timed, {w['speedup']:.1f}x there, "
                         f"at least {w.get('speedup_p10', w['speedup']):.1f}x in 9 of 10 rounds)"
                         + (f", retention {kept:.2f}" if kept is not None else "")
                         + (f", {speed} the fp32 teacher in the evaluate stage" if speed != "-" else "")
                         + (f", {100 * gain:+.1f} points over its direct baseline (fp32)" if gain is not None else ""))
    return lines

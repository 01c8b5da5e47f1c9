"""``distillery plan``: what each student of a params file goes through, stage by stage and step by step, without
running anything (the recipes' plans, `distillery.recipes.steps`)."""

from __future__ import annotations

from pathlib import Path


def plan_lines(path: str | Path, students: list[str] | None = None) -> list[str]:
    """The plan of every student (or of ``students``) of the params file at ``path``, as text lines."""
    from distillery.errors import UserError
    from distillery.preflight import declared_teacher_dims, load_params
    from distillery.recipes.checks import at_teacher_shape
    from distillery.recipes.steps import direct_plan, task_plan

    p = load_params(path)
    dims = declared_teacher_dims(p, Path(path).resolve().parent)
    if dims is None:
        from transformers import AutoConfig

        from distillery.shape import Dims

        dims = Dims.of_config(AutoConfig.from_pretrained(p.teacher.name_or_path))
    unknown = [s for s in students or [] if s not in p.students]
    if unknown:
        raise UserError(f"{path}: no student {unknown[0]!r}; the students are {', '.join(p.students)}")
    lines = []
    for name in students or p.students:
        recipe = p.students[name]
        if recipe.budget is not None:  # planned at the teacher's shape: the search picks the real one
            shape = "a budget (" + recipe.budget.budget(p.evaluation.latency_seq_len).describe() + "), planned here "\
                    "at the teacher's shape"
            recipe = at_teacher_shape(recipe, dims)
        else:
            s = recipe.shape.resolve()
            shape = f"{s.arch} {s.layers} x {s.hidden} ({s.heads} heads, FFN {s.intermediate})"
        stages = list(recipe.stages(dims))
        lines += [f"{name} ({recipe.recipe}): {shape}, init {recipe.init.kind}",
                  f"  student stages: {', '.join(stages) if stages else 'none'}",
                  "  task stage, on each task:"]
        lines += [f"    {line}" for line in task_plan(recipe, dims, p.task_distillation).describe(p.task_distillation,
                                                                                                 bool(stages))]
        lines += ["  direct baseline:"]
        lines += [f"    {line}" for line in direct_plan(recipe).describe(p.task_distillation)]
    return lines


def _plan(args) -> int:
    print("\n".join(plan_lines(args.params, args.student)))
    return 0


def add_commands(subparsers) -> None:
    cmd = subparsers.add_parser("plan", help="print what each student goes through (its stages and task-stage steps)")
    cmd.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    cmd.add_argument("--student", action="append", help="only this student (repeatable)")
    cmd.set_defaults(func=_plan)

"""A recipe checked against the teacher before any work: each problem one `RecipeError` naming the params key.

`verify` is what the pre-flight calls: `check_student` for a student of a shape (the recipe's own `Recipe.check`, or,
for a student cut from its distilled twin, the twin's), and for a budget that its candidate shapes can be searched.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from distillery.recipes.schema import LAYER_INITS, RecipeError, Shape, TeacherLayersInit, with_shape
from distillery.shape import Dims


def student_dims(recipe, teacher: Dims, key: str) -> Dims:
    """The student's dims (the resolved shape), raising RecipeError naming ``key`` on an impossible one."""
    from distillery.shape import ModelConfigError

    try:
        shape = recipe.shape.resolve()
    except ModelConfigError as exc:
        raise RecipeError(f"{key}.shape: {exc}") from None
    return replace(shape, vocab=teacher.vocab)


def cuts_distilled_student(recipe) -> bool:
    """``init: {pruned: {source: student}}``: the student is cut from its distilled wide twin (`steps.task_plan`)."""
    return recipe.init.kind == "pruned" and recipe.init.source == "student"


def wide_student(recipe, teacher: Dims):
    """The student that ``init: {pruned: {source: student}}`` cuts: this one at the teacher's width (hidden, heads,
    FFN), its depth, from the same teacher layers."""
    s = recipe.shape.resolve()
    return recipe.model_copy(update={
        "init": TeacherLayersInit(teacher_layers=recipe.init.teacher_layers),
        "shape": Shape(layers=s.layers, hidden=teacher.hidden, heads=teacher.heads, intermediate=teacher.intermediate)})


def at_teacher_shape(recipe, teacher: Dims):
    """A budgeted student planned before its search: at the teacher's depth and width (which data and starts its plan
    reads does not depend on the shape; the search picks the real one)."""
    return with_shape(recipe, {"layers": teacher.layers, "hidden": teacher.hidden, "heads": teacher.heads,
                               "intermediate": teacher.intermediate})


def common_checks(recipe, teacher: Dims, key: str) -> None:
    """What every recipe checks (`Recipe.check`): objectives the teacher's attention allows, depth, an init from
    teacher layers or by pruning that fits the teacher, general distillation where a random init needs it."""
    s = student_dims(recipe, teacher, key)
    check_attention(recipe, teacher, key)
    if s.layers > teacher.layers and not recipe.ANY_DEPTH:
        raise RecipeError(f"{key}.shape: the student has {s.layers} layers, more than the teacher's {teacher.layers}")
    if recipe.init.kind == "teacher_layers":
        if s.arch not in ("bert", "distilbert") or (s.hidden, s.heads, s.intermediate) != (
                teacher.hidden, teacher.heads, teacher.intermediate):
            raise RecipeError(
                f"{key}.init: teacher_layers needs a bert or distilbert student of the teacher's width "
                f"(hidden {teacher.hidden}, heads {teacher.heads}, intermediate {teacher.intermediate}); the shape "
                f"gives {s.arch} {s.hidden}/{s.heads}/{s.intermediate}")
    if recipe.init.kind == "pruned":
        recipe._check_pruned(teacher, s, key)
    if recipe.init.kind in LAYER_INITS and (layers := recipe.init.teacher_layers) != "auto":
        if len(layers) != s.layers:
            raise RecipeError(f"{key}.init.teacher_layers: {len(layers)} layers for a {s.layers}-layer student")
        if max(layers) >= teacher.layers:
            raise RecipeError(f"{key}.init.teacher_layers: layer {max(layers)} does not exist in a "
                              f"{teacher.layers}-layer teacher (0..{teacher.layers - 1})")
    if recipe.intermediate_step and not recipe.TASK_LAYER_WISE:
        raise RecipeError(f"{key}.intermediate_step: the {recipe.recipe} recipe has no layer-wise step on the task "
                          "(tinybert, minilm and mobilebert have)")
    if not recipe.runs_general and recipe.init.kind == "random" and not recipe.TASK_DISTILLS:
        raise RecipeError(f"{key}.general_distillation: a randomly initialised {recipe.recipe} student needs general "
                          "distillation (or init from teacher_layers / a checkpoint)")


def check_bert_cut(teacher: Dims, s: Dims, key: str) -> None:
    """``init: pruned``: a BERT student shape `distillery.pruning` can cut from a BERT teacher."""
    if s.arch != "bert" or teacher.arch != "bert":
        raise RecipeError(f"{key}.init: pruned needs a bert teacher and a bert student, got {teacher.arch} and "
                          f"{s.arch}")
    if s.hidden * teacher.heads != s.heads * teacher.hidden or s.hidden > teacher.hidden or \
            s.heads > teacher.heads or s.intermediate > teacher.intermediate:
        raise RecipeError(
            f"{key}.shape: pruned cuts the teacher's widths down and keeps its head size "
            f"{teacher.hidden // teacher.heads}: hidden <= {teacher.hidden}, heads <= {teacher.heads} with "
            f"hidden / heads = {teacher.hidden // teacher.heads}, intermediate <= {teacher.intermediate}; the "
            f"shape gives {s.hidden}/{s.heads}/{s.intermediate}")


def check_attention(recipe, teacher: Dims, key: str) -> None:
    """An objective that reads attention (scores, distributions, queries, keys, values) needs a teacher whose
    attention ``distillery.capture`` reads; refused before any work otherwise."""
    from distillery.capture import READS_ATTENTION
    from distillery.objectives.registry import TERMS

    if teacher.arch in READS_ATTENTION:
        return
    for name in recipe.weights.active():
        if any(kind != "hidden" for kind, _ in TERMS[name].features):
            raise RecipeError(
                f"{key}: {name} ({recipe.recipe}) reads attention, which cannot be read in a {teacher.arch} teacher "
                f"(only in {', '.join(sorted(READS_ATTENTION))}); give objectives on hidden states or logits "
                "(e.g. recipe pkd, or objectives without it)")


def check_student(recipe, teacher: Dims, key: str) -> None:
    """`Recipe.check` this student. One cut from its wide twin (``init: {pruned: {source: student}}``) is not
    distilled layer-wise after the cut: the twin (`wide_student`) must pass `check`, the shape must be a BERT cut
    `distillery.pruning` can make from it, and no general stage may run (the task stage trains the twin)."""
    if not cuts_distilled_student(recipe):
        return recipe.check(teacher, key)
    s = student_dims(recipe, teacher, key)
    if s.arch != "bert":
        raise RecipeError(f"{key}.init.source: student cuts a bert student from its wide twin; the shape is {s.arch}")
    if recipe.runs_general:
        raise RecipeError(f"{key}.init.source: student trains the student it cuts in the task stage, from the "
                          "teacher's layers; give general_distillation: false")
    wide_student(recipe, teacher).check(teacher, key)
    check_bert_cut(teacher, s, key)


def verify(recipe, teacher: Dims, key: str) -> None:
    """`check_student` a student of a shape; for a budget, that its candidates can be searched: a shape chosen
    after the stages that run before the search is refused (general distillation), and at least one candidate
    shape must pass `check_student` (`budget_shapes`)."""
    if recipe.budget is None:
        return check_student(recipe, teacher, key)
    if recipe.init.kind == "checkpoint":
        raise RecipeError(f"{key}.budget: a checkpoint fixes the student's shape; a budgeted student starts from the "
                          "teacher (init: pruned, or teacher_layers: auto)")
    if recipe.runs_general:
        raise RecipeError(f"{key}.budget: a budgeted student's shape is chosen on the task (the search stage), "
                          "after general distillation would run: start it from the teacher (init: pruned, or "
                          "teacher_layers: auto) or set general_distillation: false")
    if recipe.init.kind in LAYER_INITS and recipe.init.teacher_layers != "auto":
        raise RecipeError(f"{key}.init.teacher_layers: a budgeted student's depth is searched; give 'auto' (the "
                          "recipe's teacher layers for the chosen depth)")
    budget_shapes(recipe, teacher, key)


def budget_shapes(recipe, teacher: Dims, key: str) -> list[dict[str, Any]]:
    """The budget's candidate shapes (in the order of `distillery.efficiency.budget.candidates`) that this recipe
    can train from this teacher (each passes `check_student`: the search trains each candidate briefly by its plan,
    so a shape cut from its distilled wide twin need not be one the recipe distils); none: a RecipeError naming the
    first candidate's problem."""
    from distillery.efficiency.budget import BudgetError, candidates

    b = recipe.budget
    try:
        shapes = [c.shape for c in candidates(teacher, depths=b.depths, width_fractions=b.width_fractions,
                                              ffn_ratios=b.ffn_ratios, forms=("fp32",))]
    except BudgetError as exc:
        raise RecipeError(f"{key}.budget: {exc}") from None
    fine, problems = [], []
    for shape in shapes:
        try:
            check_student(with_shape(recipe, shape), teacher, key)
            fine.append(shape)
        except RecipeError as exc:
            problems.append(str(exc))
    if not fine:
        raise RecipeError(f"{key}.budget: none of its {len(shapes)} candidate shapes works with the "
                          f"{recipe.recipe} recipe and this teacher; the first: {problems[0] if problems else 'none'}")
    return fine

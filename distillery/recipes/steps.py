"""The steps every recipe's plan is made of (`distillery.training.plan`), and the two plans the pipeline asks for: the
student's (`task_plan`: the recipe's own, or the cut of its distilled twin) and its direct baseline's (`direct_plan`).

    finetune      a grid on the gold labels, no teacher (``task_distillation.finetune``)
    predict       prediction-layer distillation over a grid (TinyBERT eq. 10; ``task_distillation.prediction``)
    intermediate  the recipe's layer-wise objectives from the fine-tuned teacher, one run (TinyBERT's step 1;
                  ``task_distillation.intermediate``)
    extra         with ``task_distillation``, `predict` from the best fine-tuned run; the better of the two on dev
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from distillery.recipes.checks import cuts_distilled_student, wide_student
from distillery.recipes.schema import LAYER_INITS
from distillery.shape import Dims
from distillery.training.plan import Plan, Start, Step


def starts_from_pretrained_layers(recipe) -> bool:
    """Whether the student starts from the pre-trained teacher's layers (teacher layers or pruned, in its general
    stage, or in its task stage by ``layers_from``): where its direct baseline starts too."""
    if recipe.init.kind not in LAYER_INITS:
        return False
    if recipe.runs_general:
        return True
    if recipe.layers_from is not None:
        return recipe.layers_from == "pretrained"
    return recipe.LAYERS_FROM_PRETRAINED


def student_start(recipe) -> Start:
    """The task stage's start: the general student when it has one, else the recipe's init (teacher layers come from
    the fine-tuned teacher, whose classifier is copied too, unless they come from the pre-trained teacher; a checkpoint
    gets a fresh classifier)."""
    return Start("student", recipe, pretrained=starts_from_pretrained_layers(recipe))


def init_start(recipe) -> Start:
    """The direct baseline's start: the recipe's init, never the general student. A student whose general stage
    starts from the teacher's layers has its baseline start where that stage starts: from the pre-trained teacher's
    layers with a fresh head, not from the fine-tuned teacher's (which would hand it the teacher's task training and
    make the comparison one of initialisations)."""
    return Start("init", recipe, pretrained=starts_from_pretrained_layers(recipe))


def after(*steps: str) -> Start:
    """The best model of the earlier ``steps``."""
    return Start("best", steps=steps)


def finetune(start: Start, name: str = "grid") -> Step:
    """Fine-tuning over the grid ``task_distillation.finetune`` on the gold labels, no teacher."""
    return Step(name, start, "finetune")


def predict(recipe, start: Start, sections: Any, name: str = "grid", *, augmented: bool = False) -> Step:
    """Prediction-layer distillation over the grid ``task_distillation.prediction`` (TinyBERT eq. 10; soft targets at
    its temperature), on the gold, unlabelled (and augmented) rows. The step's temperature and regression target are
    its section's, never a recipe's own (BERT-PKD's and DistilBERT's `temperature` is that of their own soft-target
    terms, in their own steps)."""
    from distillery.objectives import ObjectiveWeights
    from distillery.training.spec import DistillSpec

    pr = sections.prediction
    options = replace(recipe.loss_options(), temperature=pr.temperature, regression_target=pr.regression_target)
    spec = DistillSpec(ObjectiveWeights({"prediction_loss": 1.0}), "prediction", options=options)
    return Step(name, start, "prediction", spec, augmented=augmented, unlabeled=True)


def intermediate(recipe, start: Start, teacher: Dims, *, augmented: bool = False, projection: bool = False) -> Step:
    """Task-distillation step 1 (TinyBERT, Algorithm 1): the recipe's layer-wise objectives on the task's training
    set (the augmented one when asked) from the fine-tuned teacher, over ``task_distillation.intermediate``
    (``projection``: continuing the start's W_h)."""
    spec = recipe.layer_wise_spec(recipe.shape.resolve().layers, teacher.layers)
    return Step("intermediate", start, "intermediate", spec, augmented=augmented, unlabeled=True,
                projection=projection, candidate=False)


def extra(recipe, sections: Any, of: str = "grid") -> tuple[Step, ...]:
    """With ``task_distillation``, prediction-layer distillation of the best run of ``of`` over the grid
    ``task_distillation.prediction`` (on the augmented set with ``augmented``); its runs join ``of``'s as candidates
    (the better on dev; a tie keeps the extra step). Without it, nothing."""
    if not recipe.task_distillation:
        return ()
    return (predict(recipe, after(of), sections, "grid-distill", augmented=recipe.task_distillation == "augmented"),)


def task_plan(recipe, teacher: Dims, sections: Any) -> Plan:
    """The task stage's plan: the recipe's (`Recipe.plan`). With ``init: {pruned: {source: student}}``: first its
    wide twin's plan (`checks.wide_student`, under ``wide/``), then the twin's best run cut to the shape and trained by
    the recipe's ``CUT_TRAINING`` (both read one cache of the teacher's logits). A shape of the teacher's width has
    nothing to cut: the twin is the student (a budget search's full-width candidates)."""
    if not cuts_distilled_student(recipe):
        return recipe.plan(teacher, sections)
    twin = wide_student(recipe, teacher)
    wide = twin.plan(teacher, sections)
    if twin.shape.resolve() == recipe.shape.resolve():
        return wide
    steps = tuple(s.under("wide") for s in wide.steps)
    cut = Start("cut", recipe, steps=tuple(f"wide/{s.name}" for s in wide.steps if s.candidate and s.grid))
    train = predict(recipe, cut, sections, augmented=wide.augmented) if recipe.CUT_TRAINING == "prediction" \
        else finetune(cut)
    return Plan((*steps, train), shared_logits="teacher_logits")


def direct_plan(recipe) -> Plan:
    """The same student trained without a teacher (TinyBERT's BERT-small row): its architecture and initialisation,
    the fine-tuning grid, the task's own training set."""
    return Plan((finetune(init_start(recipe)),))

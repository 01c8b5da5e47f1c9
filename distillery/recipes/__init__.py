"""Student recipes: one module per paper, each a typed params entry (``students.<name>``) that owns the paper's
behaviour -- checks against the teacher, layer map, the stages it adds, how its student starts, and every stage's
loss terms with their default weights (see ``base.py`` for what every recipe says).

    tinybert    init random -> general distillation (eqs. 7-9) -> task step 1 (augmented set) -> step 2 (eq. 10, grid)
    minilm      [teacher assistant] -> general distillation (last-layer attention + value relation KL) -> fine-tuning
    distilbert  init from teacher layers -> pre-training distillation (5 L_ce + 2 L_mlm + 1 L_cos) -> fine-tuning
    mobilebert  IB teacher -> progressive | joint transfer (eqs. 2-3) -> pre-training distillation (eq. 4) -> fine-tuning
    any         init from a general checkpoint (path or Hub name) skips general distillation

Adding a paper: its module here (a ``Recipe`` subclass with ``@register_recipe``; every module of this package is imported
below, so nothing else lists it), its loss terms in ``distillery/objectives/<paper>.py`` (``@register_recipe`` of
``distillery.objectives.registry``), tests, params, a row in the README's recipe table and a page in
docs/recipes/.
"""

import importlib
import pkgutil

from distillery.recipes.base import (
    CheckpointMismatchError,
    Recipe,
    StageContext,
    StudentStage,
    recipe_options,
)
from distillery.recipes.checks import at_teacher_shape, budget_shapes, verify
from distillery.recipes.schema import (
    INIT_KINDS,
    CheckpointInit,
    RandomInit,
    RecipeError,
    Section,
    Shape,
    TeacherLayersInit,
    official_teacher_layers,
    with_shape,
)
from distillery.recipes.steps import direct_plan, task_plan
from distillery.recipes.distilbert import DistilBertRecipe
from distillery.recipes.minilm import MiniLMRecipe
from distillery.recipes.mobilebert import IBTeacher, MobileBertRecipe
from distillery.recipes.registry import RECIPES, recipe_from_yaml, student_recipe_type, student_stage_folders
from distillery.recipes.tinybert import TinyBertRecipe

for _module in pkgutil.iter_modules(__path__):  # each recipe module registers its recipe class when imported
    if _module.name not in ("base", "registry", "schema", "checks", "steps", "cli"):
        importlib.import_module(f"{__name__}.{_module.name}")

#: The params type of ``students.<name>``: every registered recipe, by its ``recipe`` tag.
StudentRecipe = student_recipe_type()
RECIPE_NAMES = tuple(RECIPES)

__all__ = [
    "CheckpointInit", "CheckpointMismatchError", "DistilBertRecipe", "IBTeacher", "INIT_KINDS", "MiniLMRecipe",
    "MobileBertRecipe", "RECIPES", "RECIPE_NAMES", "RandomInit", "Recipe", "RecipeError", "Section", "Shape",
    "StageContext", "StudentRecipe", "StudentStage", "TeacherLayersInit", "TinyBertRecipe", "at_teacher_shape",
    "budget_shapes", "direct_plan", "official_teacher_layers", "recipe_from_yaml", "recipe_options",
    "student_stage_folders", "task_plan", "verify", "with_shape",
]

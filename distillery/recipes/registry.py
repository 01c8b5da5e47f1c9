"""Recipe name -> recipe class. A recipe module registers its class with ``@register_recipe``; ``distillery.recipes``
imports every recipe module, then builds the params type of ``students.<name>`` from this registry."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from distillery.recipes.base import Recipe

RECIPES: dict[str, type[Recipe]] = {}


def register_recipe(cls: type[Recipe]) -> type[Recipe]:
    """Class decorator: make ``cls`` (its ``recipe`` tag) a recipe params can name."""
    name = cls.model_fields["recipe"].default
    if name in RECIPES and RECIPES[name] is not cls:
        raise ValueError(f"recipe {name!r} is registered twice")
    RECIPES[name] = cls
    return cls


def student_recipe_type() -> Any:
    """The params type of one student: the registered recipes, told apart by their ``recipe`` tag."""
    classes = tuple(RECIPES.values())
    return Annotated[Union[classes], Field(discriminator="recipe")]  # type: ignore[valid-type]


def recipe_from_yaml(v: Any) -> Any:
    """A student without ``recipe`` is a TinyBERT student (the pipeline's first recipe)."""
    if isinstance(v, dict) and "recipe" not in v:
        return {"recipe": "tinybert", **v}
    return v


def student_stage_folders() -> dict[str, str]:
    """Every student-level stage any registered recipe declares (``Recipe.STUDENT_STAGES``) -> the folder of
    ``models/`` it writes, in an order that keeps each recipe's own order (a stage after those it reads)."""
    from graphlib import TopologicalSorter

    order: TopologicalSorter = TopologicalSorter()
    folders: dict[str, str] = {}
    for cls in RECIPES.values():
        names = list(cls.STUDENT_STAGES)
        for i, name in enumerate(names):
            if folders.setdefault(name, cls.STUDENT_STAGES[name]) != cls.STUDENT_STAGES[name]:
                raise ValueError(f"student stage {name!r} writes to two folders: {folders[name]!r} and "
                                 f"{cls.STUDENT_STAGES[name]!r}")
            order.add(name, *names[:i])
    return {name: folders[name] for name in order.static_order()}

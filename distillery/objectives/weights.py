"""Objective weights from config: ``{loss_name: weight}`` with the names of the registered loss terms.

Every objective is usable alone (a single non-zero weight) or combined (weighted sum), e.g.
``ObjectiveWeights({"attention_loss": 1, "hidden_loss": 1, "embedding_loss": 1})``. Each objective has one name,
its equation's function name, in code and in params; the names are those of ``distillery.objectives.registry.TERMS``.
The paper default weights live with the recipes (``distillery.recipes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from torch import Tensor

from .registry import TERMS, ObjectiveConfigError


@dataclass(frozen=True)
class ObjectiveWeights:
    """Validated mapping of registered loss-term names to non-negative finite weights: the one place objective names
    are checked (params, recipes and the Distiller all build one)."""

    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean: dict[str, float] = {}
        for name, w in dict(self.weights).items():
            if name not in TERMS:
                raise ObjectiveConfigError(
                    f"objectives: unknown key {name!r}; known objectives: {', '.join(sorted(TERMS))}"
                )
            try:
                wf = float(w)
            except (TypeError, ValueError):
                raise ObjectiveConfigError(f"objectives: weight of {name!r} must be a number, got {w!r}") from None
            if not math.isfinite(wf) or wf < 0:
                raise ObjectiveConfigError(f"objectives: weight of {name!r} must be finite and >= 0, got {w!r}")
            clean[name] = wf
        object.__setattr__(self, "weights", MappingProxyType(clean))

    @classmethod
    def from_config(cls, config: Mapping[str, float] | None) -> "ObjectiveWeights":
        """Build from a ``{name: weight}`` mapping (None: no objective)."""
        if config is None:
            return cls({})
        if not isinstance(config, Mapping):
            raise ObjectiveConfigError(f"objectives: expected a mapping of name -> weight, got {type(config).__name__}")
        return cls(dict(config))

    def active(self) -> tuple[str, ...]:
        """Names with a weight > 0, in config order."""
        return tuple(n for n, w in self.weights.items() if w > 0)

    def __getitem__(self, name: str) -> float:
        return self.weights.get(name, 0.0)

    def combine(self, losses: Mapping[str, Tensor]) -> Tensor:
        """Weighted sum ``sum_n w_n L_n`` over active objectives, in config order; each must be present in ``losses``."""
        missing = [n for n in self.active() if n not in losses]
        if missing:
            raise ObjectiveConfigError(f"objectives: no loss computed for active objective(s) {missing}")
        active = self.active()
        if not active:
            raise ObjectiveConfigError("objectives: no objective has a weight > 0")
        total = None
        for n in active:
            term = losses[n] * self.weights[n]
            total = term if total is None else total + term
        return total

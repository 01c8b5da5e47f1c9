"""Objective weights from config: ``{loss_name: weight}`` with the names of the objective functions.

Every objective is usable alone (a single non-zero weight) or combined (weighted sum), e.g.
``ObjectiveWeights.from_config({"attention_loss": 1, "hidden_loss": 1, "embedding_loss": 1})``. Each objective
has one name, its function's name, in code and in params.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from torch import Tensor

from . import distilbert, minilm, mobilebert, tinybert

#: Every objective by name (the function name; names are unique across the four papers).
OBJECTIVES: Mapping[str, Callable[..., Tensor]] = MappingProxyType(
    {
        "attention_loss": tinybert.attention_loss,
        "hidden_loss": tinybert.hidden_loss,
        "embedding_loss": tinybert.embedding_loss,
        "prediction_loss": tinybert.prediction_loss,
        "regression_prediction_loss": tinybert.regression_prediction_loss,
        "attention_kl": minilm.attention_kl,
        "value_relation_kl": minilm.value_relation_kl,
        "relation_kl": minilm.relation_kl,
        "feature_map_loss": mobilebert.feature_map_loss,
        "attention_transfer_loss": mobilebert.attention_transfer_loss,
        "pretraining_distillation_loss": mobilebert.pretraining_distillation_loss,
        "soft_target_loss": distilbert.soft_target_loss,
        "mlm_loss": distilbert.mlm_loss,
        "cosine_loss": distilbert.cosine_loss,
    }
)

#: Paper recipes. TinyBERT: intermediate stage / prediction stage; DistilBERT: the published 5/2/1.
RECIPES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "tinybert-general": {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0},
        "tinybert-intermediate": {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0},
        "tinybert-prediction": {"prediction_loss": 1.0},
        "tinybert-task": {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0, "prediction_loss": 1.0},
        "minilm": {"attention_kl": 1.0, "value_relation_kl": 1.0},
        "minilmv2": {"relation_kl": 1.0},
        "mobilebert-layerwise": {"feature_map_loss": 1.0, "attention_transfer_loss": 1.0},
        "mobilebert-pretraining": {"pretraining_distillation_loss": 1.0},
        "distilbert": {"soft_target_loss": 5.0, "mlm_loss": 2.0, "cosine_loss": 1.0},
    }
)


class ObjectiveConfigError(ValueError):
    """An unknown objective name or an impossible weight in the objectives config."""


@dataclass(frozen=True)
class ObjectiveWeights:
    """Validated mapping of objective names to non-negative finite weights."""

    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean: dict[str, float] = {}
        for name, w in dict(self.weights).items():
            if name not in OBJECTIVES:
                raise ObjectiveConfigError(
                    f"objectives: unknown key {name!r}; known objectives: {', '.join(sorted(OBJECTIVES))}"
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
    def from_config(cls, config: Mapping[str, float] | str | None) -> "ObjectiveWeights":
        """Build from a ``{name: weight}`` mapping or a recipe name in ``RECIPES``."""
        if config is None:
            return cls({})
        if isinstance(config, str):
            if config not in RECIPES:
                raise ObjectiveConfigError(f"objectives: unknown recipe {config!r}; known: {', '.join(sorted(RECIPES))}")
            return cls(dict(RECIPES[config]))
        if not isinstance(config, Mapping):
            raise ObjectiveConfigError(f"objectives: expected a mapping of name -> weight, got {type(config).__name__}")
        return cls(dict(config))

    def active(self) -> tuple[str, ...]:
        """Names with a weight > 0, in config order."""
        return tuple(n for n, w in self.weights.items() if w > 0)

    def __getitem__(self, name: str) -> float:
        if name not in OBJECTIVES:
            raise KeyError(f"unknown objective {name!r}")
        return self.weights.get(name, 0.0)

    def combine(self, losses: Mapping[str, Tensor]) -> Tensor:
        """Weighted sum ``sum_n w_n L_n`` over active objectives; each must be present in ``losses``."""
        missing = [n for n in self.active() if n not in losses]
        if missing:
            raise ObjectiveConfigError(f"objectives: no loss computed for active objective(s) {missing}")
        unknown = [n for n in losses if n not in OBJECTIVES]
        if unknown:
            raise ObjectiveConfigError(f"objectives: unknown loss name(s) {unknown}")
        active = self.active()
        if not active:
            raise ObjectiveConfigError("objectives: no objective has a weight > 0")
        total = None
        for n in active:
            term = losses[n] * self.weights[n]
            total = term if total is None else total + term
        return total

"""Distillation objectives of TinyBERT, MiniLM (v1 + v2 relation heads), MobileBERT and DistilBERT.

Pure tensor functions: lists of tensors over mapped layers (or single tensors) in, scalar out.
``attention_mask`` is (B, T) of 1/0. Teacher inputs are detached inside every objective.
Each paper module also registers its terms (``registry.register_term``) next to their equations: importing this package
imports every module in it, which fills ``TERMS`` (a new paper's module needs no line here).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .distilbert import cosine_loss, mlm_loss, soft_target_loss
from .minilm import attention_kl, relation_kl, split_relation_heads, value_relation_kl
from .mobilebert import attention_transfer_loss, feature_map_loss, pretraining_distillation_loss
from .tinybert import (
    HiddenProjection,
    attention_loss,
    embedding_loss,
    hidden_loss,
    prediction_loss,
    regression_prediction_loss,
)
from .registry import (
    TERMS,
    Batch,
    LossOptions,
    ObjectiveConfigError,
    Term,
    capture_specs,
    group_pairs,
    register_term,
    level_terms,
    unregister_term,
)
from .weights import ObjectiveWeights

for _module in _pkgutil.iter_modules(__path__):  # every paper module registers its loss terms when imported
    _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Batch",
    "HiddenProjection",
    "LossOptions",
    "ObjectiveConfigError",
    "ObjectiveWeights",
    "TERMS",
    "Term",
    "capture_specs",
    "group_pairs",
    "register_term",
    "level_terms",
    "unregister_term",
    "attention_kl",
    "attention_loss",
    "attention_transfer_loss",
    "cosine_loss",
    "embedding_loss",
    "feature_map_loss",
    "hidden_loss",
    "mlm_loss",
    "prediction_loss",
    "pretraining_distillation_loss",
    "regression_prediction_loss",
    "relation_kl",
    "soft_target_loss",
    "split_relation_heads",
    "value_relation_kl",
]

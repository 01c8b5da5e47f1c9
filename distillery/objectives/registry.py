"""Loss terms as a registry: each objective registers its name, the levels it belongs to, the features it needs
captured on the mapped layers, and how it is computed from one batch (TextBrewer's declarative match list, as
a registry): adding a loss is its function plus one ``@register_term(...)`` next to it.

A feature is ``(kind, group)``: ``kind`` is what ``distillery.capture`` records (``scores``, ``probs``,
``queries``, ``keys``, ``values``, ``hidden``), ``group`` which layer-map pairs it is recorded for
(``attention``: ``layer_map.attention``; ``states``: the hidden-state pairs after the embedding; ``embedding``: the
embedding-output pair (0, t); ``hidden``: every hidden-state pair). ``distillery.training.distill`` captures the
union of the active terms' features, runs the teacher only when a term needs it, and sums ``w_n * compute(batch)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping, Sequence

from torch import Tensor

Group = Literal["attention", "states", "embedding", "hidden"]
Feature = tuple[str, Group]
#: The levels a term can read (see ``distillery.training.spec.Level``): intermediate layers, the prediction layer,
#: the pre-training (MLM/NSP) heads.
LEVELS = ("intermediate", "prediction", "pretraining")
#: What ``distillery.capture`` records.
KINDS = ("hidden", "scores", "probs", "queries", "keys", "values")
GROUPS = ("attention", "states", "embedding", "hidden")


class ObjectiveConfigError(ValueError):
    """An unknown objective name, an impossible weight, or objectives a level cannot compute."""


@dataclass(frozen=True)
class LossOptions:
    """The knobs of the equations (the papers' defaults; official-code behaviour where it differs is a switch).

    temperature / prediction_reduction: TinyBERT eq. 10 (``"paper"``: CE summed over classes; ``"official"``: 1/C
    of it), DistilBERT's soft targets, BERT-PKD's L_DS. regression_target: STS-B prediction loss against the teacher
    (default) or gold (official code). official_attention_masking: TinyBERT eq. 7 with the official -10000/zeroing
    semantics. n_relation_heads: MiniLMv2 relation heads. feature_map_normalized: MobileBERT eq. 2 in the official
    normalised form. mlm_alpha: MobileBERT eq. 4's alpha. extra: the knobs of a paper's own terms, read by its
    compute functions (e.g. BERT-PKD's ``patient_reduction``)."""

    temperature: float = 1.0
    prediction_reduction: Literal["paper", "official"] = "paper"
    regression_target: Literal["teacher", "gold"] = "teacher"
    official_attention_masking: bool = True
    n_relation_heads: int = 12
    feature_map_normalized: bool = False
    mlm_alpha: float = 0.5
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.prediction_reduction not in ("paper", "official"):
            raise ValueError(f"prediction_reduction must be 'paper' or 'official', got {self.prediction_reduction!r}")
        if self.regression_target not in ("teacher", "gold"):
            raise ValueError(f"regression_target must be 'teacher' or 'gold', got {self.regression_target!r}")
        if self.n_relation_heads < 1:
            raise ValueError(f"n_relation_heads must be >= 1, got {self.n_relation_heads}")
        if not 0.0 <= self.mlm_alpha <= 1.0:
            raise ValueError(f"mlm_alpha must be in [0, 1], got {self.mlm_alpha}")


@dataclass
class Batch:
    """What a term's ``compute`` reads: the captured internals of both models (``distillery.capture.Captured``;
    ``teacher`` is None when no term needed a teacher forward), their logits (``student_logits`` is the MLM head's for
    a pre-training model), the batch's mask and labels, the layer map, the options, TinyBERT's projection, and which
    logit positions are real (``logit_mask``, span logits)."""

    student: Any
    teacher: Any
    layer_map: Any
    options: LossOptions
    attention_mask: Tensor | None = None
    labels: Tensor | None = None
    student_logits: Tensor | None = None
    teacher_logits: Tensor | None = None
    nsp_logits: Tensor | None = None
    nsp_labels: Tensor | None = None
    projection: Any = None
    #: bool, broadcastable to the logits: True where the last axis holds a real class. Span logits (B, 2, T): the
    #: batch's real tokens, (B, 1, T), so padding is out of every softmax over positions; None: every class is real.
    logit_mask: Tensor | None = None

    def pairs(self, group: Group) -> list[tuple[int, int]]:
        return group_pairs(self.layer_map, group)

    def select(self, kind: str, group: Group) -> tuple[list[Tensor], list[Tensor]]:
        """(student, teacher) captured tensors of ``kind`` on the pairs of ``group``, in layer-map order."""
        pairs = self.pairs(group)
        return self.student.select(kind, [s for s, _ in pairs]), self.teacher.select(kind, [t for _, t in pairs])


@dataclass(frozen=True)
class Term:
    """One registered loss term (see the module docstring)."""

    name: str
    levels: tuple[str, ...]
    compute: Callable[[Batch], Tensor]
    features: tuple[Feature, ...] = ()
    #: reads the teacher's logits (from a forward or a cached column); a predicate ``(options, student) -> bool``
    #: when that depends on the options and the head (a regression head trained on gold labels reads none)
    teacher_logits: bool | Callable[[LossOptions, Any], bool] = False
    projection: bool = False       # needs TinyBERT's W_h (a trainable Linear beside the student)
    head_wise: bool = False        # compares attention heads one by one (equal head counts)
    paper: str = ""

    def reads_teacher_logits(self, options: LossOptions, student: Any) -> bool:
        return bool(self.teacher_logits(options, student) if callable(self.teacher_logits) else self.teacher_logits)


_TERMS: dict[str, Term] = {}
#: Every registered term by name (read-only view).
TERMS: Mapping[str, Term] = MappingProxyType(_TERMS)


def register_term(name: str, *, levels: Sequence[str], features: Sequence[Feature] = (),
             teacher_logits: bool | Callable[[LossOptions, Any], bool] = False, projection: bool = False,
             head_wise: bool = False, paper: str = "") -> Callable[[Callable[[Batch], Tensor]], Callable[[Batch], Tensor]]:
    """Decorator: register ``compute(batch) -> Tensor`` as the loss term ``name`` (levels, features and groups are
    checked here, so a wrong registration fails at import)."""
    bad = [s for s in levels if s not in LEVELS]
    if not levels or bad:
        raise ValueError(f"loss term {name!r}: levels must be among {LEVELS}, got {tuple(levels)}")
    for kind, group in features:
        if kind not in KINDS or group not in GROUPS:
            raise ValueError(f"loss term {name!r}: feature ({kind!r}, {group!r}) is not (one of {KINDS}, one of {GROUPS})")

    def deco(compute: Callable[[Batch], Tensor]) -> Callable[[Batch], Tensor]:
        if name in _TERMS and _TERMS[name].compute is not compute:
            raise ValueError(f"loss term {name!r} is registered twice")
        _TERMS[name] = Term(name, tuple(levels), compute, tuple(features), teacher_logits, projection, head_wise, paper)
        return compute

    return deco


def unregister_term(name: str) -> None:
    """Remove a registered term (a term registered by a test or a notebook)."""
    if name not in _TERMS:
        raise KeyError(f"no loss term {name!r} is registered")
    del _TERMS[name]


def group_pairs(layer_map: Any, group: Group) -> list[tuple[int, int]]:
    """The (student, teacher) index pairs of a layer-map group."""
    if group == "attention":
        return list(layer_map.attention)
    if group == "states":
        return [p for p in layer_map.hidden if p[0] != 0]
    if group == "embedding":
        return [p for p in layer_map.hidden if p[0] == 0]
    if group == "hidden":
        return list(layer_map.hidden)
    raise ValueError(f"unknown feature group {group!r}")


def capture_specs(names: Sequence[str], layer_map: Any) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(student, teacher) keyword arguments of ``distillery.capture.capture``: only what the terms read."""
    s: dict[str, set[int]] = {}
    t: dict[str, set[int]] = {}
    for name in names:  # names of validated weights (``ObjectiveWeights``: the one check of objective names)
        for kind, group in TERMS[name].features:
            pairs = group_pairs(layer_map, group)
            s.setdefault(kind, set()).update(a for a, _ in pairs)
            t.setdefault(kind, set()).update(b for _, b in pairs)
    return ({k: tuple(sorted(v)) for k, v in s.items() if v}, {k: tuple(sorted(v)) for k, v in t.items() if v})


def level_terms(level: str) -> tuple[str, ...]:
    """The names of the terms a distillation level can compute."""
    return tuple(n for n, term in TERMS.items() if level in term.levels)


__all__ = ["Batch", "Feature", "LossOptions", "ObjectiveConfigError", "LEVELS", "TERMS", "Term", "capture_specs",
           "group_pairs", "register_term", "level_terms", "unregister_term"]

"""Layer maps: which teacher layer each student layer learns from.

TinyBERT (Jiao et al., 2020, Sec. 3.1, "n = g(m)"): the student's m-th layer learns from the
teacher's g(m)-th layer; g(0) = 0 maps the embedding layer, g(M+1) = N+1 the prediction layer.
Strategies studied in the paper (Sec. 4.4, Table 7):

* ``uniform``: g(m) = m * N / M (the paper's default, and the official code's);
* ``top``:     g(m) = m + N - M;
* ``bottom``:  g(m) = m.

MiniLM (Wang et al., 2020, Sec. 3.1) distils only the *last* self-attention layer (``last``).
``explicit`` takes user-given pairs.

Indexing conventions (shared by :mod:`distillery.capture` and the objectives):

* ``hidden`` pairs are ``(student_state, teacher_state)`` with Hugging Face ``hidden_states``
  indexing: state 0 is the embedding output, state i the output of transformer layer i (1-based).
* ``attention`` pairs are ``(student_layer, teacher_layer)`` with 0-based transformer layer indices.

For the official TinyBERT map (k = N / M), student attention layer i <- teacher layer i*k + k-1
and student state i <- teacher state i*k. When N is not divisible by M (the official code refuses
this case) we round: student state i <- teacher state floor(i*N/M + 1/2), and student attention layer
i <- teacher state of student state i+1 minus one. This keeps the last student layer on the last
teacher layer and is identical to the official map when N % M == 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

__all__ = ["LayerMap", "LayerMapError", "build_layer_map", "validate_layer_map", "KINDS"]

KINDS = ("uniform", "top", "bottom", "last", "explicit")


class LayerMapError(ValueError):
    """An impossible layer map (raised at configuration time, before any training)."""


@dataclass(frozen=True)
class LayerMap:
    """Student-to-teacher layer correspondences.

    hidden: ``(student_state, teacher_state)`` pairs; state 0 = embedding output, state i = output
        of layer i (1-based), like HF ``hidden_states``.
    attention: ``(student_layer, teacher_layer)`` pairs, 0-based transformer layer indices.
    """

    hidden: tuple[tuple[int, int], ...] = ()
    attention: tuple[tuple[int, int], ...] = ()

    @property
    def student_states(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.hidden)

    @property
    def teacher_states(self) -> tuple[int, ...]:
        return tuple(t for _, t in self.hidden)

    @property
    def student_layers(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.attention)

    @property
    def teacher_layers(self) -> tuple[int, ...]:
        return tuple(t for _, t in self.attention)

    def to_dict(self) -> dict[str, list[list[int]]]:
        return {"hidden": [list(p) for p in self.hidden], "attention": [list(p) for p in self.attention]}


def _uniform_state(i: int, n_student: int, n_teacher: int) -> int:
    return math.floor(i * n_teacher / n_student + 0.5)


def _pairs(value: Any, what: str) -> tuple[tuple[int, int], ...]:
    """Parse an explicit list: either ``[[s, t], ...]`` or ``[t0, t1, ...]`` (student index = position)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise LayerMapError(f"layer map '{what}': expected a list, got {type(value).__name__}")
    out: list[tuple[int, int]] = []
    for pos, item in enumerate(value):
        if isinstance(item, bool):
            raise LayerMapError(f"layer map '{what}'[{pos}]: expected an int or a pair, got {item!r}")
        if isinstance(item, int):
            out.append((pos, item))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in item
        ):
            out.append((int(item[0]), int(item[1])))
        else:
            raise LayerMapError(
                f"layer map '{what}'[{pos}]: expected an int teacher index or a [student, teacher] pair, got {item!r}"
            )
    return tuple(out)


def build_layer_map(
    kind: str,
    n_student: int,
    n_teacher: int,
    explicit: Mapping[str, Any] | None = None,
    embedding: bool = True,
) -> LayerMap:
    """Build (and validate) a layer map of ``kind`` for an M-layer student and an N-layer teacher.

    ``embedding`` adds the embedding pair (0, 0) to ``hidden`` for uniform/top/bottom (TinyBERT eq. 9
    is the index-0 term). ``last`` has no hidden pairs (MiniLM distils only last-layer self-attention).
    ``explicit`` is a dict with keys ``hidden`` and/or ``attention``, each a list of
    ``[student, teacher]`` pairs or a list of teacher indices (student index = position).
    """
    if kind not in KINDS:
        raise LayerMapError(f"unknown layer map kind {kind!r}; expected one of {', '.join(KINDS)}")
    for name, n in (("n_student", n_student), ("n_teacher", n_teacher)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise LayerMapError(f"{name} must be a positive int, got {n!r}")
    if kind != "explicit" and explicit is not None:
        raise LayerMapError(f"layer map kind {kind!r} takes no explicit pairs; use kind='explicit'")
    if n_student > n_teacher:
        raise LayerMapError(
            f"student has more layers ({n_student}) than the teacher ({n_teacher}); no {kind} map exists"
        )
    M, N = n_student, n_teacher
    first = 0 if embedding else 1
    if kind == "uniform":
        hidden = tuple((i, _uniform_state(i, M, N)) for i in range(first, M + 1))
        attention = tuple((i, _uniform_state(i + 1, M, N) - 1) for i in range(M))
    elif kind == "top":
        hidden = ((0, 0),) * embedding + tuple((i, i + N - M) for i in range(1, M + 1))
        attention = tuple((i, i + N - M) for i in range(M))
    elif kind == "bottom":
        hidden = tuple((i, i) for i in range(first, M + 1))
        attention = tuple((i, i) for i in range(M))
    elif kind == "last":
        hidden = ()
        attention = ((M - 1, N - 1),)
    else:  # explicit
        if explicit is None:
            raise LayerMapError("layer map kind 'explicit' needs an explicit dict with 'hidden' and/or 'attention'")
        if not isinstance(explicit, Mapping):
            raise LayerMapError(f"explicit layer map must be a dict, got {type(explicit).__name__}")
        unknown = set(explicit) - {"hidden", "attention"}
        if unknown:
            raise LayerMapError(f"explicit layer map: unknown key(s) {sorted(unknown)}; allowed: hidden, attention")
        hidden = _pairs(explicit.get("hidden"), "hidden")
        attention = _pairs(explicit.get("attention"), "attention")
        if not hidden and not attention:
            raise LayerMapError("explicit layer map is empty: give 'hidden' and/or 'attention' pairs")
    lm = LayerMap(hidden=hidden, attention=attention)
    validate_layer_map(lm, n_student, n_teacher)
    return lm


def _check_unique(values: Iterable[int], what: str) -> None:
    seen: set[int] = set()
    for v in values:
        if v in seen:
            raise LayerMapError(f"layer map: duplicate {what} index {v}")
        seen.add(v)


def validate_layer_map(
    lm: LayerMap,
    n_student: int,
    n_teacher: int,
    student_heads: int | None = None,
    teacher_heads: int | None = None,
    head_wise: bool = False,
) -> None:
    """Raise :class:`LayerMapError` if ``lm`` cannot be applied to these models.

    Checks: student not deeper than teacher; hidden states in ``[0, n]``; attention layers in
    ``[0, n-1]``; no student or teacher index used twice within ``hidden`` or within ``attention``;
    equal head counts when the loss compares heads one by one (``head_wise``, e.g. TinyBERT's
    attention loss or MiniLM v1's attention KL).
    """
    if n_student > n_teacher:
        raise LayerMapError(f"student has more layers ({n_student}) than the teacher ({n_teacher})")
    for s, t in lm.hidden:
        if not 0 <= s <= n_student:
            raise LayerMapError(f"layer map hidden pair ({s}, {t}): student state {s} out of range 0..{n_student}")
        if not 0 <= t <= n_teacher:
            raise LayerMapError(f"layer map hidden pair ({s}, {t}): teacher state {t} out of range 0..{n_teacher}")
    for s, t in lm.attention:
        if not 0 <= s < n_student:
            raise LayerMapError(
                f"layer map attention pair ({s}, {t}): student layer {s} out of range 0..{n_student - 1}"
            )
        if not 0 <= t < n_teacher:
            raise LayerMapError(
                f"layer map attention pair ({s}, {t}): teacher layer {t} out of range 0..{n_teacher - 1}"
            )
    _check_unique(lm.student_states, "student hidden-state")
    _check_unique(lm.teacher_states, "teacher hidden-state")
    _check_unique(lm.student_layers, "student attention-layer")
    _check_unique(lm.teacher_layers, "teacher attention-layer")
    if head_wise and lm.attention and student_heads is not None and teacher_heads is not None:
        if student_heads != teacher_heads:
            raise LayerMapError(
                f"head-wise attention loss needs equal head counts: student has {student_heads} heads, "
                f"teacher has {teacher_heads} (use relation heads, or drop the attention loss)"
            )

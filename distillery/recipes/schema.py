"""The params schema every recipe shares: a shape (`Shape`), how a student's weights start (`Init`: random, teacher
layers, pruned from the teacher, a checkpoint), a latency budget instead of a shape (`BudgetSpec`)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Mapping, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from distillery.errors import UserError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # every float in params is finite


class RecipeError(UserError, ValueError):
    """A recipe that cannot work with this teacher; the message starts with the params key."""


class Shape(Section):
    """A student or teacher shape: a preset name, or explicit numbers (``arch``: bert | distilbert | mobilebert),
    or a preset with some numbers overridden. MobileBERT shapes: ``hidden`` is the inter-block width, ``intra``
    the intra-block (bottleneck) width, ``embedding`` the embedding-table width, ``ffns`` the stacked FFNs per block."""

    # a preset (tinybert4, minilm-l6-h384, mobilebert, distilbert6, ...); the keys below override it
    preset: str | None = None
    layers: int | None = Field(None, ge=1)  # transformer layers
    hidden: int | None = Field(None, ge=1)  # hidden size (MobileBERT: the inter-block width)
    heads: int | None = Field(None, ge=1)  # attention heads
    intermediate: int | None = Field(None, ge=1)  # FFN inner size
    # bert (for a student: the teacher's model type) | distilbert | mobilebert; None: the preset's, else bert
    arch: Literal["bert", "distilbert", "mobilebert"] | None = None
    intra: int | None = Field(None, ge=1)  # MobileBERT: intra-block (bottleneck) width
    embedding: int | None = Field(None, ge=1)  # MobileBERT: embedding-table width
    ffns: int | None = Field(None, ge=1)  # MobileBERT: stacked FFNs per block

    #: MobileBertConfig field of each MobileBERT-only key.
    MOBILEBERT_KEYS: ClassVar[dict[str, str]] = {"intra": "intra_bottleneck_size", "embedding": "embedding_size",
                                                  "ffns": "num_feedforward_networks"}

    @model_validator(mode="after")
    def _preset_or_numbers(self) -> "Shape":
        numbers = [self.layers, self.hidden, self.heads, self.intermediate]
        if self.preset is None and any(n is None for n in numbers):
            raise ValueError("give either `preset` or all of layers, hidden, heads, intermediate")
        from distillery.shape import ModelConfigError

        try:
            shape = self.resolve()
        except ModelConfigError as exc:
            raise ValueError(str(exc).removeprefix("student shape: ")) from None
        given = [k for k in self.MOBILEBERT_KEYS if getattr(self, k) is not None]
        if given and shape.arch != "mobilebert":
            raise ValueError(f"{given} are MobileBERT widths; the shape's arch is {shape.arch}")
        return self

    def as_spec(self) -> str | dict[str, Any]:
        dumped = self.model_dump()
        spec = {k: v for k, v in dumped.items() if v is not None and k not in self.MOBILEBERT_KEYS}
        extra = {field: dumped[k] for k, field in self.MOBILEBERT_KEYS.items() if dumped[k] is not None}
        if extra:
            spec["extra"] = extra
        return spec if set(spec) != {"preset"} else self.preset

    def resolve(self):
        """The ``distillery.shape.Dims`` (raises ModelConfigError on an impossible shape)."""
        from distillery.shape import resolve_shape

        return resolve_shape(self.as_spec())


# ------------------------------------------------------------------------------------------------ init

class RandomInit(Section):
    kind: Literal["random"] = "random"  # init kind: random (random weights) | teacher_layers | pruned | checkpoint


class TeacherLayersInit(Section):
    """DistilBERT's initialisation (Sanh et al., 2019, Sec. 3): the teacher's embeddings and these layers."""

    kind: Literal["teacher_layers"] = "teacher_layers"  # the teacher's embeddings and these layers
    # the teacher layers copied, 0-based, one per student layer; auto: the recipe's choice
    teacher_layers: list[int] | Literal["auto"] = "auto"

    @field_validator("teacher_layers")
    @classmethod
    def _distinct(cls, v):
        if v != "auto":
            if not v:
                raise ValueError("give at least one teacher layer")
            if len(set(v)) != len(v) or any(i < 0 for i in v):
                raise ValueError(f"teacher layers must be distinct and >= 0, got {v}")
        return v


class PrunedInit(Section):
    """Width from the teacher (``distillery.pruning``, Minitron's activation importance): the teacher's
    ``teacher_layers`` and, in them, its most important heads, FFN neurons and hidden channels for the student's
    shape, ranked on ``samples`` real inputs (the task's training set, or the corpus for general distillation)."""

    kind: Literal["pruned"] = "pruned"  # width from the teacher by structured pruning
    # the teacher layers taken and pruned, 0-based, one per student layer; auto: the recipe's choice
    teacher_layers: list[int] | Literal["auto"] = "auto"
    samples: int = Field(512, ge=1)  # the stage's first N inputs, on which heads, FFN neurons and channels are ranked
    #: what is cut: ``teacher`` (its layers, in one cut) or ``student``: this student at the teacher's width first,
    #: from those layers through the recipe's task stage, then cut to the shape and trained again (`steps.task_plan`,
    #: the recipe's ``CUT_TRAINING``: the gold labels, or TinyBERT's step 2; no layer-wise distillation after the cut)
    source: Literal["teacher", "student"] = "teacher"

    _distinct = field_validator("teacher_layers")(TeacherLayersInit._distinct.__func__)


class CheckpointInit(Section):
    """A released general student (local directory or Hub name): skips general distillation."""

    kind: Literal["checkpoint"] = "checkpoint"  # a released general student: general distillation skipped
    checkpoint: str = Field(min_length=1)  # its local directory or Hub name


Init = Annotated[Union[RandomInit, TeacherLayersInit, PrunedInit, CheckpointInit], Field(discriminator="kind")]
INIT_KINDS = ("random", "teacher_layers", "pruned", "checkpoint")
LAYER_INITS = ("teacher_layers", "pruned")  # the inits that copy teacher layers


def init_from_yaml(v: Any) -> Any:
    """``random`` | ``teacher_layers`` | ``pruned`` | ``{teacher_layers: [...]}`` | ``{pruned: {teacher_layers: [...],
    samples: N}}`` | ``{checkpoint: ...}`` -> a tagged dict."""
    if isinstance(v, str):
        if v in ("random", "teacher_layers", "pruned"):
            return {"kind": v}
        raise ValueError(f"expected 'random', 'pruned', {{teacher_layers: [...]}} or {{checkpoint: PATH}}, got {v!r}")
    if isinstance(v, dict) and "kind" not in v:
        keys = set(v)
        if keys == {"teacher_layers"}:
            return {"kind": "teacher_layers", **v}
        if keys == {"checkpoint"}:
            return {"kind": "checkpoint", **v}
        if keys == {"pruned"}:
            return {"kind": "pruned", **(v["pruned"] or {})}
        raise ValueError(f"expected {{teacher_layers: [...]}}, {{pruned: {{...}}}} or {{checkpoint: PATH}}, got keys "
                         f"{sorted(keys)}")
    return v


# ------------------------------------------------------------------------------------------------ budget

class BudgetSpec(Section):
    """A latency budget instead of a shape (the `search` stage picks the shape and deployed form): at least
    ``speedup`` times faster than the fp32 teacher and/or at most ``latency_ms`` per batch of ``batch`` x ``seq_len``
    (default: ``evaluation.latency_seq_len``, the length the evaluate stage times), measured on the machine that runs
    the search, with ``margin`` of the limit kept free (timings of small models move between runs; the evaluate stage
    times the chosen student again). Candidates: ``depths`` (default 1 .. the teacher's) x ``width_fractions`` of the
    teacher's heads (its head size kept) x ``ffn_ratios`` of its FFN/width ratio, in ``forms`` (default: every form
    this machine serves, `distillery.efficiency.budget.available_forms`). ``shapes`` of the shapes that meet the budget
    (the largest of each depth first, `finalists`) are trained briefly (``train_examples`` per task in the first
    round, twice as many in each next one) and halved on their mean dev retention until one is left (successive
    halving)."""

    speedup: float | None = Field(None, gt=0)  # at least this many times faster than the fp32 teacher
    latency_ms: float | None = Field(None, gt=0)  # at most this many milliseconds per batch of `batch` x `seq_len`
    batch: int = Field(1, ge=1)  # the batch size the budget is timed at
    seq_len: int | None = Field(None, ge=8, le=512)  # tokens per sequence timed; None: `evaluation.latency_seq_len`
    margin: float = Field(0.1, ge=0, lt=1)  # share of the limit kept free (0.1: a candidate must be 10% under it)
    depths: list[int] | None = None  # candidate layer counts; None: 1 .. the teacher's
    # candidate fractions of the teacher's heads (its head size kept)
    width_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=lambda: [1.0, 0.75, 0.5],
                                                                       min_length=1)
    # candidate fractions of the teacher's FFN / width ratio
    ffn_ratios: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=lambda: [1.0, 0.5], min_length=1)
    # deployed forms tried; None: every form this machine serves fast
    forms: list[Literal["fp32", "bf16", "int8"]] | None = Field(None, min_length=1)
    shapes: int = Field(4, ge=1)  # shapes that enter the training rounds (successive halving)
    #: training examples per task in the first brief round (doubling each round): too few rank the shapes otherwise
    #: than full training does (docs/budget.md)
    train_examples: int = Field(4000, ge=1)

    @model_validator(mode="after")
    def _bound(self) -> "BudgetSpec":
        if self.speedup is None and self.latency_ms is None:
            raise ValueError("a budget needs speedup (over the fp32 teacher) or latency_ms")
        if self.depths is not None and (not self.depths or min(self.depths) < 1):
            raise ValueError(f"depths must be >= 1, got {self.depths}")
        return self

    def budget(self, seq_len: int):
        """The `distillery.efficiency.budget.Budget` (``seq_len`` when the spec gives none)."""
        from distillery.efficiency.budget import Budget

        return Budget(speedup=self.speedup, latency_ms=self.latency_ms, batch=self.batch,
                      seq_len=self.seq_len or seq_len, margin=self.margin)


def official_teacher_layers(n_teacher: int, n_student: int) -> list[int]:
    """DistilBERT's released choice for 12 -> 6 ([0, 2, 4, 7, 9, 11]); otherwise evenly spread layers that keep
    the first and the last (the same rule gives the official list for 12 -> 6)."""
    if n_student > n_teacher:
        raise ValueError(f"a {n_student}-layer student cannot take layers of a {n_teacher}-layer teacher")
    if n_student == 1:
        return [n_teacher - 1]
    return [math.floor(i * (n_teacher - 1) / (n_student - 1) + 0.5) for i in range(n_student)]



#: An ``init`` field: ``random`` | ``teacher_layers`` | ``pruned`` | ``{teacher_layers: [...]}`` | ``{pruned: {...}}`` |
#: ``{checkpoint: ...}`` in params, one of the `Init` kinds after validation.
InitField = Annotated[Init, BeforeValidator(init_from_yaml)]



def with_shape(recipe, shape: Mapping[str, Any]):
    """The student with ``shape`` in place of its budget (the search stage's choice)."""
    return recipe.model_copy(update={"shape": Shape(**shape), "budget": None})

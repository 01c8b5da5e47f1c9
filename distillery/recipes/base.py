"""What every recipe says, and the contexts the pipeline hands it.

A recipe is one typed, validated entry of ``students.<name>`` in params (a pydantic model) that also owns the
paper's behaviour (torchtune's recipe classes):

* its params schema (fields) and, in :meth:`Recipe.check`, what it needs of the teacher (depth, width, heads);
* ``OBJECTIVES``: the loss terms its layer-wise (general) stage can compute, with the paper's default weights
  (0 = available but off) -- written once, in the recipe's module; ``objectives`` in params overrides them;
* :meth:`Recipe.map_layers`: which student layer learns from which teacher layer;
* ``STUDENT_STAGES``: every student-level stage it may add before the task stage, in order, each with the folder of
  ``models/`` it writes (``general_distillation`` -> ``general`` for every recipe that pre-trains; MiniLM's
  ``teacher_assistant``, MobileBERT's ``ib_teacher`` and ``knowledge_transfer``); the pipeline's stages, their
  outputs, curves and DVC stages are derived from these declarations;
* :meth:`Recipe.stages`: the ones a student of this recipe runs, each with its body, run with a
  :class:`StageContext`; the task stage starts from the last one's model;
* :meth:`Recipe.task_stage`: what it does on a task, given a :class:`TaskContext`; returns the grid whose best
  run becomes the student;
* :meth:`Recipe.start_student`: how its student is built and initialised.

The pipeline (``tasks/``) never looks inside a recipe: it prepares the context (teacher, tokenizer, datasets,
output directory, schedule, seed) and asks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from distillery.errors import UserError
from distillery.models import Dims


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
        from distillery.models import ModelConfigError

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
        """The ``distillery.models.StudentShape`` (raises ModelConfigError on an impossible shape)."""
        from distillery.models import resolve_shape

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
    #: from those layers through the recipe's task stage, then cut to the shape and trained again (`Recipe.run_task`,
    #: `Recipe.train_cut`: the gold labels, or TinyBERT's step 2; no layer-wise distillation after the cut)
    source: Literal["teacher", "student"] = "teacher"

    _distinct = field_validator("teacher_layers")(TeacherLayersInit._distinct.__func__)


class CheckpointInit(Section):
    """A released general student (local directory or Hub name): skips general distillation."""

    kind: Literal["checkpoint"] = "checkpoint"  # a released general student: general distillation skipped
    checkpoint: str = Field(min_length=1)  # its local directory or Hub name


Init = Annotated[Union[RandomInit, TeacherLayersInit, PrunedInit, CheckpointInit], Field(discriminator="kind")]
INIT_KINDS = ("random", "teacher_layers", "pruned", "checkpoint")
LAYER_INITS = ("teacher_layers", "pruned")  # the inits that copy teacher layers


def _init_from_yaml(v: Any) -> Any:
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


# ------------------------------------------------------------------------------------------------ contexts

@dataclass(frozen=True)
class StageContext:
    """What a student-level stage gets from the pipeline.

    ``teacher``: the teacher checkpoint (directory or Hub name) this stage distils from: the MLM teacher when the
    pipeline pre-trains one. ``corpus``: the prepared corpus (one sentence per line, a blank line between documents).
    ``inputs``: the model directories of this student's earlier stages, by stage name. ``schedule``: the params
    section of the stage's schedule (epochs, lr, batch_size, max_length, ...), ``args`` the TrainingArguments made
    from it (seed and checkpoints included)."""

    student: str
    teacher: str
    corpus: Path
    out: Path
    schedule: Any
    args: Mapping[str, Any]
    seed: int
    inputs: Mapping[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskContext:
    """What the task stage (and the direct baseline) gets from the pipeline.

    ``teacher``: the task's fine-tuned teacher; ``labels``: the label settings every student of the task is built
    with (num_labels, id2label, label2id, problem_type); ``data(augmented, unlabeled=False)``: (train, dev), encoded
    (``unlabeled``: the task's unlabelled rows after the others, for a step that reads soft targets; a gold-label loss
    skips them, `distillery.unlabeled`); ``rows``: the training rows of each kind its steps read; ``general``: the
    student's general-distillation output (None when it has none); ``sections``: the run's
    ``task_distillation`` params (intermediate, prediction, finetune, student_dropout); ``train_args(section)``: the
    TrainingArguments of a training section; ``grid(section)``: the ``Grid`` and the ``TrainRun`` template (metrics,
    seed, checkpoints) of a grid section. ``head``: the model head of the task ("sequence-classification", or
    "question-answering" for a span task: every model of the task carries it)."""

    student: str
    task: str
    teacher: Any
    tokenizer: Any
    labels: Mapping[str, Any]
    data: Callable[..., tuple[Any, Any]]
    out: Path
    sections: Any
    train_args: Callable[[Any], dict[str, Any]]
    grid: Callable[[Any], tuple[Any, Any]]
    general: Path | None = None
    head: str = "sequence-classification"
    #: the pre-trained teacher the student-level stages read (a model directory or Hub id): where a student that runs
    #: a general stage from teacher layers starts, so its direct baseline starts there too
    pretrained: Any = None
    #: where prediction-layer grids cache the teacher's logits (None: each grid's own ``teacher_logits``); one folder
    #: for the grids of one stage that distil from the same teacher (a twin and its cut, `Recipe.run_task`)
    logits_cache: Path | None = None
    rows: dict[str, int] = field(default_factory=dict)

    def load(self, path: Path):
        """A saved student of the task (its head, the task's label settings)."""
        from distillery.models import load_model

        return load_model(path, head=self.head, **self.labels)


@dataclass(frozen=True)
class StudentStage:
    """A student-level stage a recipe adds: its body, and the params section that is its schedule."""

    run: Callable[[StageContext], dict[str, Any]]
    schedule: Literal["general_distillation", "pretrain"] = "general_distillation"


# ------------------------------------------------------------------------------------------------ the recipe

class Recipe(Section):
    """Fields every recipe has; subclasses fix ``recipe``, the paper defaults and the behaviour."""

    recipe: str                                # the paper: tinybert (default) | minilm | distilbert | mobilebert | pkd
    shape: Shape | None = None                 # exactly one of shape and budget
    budget: BudgetSpec | None = None           # a latency budget: the search stage picks the shape
    # how the student's weights start: random | teacher_layers | pruned | checkpoint (a name, or {name: {keys}})
    init: Annotated[Init, Field(default_factory=RandomInit)]
    objectives: dict[str, float] | None = None  # None: the paper's (``OBJECTIVES``)
    general_distillation: bool | None = None    # None: on unless init is a checkpoint (see ``runs_general``)
    teacher_train_mode: bool = False            # official TinyBERT: teacher dropout on while distilling
    #: after the fine-tuning grid, prediction-layer distillation from the fine-tuned teacher (DistilBERT's SQuAD extra
    #: step, Sec. 4.2; a CPU-budget option for MiniLM and MobileBERT, whose papers fine-tune only, and after BERT-PKD's
    #: task stage); ``augmented``: that step on TinyBERT's augmented set when `augment.enabled` (a CPU-budget option of
    #: this project, no paper's); TinyBERT refuses it (its step 2 is that step)
    task_distillation: bool | Literal["augmented"] = False
    #: where a student initialised from teacher layers (or pruned) that runs no general stage copies them from:
    #: ``pretrained`` (the MLM teacher's, a fresh head: where DistilBERT's and BERT-PKD's papers start) or
    #: ``finetuned`` (the task's fine-tuned teacher's, its classifier too); None: the recipe's
    #: ``LAYERS_FROM_PRETRAINED``. Its direct baseline starts there too.
    layers_from: Literal["pretrained", "finetuned"] | None = None

    #: The loss terms of the recipe's layer-wise stage with the paper's weights (0: available, off by default).
    OBJECTIVES: ClassVar[dict[str, float]] = {}
    #: The level those terms read (``distillery.training.spec.Level``).
    LEVEL: ClassVar[str] = "intermediate"
    #: Whether the student may be deeper than the teacher (MobileBERT: it takes its IB teacher's depth).
    ANY_DEPTH: ClassVar[bool] = False
    #: ``layers_from``'s default: whether a student initialised from teacher layers copies them from the pre-trained
    #: teacher (a fresh head) even when it runs no general stage (BERT-PKD: its official code starts BERT_k from
    #: pre-trained BERT's first k layers); otherwise such a student starts from the fine-tuned teacher.
    LAYERS_FROM_PRETRAINED: ClassVar[bool] = False
    #: Every student-level stage :meth:`stages` may return, in order -> the folder of ``models/`` it writes
    #: (``models/<folder>/<student>/model``).
    STUDENT_STAGES: ClassVar[dict[str, str]] = {"general_distillation": "general"}

    @field_validator("init", mode="before")
    @classmethod
    def _init(cls, v):
        return _init_from_yaml(v)

    @model_validator(mode="after")
    def _layers_from(self) -> "Recipe":
        if self.layers_from is not None and self.init.kind not in LAYER_INITS:
            raise ValueError(f"layers_from: {self.layers_from} needs an init from teacher layers (teacher_layers or "
                             f"pruned), not {self.init.kind}")
        if self.layers_from == "finetuned" and self.runs_general:
            raise ValueError("layers_from: finetuned: general distillation starts from the pre-trained teacher's "
                             "layers; give general_distillation: false")
        return self

    @model_validator(mode="after")
    def _shape_or_budget(self) -> "Recipe":
        if (self.shape is None) == (self.budget is None):
            raise ValueError("give a shape, or a budget (the search stage then picks the shape), not "
                             + ("both" if self.shape is not None else "neither"))
        return self

    @field_validator("objectives")
    @classmethod
    def _objective_names(cls, v):
        if v is None:
            return v
        from distillery.objectives import ObjectiveConfigError, ObjectiveWeights

        try:
            weights = ObjectiveWeights(v)
        except ObjectiveConfigError as exc:
            raise ValueError(str(exc).removeprefix("objectives: ")) from None
        wrong = [n for n in weights.active() if n not in cls.OBJECTIVES]
        if wrong:
            raise ValueError(
                f"{wrong} cannot be computed by the {cls.model_fields['recipe'].default} recipe's layer-wise "
                f"distillation; it computes {list(cls.OBJECTIVES)}"
            )
        if not weights.active():
            raise ValueError("no objective has a weight > 0")
        return v

    # ---------------------------------------------------------------- params

    @property
    def weights(self):
        """The ``ObjectiveWeights`` of the layer-wise stage (params, else the paper's)."""
        from distillery.objectives import ObjectiveWeights

        if self.objectives is not None:
            return ObjectiveWeights(self.objectives)
        return ObjectiveWeights({n: w for n, w in self.OBJECTIVES.items() if w > 0})

    @property
    def runs_general(self) -> bool:
        """Whether the student goes through general (pre-training) distillation."""
        if self.general_distillation is not None:
            return self.general_distillation
        return self.init.kind == "random"

    @property
    def starts_from_pretrained_layers(self) -> bool:
        """Whether the student starts from the pre-trained teacher's layers (teacher layers or pruned, in its general
        stage, or in its task stage by ``layers_from``): where its direct baseline starts too."""
        if self.init.kind not in LAYER_INITS:
            return False
        if self.runs_general:
            return True
        if self.layers_from is not None:
            return self.layers_from == "pretrained"
        return self.LAYERS_FROM_PRETRAINED

    @property
    def cuts_distilled_student(self) -> bool:
        """``init: {pruned: {source: student}}``: the student is cut from its distilled wide twin (`run_task`)."""
        return self.init.kind == "pruned" and self.init.source == "student"

    @property
    def needs_mlm_teacher(self) -> bool:
        """Whether a stage of the recipe distils an MLM teacher's output distribution."""
        return False

    @property
    def uses_augmented_data(self) -> bool:
        """Whether the task stage trains on the augmented set (TinyBERT; the extra step with ``task_distillation:
        augmented``)."""
        return self.task_distillation == "augmented"

    @property
    def task_distills(self) -> bool:
        """Whether a randomly initialised student can skip general distillation (its task stage distils)."""
        return False

    def options(self) -> dict[str, Any]:
        """The recipe's official-behaviour switches, for the model card and MLflow."""
        return {"teacher_train_mode": self.teacher_train_mode}

    def ablations(self) -> dict[str, tuple[str, "Recipe"]]:
        """The paper's ablations of this student: variant name -> (what the paper calls it, the changed recipe)."""
        return {}

    def loss_options(self):
        """``LossOptions`` of this recipe's equations in its own steps (the extra step's temperature and regression
        target are its section's: `prediction_stage`)."""
        from distillery.objectives.registry import LossOptions

        return LossOptions()

    # ---------------------------------------------------------------- checks

    def student_dims(self, teacher: Dims, key: str) -> Dims:
        """The student's dims (the resolved shape), raising RecipeError naming ``key`` on an impossible one."""
        from distillery.models import ModelConfigError

        try:
            shape = self.shape.resolve()
        except ModelConfigError as exc:
            raise RecipeError(f"{key}.shape: {exc}") from None
        return Dims.of_shape(shape, teacher.vocab)

    def with_shape(self, shape: Mapping[str, Any]) -> "Recipe":
        """This student with ``shape`` in place of its budget (the search stage's choice)."""
        return self.model_copy(update={"shape": Shape(**shape), "budget": None})

    def verify(self, teacher: Dims, key: str) -> None:
        """`check_student` a student of a shape; for a budget, that its candidates can be searched: a shape chosen
        after the stages that run before the search is refused (general distillation), and at least one candidate
        shape must pass `check_student` (`budget_shapes`)."""
        if self.budget is None:
            return self.check_student(teacher, key)
        if self.init.kind == "checkpoint":
            raise RecipeError(f"{key}.budget: a checkpoint fixes the student's shape; a budgeted student starts from the "
                              "teacher (init: pruned, or teacher_layers: auto)")
        if self.runs_general:
            raise RecipeError(f"{key}.budget: a budgeted student's shape is chosen on the task (the search stage), "
                              "after general distillation would run: start it from the teacher (init: pruned, or "
                              "teacher_layers: auto) or set general_distillation: false")
        if self.init.kind in LAYER_INITS and self.init.teacher_layers != "auto":
            raise RecipeError(f"{key}.init.teacher_layers: a budgeted student's depth is searched; give 'auto' (the "
                              "recipe's teacher layers for the chosen depth)")
        self.budget_shapes(teacher, key)

    def budget_shapes(self, teacher: Dims, key: str) -> list[dict[str, int]]:
        """The budget's candidate shapes (in the order of `distillery.efficiency.budget.candidates`) that this recipe
        can train from this teacher (each passes `check_student`: the search trains each candidate briefly by
        `run_task`, so a shape cut from its distilled wide twin need not be one the recipe distils); none: a
        RecipeError naming the first candidate's problem."""
        from distillery.efficiency.budget import BudgetError, candidates

        b = self.budget
        try:
            shapes = [c.shape for c in candidates(teacher, depths=b.depths, width_fractions=b.width_fractions,
                                                  ffn_ratios=b.ffn_ratios, forms=("fp32",))]
        except BudgetError as exc:
            raise RecipeError(f"{key}.budget: {exc}") from None
        fine, problems = [], []
        for shape in shapes:
            try:
                self.with_shape(shape).check_student(teacher, key)
                fine.append(shape)
            except RecipeError as exc:
                problems.append(str(exc))
        if not fine:
            raise RecipeError(f"{key}.budget: none of its {len(shapes)} candidate shapes works with the "
                              f"{self.recipe} recipe and this teacher; the first: {problems[0] if problems else 'none'}")
        return fine

    def check(self, teacher: Dims, key: str) -> None:
        """Everything that can be checked before training, given the teacher's dims; subclasses add theirs."""
        s = self.student_dims(teacher, key)
        self._check_attention(teacher, key)
        if s.layers > teacher.layers and not self.ANY_DEPTH:
            raise RecipeError(f"{key}.shape: the student has {s.layers} layers, more than the teacher's {teacher.layers}")
        if self.init.kind == "teacher_layers":
            if s.arch not in ("bert", "distilbert") or (s.hidden, s.heads, s.intermediate) != (
                    teacher.hidden, teacher.heads, teacher.intermediate):
                raise RecipeError(
                    f"{key}.init: teacher_layers needs a bert or distilbert student of the teacher's width "
                    f"(hidden {teacher.hidden}, heads {teacher.heads}, intermediate {teacher.intermediate}); the shape "
                    f"gives {s.arch} {s.hidden}/{s.heads}/{s.intermediate}")
        if self.init.kind == "pruned":
            self._check_pruned(teacher, s, key)
        if self.init.kind in LAYER_INITS and (layers := self.init.teacher_layers) != "auto":
            if len(layers) != s.layers:
                raise RecipeError(f"{key}.init.teacher_layers: {len(layers)} layers for a {s.layers}-layer student")
            if max(layers) >= teacher.layers:
                raise RecipeError(f"{key}.init.teacher_layers: layer {max(layers)} does not exist in a "
                                  f"{teacher.layers}-layer teacher (0..{teacher.layers - 1})")
        if not self.runs_general and self.init.kind == "random" and not self.task_distills:
            raise RecipeError(f"{key}.general_distillation: a randomly initialised {self.recipe} student needs general "
                              "distillation (or init from teacher_layers / a checkpoint)")

    def _check_pruned(self, teacher: Dims, s: Dims, key: str) -> None:
        """``init: pruned``: a student shape `distillery.pruning` can cut from the teacher."""
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

    def check_student(self, teacher: Dims, key: str) -> None:
        """`check` this student. One cut from its wide twin (``init: {pruned: {source: student}}``) is not
        distilled layer-wise after the cut (`train_cut`): the twin (`wide_student`) must pass `check`, the shape must
        be a BERT cut `distillery.pruning` can make from it, and no general stage may run (the task stage trains the
        twin)."""
        if not self.cuts_distilled_student:
            return self.check(teacher, key)
        s = self.student_dims(teacher, key)
        if s.arch != "bert":
            raise RecipeError(f"{key}.init.source: student cuts a bert student from its wide twin; the shape is {s.arch}")
        if self.runs_general:
            raise RecipeError(f"{key}.init.source: student trains the student it cuts in the task stage, from the "
                              "teacher's layers; give general_distillation: false")
        self.wide_student(teacher).check(teacher, key)
        Recipe._check_pruned(self, teacher, s, key)

    def _check_attention(self, teacher: Dims, key: str) -> None:
        """An objective that reads attention (scores, distributions, queries, keys, values) needs a teacher whose
        attention ``distillery.capture`` reads; refused before any work otherwise."""
        from distillery.capture import READS_ATTENTION
        from distillery.objectives.registry import TERMS

        if teacher.arch in READS_ATTENTION:
            return
        for name in self.weights.active():
            if any(kind != "hidden" for kind, _ in TERMS[name].features):
                raise RecipeError(
                    f"{key}: {name} ({self.recipe}) reads attention, which cannot be read in a {teacher.arch} teacher "
                    f"(only in {', '.join(sorted(READS_ATTENTION))}); give objectives on hidden states or logits "
                    "(e.g. recipe pkd, or objectives without it)")

    # ---------------------------------------------------------------- stages

    def map_layers(self, n_student: int, n_teacher: int):
        """The ``LayerMap`` of the layer-wise stage (default: TinyBERT's uniform g(m))."""
        from distillery.layer_map import build_layer_map

        return build_layer_map("uniform", n_student, n_teacher)

    def layer_wise_spec(self, n_student: int, n_teacher: int, projection=None):
        """The ``DistillSpec`` of the layer-wise stage: the recipe's objectives on its layer map."""
        from distillery.training.spec import DistillSpec

        return DistillSpec(self.weights, self.LEVEL, self.map_layers(n_student, n_teacher), self.loss_options(),
                           projection=projection, teacher_train_mode=self.teacher_train_mode)

    def stages(self, teacher: Dims) -> dict[str, StudentStage]:
        """The student-level stages before the task stage, in order (none for a student initialised from a
        checkpoint or the teacher's layers without pre-training distillation)."""
        return {"general_distillation": StudentStage(self.general_stage)} if self.runs_general else {}

    def general_stage(self, ctx: StageContext) -> dict[str, Any]:
        """General distillation on the corpus with the recipe's layer-wise objectives (TinyBERT, MiniLM)."""
        from transformers import AutoModel, AutoTokenizer

        from distillery.models import num_layers
        from distillery.training.distill import distill
        from distillery.training.spec import TrainRun

        tokenizer = AutoTokenizer.from_pretrained(ctx.teacher)
        teacher = AutoModel.from_pretrained(str(self.general_teacher(ctx)))
        train, n = corpus_dataset(ctx, tokenizer)
        model = self.start_student(teacher, tokenizer, head="base", data=train)
        spec = self.layer_wise_spec(num_layers(model), num_layers(teacher))
        distill(teacher, model, spec, TrainRun(ctx.out, train, tokenizer=tokenizer, args=ctx.args))
        return {"metrics": {"sequences": n}}

    def general_teacher(self, ctx: StageContext):
        """The model general distillation distils from: the pipeline's teacher (MiniLM: its assistant, when used)."""
        return ctx.teacher

    def start_student(self, teacher, tokenizer, *, head: str = "base", data=None, **head_kwargs: Any):
        """The student before training, as ``init`` says: random weights of ``shape``; the teacher's embeddings and
        ``teacher_layers`` (DistilBERT modules for a distilbert shape, the teacher's own class otherwise; heads the
        teacher has are copied); the teacher pruned to ``shape`` (``pruned``: importance measured on ``data``, a
        dataset of model inputs); or a general checkpoint."""
        from distillery.models import build_student, init_from_teacher_layers, num_layers

        shape = self.shape.resolve()
        if self.init.kind == "checkpoint":
            return load_checkpoint_student(self.init.checkpoint, tokenizer, head=head, **head_kwargs)
        if self.init.kind == "pruned":
            if data is None:
                raise RecipeError("init pruned measures importance on real inputs, and this stage gave none")
            student = self.pruned_student(teacher, sample_batches(data, tokenizer, self.init.samples), head=head,
                                          num_labels=head_kwargs.get("num_labels", 2))
        elif self.init.kind == "teacher_layers":
            layers = self.teacher_layers(num_layers(teacher), shape.layers)
            student = init_from_teacher_layers(teacher, layers, head=head,
                                               arch="distilbert" if shape.arch == "distilbert" else "same")
        else:
            student = build_student(shape, len(tokenizer), head=head, base=teacher.config,
                                    num_labels=head_kwargs.get("num_labels", 2))
        for k, v in head_kwargs.items():
            setattr(student.config, k, v)
        return student

    def teacher_layers(self, n_teacher: int, n_student: int) -> list[int]:
        """The teacher layers (0-based) a layer init copies: ``init.teacher_layers``, or `auto_teacher_layers`."""
        layers = self.init.teacher_layers
        return self.auto_teacher_layers(n_teacher, n_student) if layers == "auto" else list(layers)

    def auto_teacher_layers(self, n_teacher: int, n_student: int) -> list[int]:
        """``teacher_layers: auto``: `official_teacher_layers` (evenly spread, the first and the last kept)."""
        return official_teacher_layers(n_teacher, n_student)

    def pruned_student(self, teacher, batches, *, head: str, num_labels: int):
        """``init: pruned``: the teacher pruned to ``shape`` (`distillery.pruning`), importance measured on `batches`
        (the first ``init.samples`` rows of the stage's inputs)."""
        from distillery.models import num_layers
        from distillery.pruning import measure_importance, prune_teacher

        shape = self.shape.resolve()
        layers = self.teacher_layers(num_layers(teacher), shape.layers)
        importance = measure_importance(teacher, batches, layers)
        return prune_teacher(teacher, layers, hidden=shape.hidden, heads=shape.heads, intermediate=shape.intermediate,
                             importance=importance, head=head)

    # ---------------------------------------------------------------- the task stage

    def task_stage(self, ctx: TaskContext):
        """Fine-tuning over the grid on the gold labels (MiniLM, DistilBERT, MobileBERT), then, with
        ``task_distillation``, the extra step (`fine_tune`). Every recipe returns (the GridResult whose best run becomes
        the student, the training curve to report or None for the best run's)."""
        return self.fine_tune(ctx, task_student(self, ctx)), None

    def fine_tune(self, ctx: TaskContext, start: Callable[[], Any]):
        """Fine-tuning of ``start`` over the grid on the gold labels, then, with ``task_distillation``,
        prediction-layer distillation of the best fine-tuned run over the grid ``task_distillation.prediction``; the
        student is the better of the two on dev (the extra step's runs join the grid's candidates: the same selection
        on dev the grid makes among its own runs; a tie keeps the extra step)."""
        return self.extra_step(ctx, finetune_grid(ctx, start, ctx.out / "grid"))

    def extra_step(self, ctx: TaskContext, grid):
        """With ``task_distillation``, prediction-layer distillation of ``grid``'s best run over the grid
        ``task_distillation.prediction`` (on the augmented set with ``augmented``); the better of the two on dev (a
        tie keeps the extra step). Without it, ``grid``."""
        if not self.task_distillation:
            return grid
        best = grid.best_dir
        distilled = prediction_stage(self, ctx, lambda: ctx.load(best), ctx.out / "grid-distill",
                                     augmented=self.uses_augmented_data)
        return max((distilled, grid), key=lambda g: g.best["main"])

    def task_projection(self, ctx: TaskContext, student):
        """The hidden-state projection task-distillation step 1 continues (`intermediate_stage`): None for objectives
        without one (TinyBERT: its general student's W_h)."""
        return None

    def wide_student(self, teacher: Dims) -> "Recipe":
        """The student that ``init: {pruned: {source: student}}`` cuts: this one at the teacher's width (hidden,
        heads, FFN), its depth, from the same teacher layers."""
        s = self.shape.resolve()
        return self.model_copy(update={
            "init": TeacherLayersInit(teacher_layers=self.init.teacher_layers),
            "shape": Shape(layers=s.layers, hidden=teacher.hidden, heads=teacher.heads, intermediate=teacher.intermediate)})

    def run_task(self, ctx: TaskContext):
        """The task stage as the pipeline runs it: `task_stage`. With ``init: {pruned: {source: student}}``: first
        `wide_student` through `task_stage` (its runs under ``ctx.out / "wide"``), then its best run cut to this
        shape (`distillery.pruning`, importance on the first ``init.samples`` training inputs), then `train_cut`. A
        shape of the teacher's width has nothing to cut: the twin is the student (a budget search's full-width
        candidates)."""
        if not self.cuts_distilled_student:
            return self.task_stage(ctx)
        from distillery.pruning import measure_importance, prune_teacher

        twin, shape = self.wide_student(Dims.of_config(ctx.teacher.config)), self.shape.resolve()
        if twin.shape.resolve() == shape:
            return twin.task_stage(ctx)
        ctx = replace(ctx, logits_cache=ctx.logits_cache or ctx.out / "teacher_logits")  # the twin's, for the cut too
        wide, _ = twin.task_stage(replace(ctx, out=ctx.out / "wide"))
        train = ctx.data(False)[0]

        def cut():
            model = ctx.load(wide.best_dir)
            layers = list(range(shape.layers))
            importance = measure_importance(model, sample_batches(train, ctx.tokenizer, self.init.samples), layers)
            return prune_teacher(model, layers, hidden=shape.hidden, heads=shape.heads,
                                 intermediate=shape.intermediate, importance=importance)
        return self.train_cut(ctx, with_student_dropout(cut, ctx)), None

    def train_cut(self, ctx: TaskContext, cut: Callable[[], Any]):
        """What trains the student cut from its distilled twin (``init: {pruned: {source: student}}``): the
        fine-tuning grid on the gold labels (the cut's hidden states are narrower than the teacher's, which a layer-wise
        objective of the recipe may not compare)."""
        return finetune_grid(ctx, cut, ctx.out / "grid")

    def direct_stage(self, ctx: TaskContext):
        """The same student trained without a teacher (TinyBERT's BERT-small row): its architecture and
        initialisation, the fine-tuning grid, the task's own training set."""
        return finetune_grid(ctx, task_student(self, ctx, general=False), ctx.out / "grid")


# ------------------------------------------------------------------------------------------------ helpers

def corpus_dataset(ctx: StageContext, tokenizer, max_length: int | None = None):
    """The corpus packed into sequences of the schedule's length and tokenized: (dataset, number of sequences)."""
    from distillery import corpus
    from distillery.training.mlm import tokenize_texts

    length = max_length or ctx.schedule.max_length
    texts = corpus.pack_sequences(corpus.read_sentences(ctx.corpus), tokenizer, length)
    return tokenize_texts(texts, tokenizer, length), len(texts)


def sample_batches(data, tokenizer, samples: int):
    """Padded batches of model inputs from the first `samples` rows of `data` (pruning's importance sample)."""
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    keep = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in data.column_names]
    sample = data.select(range(min(samples, len(data)))).select_columns(keep)
    return DataLoader(sample, batch_size=32, collate_fn=DataCollatorWithPadding(tokenizer))


def task_student(recipe: Recipe, ctx: TaskContext, *, general: bool = True) -> Callable[[], Any]:
    """A factory of the task stage's starting student: the general student (when it ran and ``general``), else the
    recipe's init (teacher layers come from the fine-tuned teacher, whose classifier is copied too, unless the
    recipe's layers come from the pre-trained teacher; a checkpoint gets a fresh classifier); with
    ``task_distillation.student_dropout`` applied when set.

    The direct baseline (``general`` False) of a student whose general stage starts from the teacher's layers starts
    where that stage starts: from the pre-trained teacher's layers with a fresh head, not from the fine-tuned
    teacher's (which would hand it the teacher's task training and make the comparison one of initialisations)."""
    if general and ctx.general is not None:
        def factory():
            return ctx.load(ctx.general)
    else:
        from_pretrained = recipe.starts_from_pretrained_layers and ctx.pretrained is not None

        def factory():
            teacher = ctx.load(ctx.pretrained) if from_pretrained else ctx.teacher
            data = ctx.data(False)[0] if recipe.init.kind == "pruned" else None  # pruning ranks on the task's inputs
            return recipe.start_student(teacher, ctx.tokenizer, head=ctx.head, data=data, **ctx.labels)
    return with_student_dropout(factory, ctx)


def with_student_dropout(factory: Callable[[], Any], ctx: TaskContext) -> Callable[[], Any]:
    """`factory` with ``task_distillation.student_dropout`` applied to what it makes, when set."""
    rate = ctx.sections.student_dropout
    if rate is None:
        return factory
    from distillery.models import set_dropout

    return lambda: set_dropout(factory(), rate)


def intermediate_stage(recipe: Recipe, ctx: TaskContext, start: Callable[[], Any], *, augmented: bool = False) -> Path:
    """Task-distillation step 1 (TinyBERT, Algorithm 1): the recipe's layer-wise objectives on the task's training
    set (the augmented one when asked) from the fine-tuned teacher, over ``task_distillation.intermediate``; the
    step's model directory (reused when it finished before an interruption, under the same stage key)."""
    from distillery.models import num_layers
    from distillery.training.distill import distill
    from distillery.training.spec import TrainRun

    step1 = ctx.out / "intermediate" / "model"
    if (step1 / "config.json").is_file():
        return step1
    model = start()
    train, _ = ctx.data(augmented, unlabeled=True)
    spec = recipe.layer_wise_spec(num_layers(model), num_layers(ctx.teacher),
                                  projection=recipe.task_projection(ctx, model))
    # (the saved config carries task_distillation.student_dropout, so a reload keeps it)
    return distill(ctx.teacher, model, spec, TrainRun(ctx.out / "intermediate", train, tokenizer=ctx.tokenizer,
                                                      args=ctx.train_args(ctx.sections.intermediate)))


def finetune_grid(ctx: TaskContext, student, out: Path, *, augmented: bool = False):
    """The fine-tuning grid (``task_distillation.finetune``) on gold labels, no teacher."""
    from distillery.training.grid import prediction_grid

    train, dev = ctx.data(augmented)
    grid, run = ctx.grid(ctx.sections.finetune)
    return prediction_grid(None, student, None, run.with_(output_dir=out, train_dataset=train, eval_dataset=dev), grid)


def prediction_stage(recipe: Recipe, ctx: TaskContext, student, out: Path, *, augmented: bool = False):
    """Prediction-layer distillation over the grid ``task_distillation.prediction`` (TinyBERT eq. 10; soft targets
    at temperature t; teacher logits computed once per grid when ``cache_teacher_logits``)."""
    from distillery.objectives import ObjectiveWeights
    from distillery.training.grid import prediction_grid
    from distillery.training.spec import DistillSpec

    pr = ctx.sections.prediction
    train, dev = ctx.data(augmented, unlabeled=True)
    grid, run = ctx.grid(pr)
    if ctx.logits_cache is not None:
        grid = replace(grid, cache_dir=ctx.logits_cache)
    # the step's temperature and regression target are its section's, never a recipe's own (BERT-PKD's and
    # DistilBERT's `temperature` is that of their own soft-target terms, in their own steps)
    options = replace(recipe.loss_options(), temperature=pr.temperature, regression_target=pr.regression_target)
    spec = DistillSpec(ObjectiveWeights({"prediction_loss": 1.0}), "prediction", options=options)
    return prediction_grid(ctx.teacher, student, spec, run.with_(output_dir=out, train_dataset=train, eval_dataset=dev),
                           grid)


class CheckpointMismatchError(UserError, ValueError):
    """A general checkpoint whose vocabulary or tokenizer does not match the teacher's."""


def load_checkpoint_student(name_or_path: str, tokenizer, *, head: str = "base", **kwargs: Any):
    """A released general student (local directory or Hub name, never remote code), checked against the
    teacher's tokenizer: the same vocabulary, or a clear error."""
    from transformers import AutoConfig, AutoTokenizer

    from distillery.models import _auto_class

    cfg = AutoConfig.from_pretrained(name_or_path, trust_remote_code=False)
    try:
        own = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)
    except (OSError, ValueError):
        own = None
    teacher_vocab = tokenizer.get_vocab()
    if own is not None and own.get_vocab() != teacher_vocab:
        diff = sorted(set(own.get_vocab().items()) ^ set(teacher_vocab.items()))[:3]
        raise CheckpointMismatchError(
            f"checkpoint {name_or_path}: its tokenizer's vocabulary ({len(own)} tokens) differs from the teacher's "
            f"({len(tokenizer)} tokens), e.g. {diff}; use a checkpoint trained with the teacher's vocabulary")
    if getattr(cfg, "vocab_size", None) != len(tokenizer):
        raise CheckpointMismatchError(
            f"checkpoint {name_or_path}: vocab_size {cfg.vocab_size} != the teacher tokenizer's {len(tokenizer)} tokens")
    return _auto_class(head).from_pretrained(name_or_path, trust_remote_code=False, **kwargs)

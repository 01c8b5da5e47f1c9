"""Student recipes: one typed, validated object per student of ``params.yaml`` (``students.<name>``).

A recipe says which stages a student goes through and with which losses; its paper defaults are written
here once (objective weights come from ``distillery.objectives.RECIPES``):

    tinybert    init random -> general distillation (attention + hidden + embedding, eqs. 7-9)
                -> task distillation step 1 (same losses, augmented set) -> step 2 (prediction layer, eq. 10, grid)
    minilm      [teacher assistant L x d'] -> general distillation (last-layer attention KL, eq. 6, + value
                relation KL, eqs. 7-9; or MiniLMv2 relation heads) -> fine-tuning on the task (grid)
    distilbert  init from teacher layers -> pre-training distillation (5 L_ce + 2 L_mlm + 1 L_cos)
                -> fine-tuning on the task (grid) [-> prediction-layer distillation]
    mobilebert  IB-BERT teacher (converted from the pipeline's teacher, or MLM from scratch)
                -> knowledge transfer (feature maps, eq. 2 + attention, eq. 3): progressive | joint
                -> pre-training distillation (eq. 4) -> fine-tuning (grid); auxiliary: one combined loss instead
    any         init from a general checkpoint (path or Hub name) skips general distillation

``init``: ``random`` | ``{teacher_layers: [...]}`` | ``{checkpoint: PATH_OR_HUB_NAME}``.

Everything that can be checked from params and the teacher's config alone (objective names, which stage
can compute them, layer maps, head counts, widths, relation heads) is checked by :func:`check_recipe`
before any stage runs; the message names the params key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from distillery.errors import UserError
from distillery.objectives.weights import OBJECTIVES, RECIPES, ObjectiveConfigError, ObjectiveWeights


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Shape(Section):
    """A student or teacher shape: a preset name, or explicit numbers (``arch``: bert | distilbert | mobilebert),
    or a preset with some numbers overridden. MobileBERT shapes: ``hidden`` is the inter-block width, ``intra``
    the intra-block (bottleneck) width, ``embedding`` the embedding-table width."""

    preset: str | None = None
    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    intermediate: int | None = Field(None, ge=1)
    arch: Literal["bert", "distilbert", "mobilebert"] | None = None
    intra: int | None = Field(None, ge=1)
    embedding: int | None = Field(None, ge=1)

    #: MobileBertConfig field of each MobileBERT-only key.
    MOBILEBERT_KEYS: ClassVar[dict[str, str]] = {"intra": "intra_bottleneck_size", "embedding": "embedding_size"}

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
    kind: Literal["random"] = "random"


class TeacherLayersInit(Section):
    """DistilBERT's initialisation (Sanh et al., 2019, Sec. 3): the teacher's embeddings and these layers."""

    kind: Literal["teacher_layers"] = "teacher_layers"
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


class CheckpointInit(Section):
    """A released general student (local directory or Hub name): skips general distillation."""

    kind: Literal["checkpoint"] = "checkpoint"
    checkpoint: str = Field(min_length=1)


Init = Annotated[Union[RandomInit, TeacherLayersInit, CheckpointInit], Field(discriminator="kind")]


def _init_from_yaml(v: Any) -> Any:
    """``random`` | ``{teacher_layers: [...]}`` | ``{checkpoint: ...}`` -> a tagged dict."""
    if isinstance(v, str):
        if v == "random":
            return {"kind": "random"}
        if v == "teacher_layers":
            return {"kind": "teacher_layers"}
        raise ValueError(f"expected 'random', {{teacher_layers: [...]}} or {{checkpoint: PATH}}, got {v!r}")
    if isinstance(v, dict) and "kind" not in v:
        keys = set(v)
        if keys == {"teacher_layers"}:
            return {"kind": "teacher_layers", **v}
        if keys == {"checkpoint"}:
            return {"kind": "checkpoint", **v}
        raise ValueError(f"expected {{teacher_layers: [...]}} or {{checkpoint: PATH}}, got keys {sorted(keys)}")
    return v


def official_teacher_layers(n_teacher: int, n_student: int) -> list[int]:
    """DistilBERT's released choice for 12 -> 6 ([0, 2, 4, 7, 9, 11]); otherwise evenly spread layers that keep
    the first and the last (the same rule gives the official list for 12 -> 6)."""
    if n_student > n_teacher:
        raise ValueError(f"a {n_student}-layer student cannot take layers of a {n_teacher}-layer teacher")
    if n_student == 1:
        return [n_teacher - 1]
    return [math.floor(i * (n_teacher - 1) / (n_student - 1) + 0.5) for i in range(n_student)]


# ------------------------------------------------------------------------------------------------ recipes

class Recipe(Section):
    """Fields every recipe has. Subclasses fix ``recipe`` and the paper defaults."""

    recipe: str
    shape: Shape
    init: Annotated[Init, Field(default_factory=RandomInit)]
    objectives: dict[str, float] | None = None  # None: the paper's (``OBJECTIVES_DEFAULT``)
    general_distillation: bool | None = None    # None: on unless init is a checkpoint (see ``runs_general``)
    teacher_train_mode: bool = False            # official TinyBERT: teacher dropout on while distilling

    #: RECIPES entry with the paper's objective weights; objectives the general stage can compute.
    OBJECTIVES_DEFAULT: ClassVar[str] = ""
    COMPUTABLE: ClassVar[tuple[str, ...]] = ()
    #: How the task stage trains: "distill" (TinyBERT two steps) or "finetune" (gold labels).
    TASK_STAGE: ClassVar[str] = "finetune"

    @field_validator("init", mode="before")
    @classmethod
    def _init(cls, v):
        return _init_from_yaml(v)

    @field_validator("objectives")
    @classmethod
    def _objective_names(cls, v):
        if v is None:
            return v
        try:
            weights = ObjectiveWeights(v)
        except ObjectiveConfigError as exc:
            raise ValueError(str(exc).removeprefix("objectives: ")) from None
        wrong = [n for n in weights.active() if n not in cls.COMPUTABLE]
        if wrong:
            raise ValueError(
                f"{wrong} cannot be computed by the {cls.model_fields['recipe'].default} recipe's distillation "
                f"stage; it computes {list(cls.COMPUTABLE)}"
            )
        if not weights.active():
            raise ValueError("no objective has a weight > 0")
        return v

    @property
    def weights(self) -> ObjectiveWeights:
        """The objective weights this student trains with (params, else the paper's)."""
        return ObjectiveWeights.from_config(self.objectives if self.objectives is not None else self.OBJECTIVES_DEFAULT)

    @property
    def runs_general(self) -> bool:
        """Whether the student goes through general (pre-training) distillation."""
        if self.general_distillation is not None:
            return self.general_distillation
        return self.init.kind == "random"

    @property
    def needs_mlm_teacher(self) -> bool:
        return False

    def options(self) -> dict[str, Any]:
        """Keyword arguments of ``distillery.training.distill`` set by this recipe (official-behaviour switches)."""
        return {"teacher_train_mode": self.teacher_train_mode}


class TinyBertRecipe(Recipe):
    """TinyBERT (Jiao et al., 2020, Sec. 3-4): transformer distillation in two stages."""

    recipe: Literal["tinybert"] = "tinybert"
    layer_map: Literal["uniform", "top", "bottom"] = "uniform"  # g(m), Sec. 3.1 / Table 7
    official_attention_masking: bool = True      # -10000 masking and zeroing (official) vs valid pairs only
    per_layer_projection: bool = False           # one W_h per mapped state instead of the paper's shared one
    prediction_reduction: Literal["paper", "official"] = "paper"  # eq. 10 summed over classes, or 1/C of it
    augmentation: bool = True       # task distillation on the augmented set when `augment.enabled` (Table 2 "w/o DA")
    intermediate_step: bool = True  # task-distillation step 1 (intermediate layers); off: step 2 (prediction) alone

    OBJECTIVES_DEFAULT: ClassVar[str] = "tinybert-general"
    COMPUTABLE: ClassVar[tuple[str, ...]] = ("attention_loss", "hidden_loss", "embedding_loss")
    TASK_STAGE: ClassVar[str] = "distill"

    def options(self) -> dict[str, Any]:
        return {**super().options(), "official_attention_masking": self.official_attention_masking,
                "per_layer_projection": self.per_layer_projection,
                "prediction_reduction": self.prediction_reduction}


class MiniLMRecipe(Recipe):
    """MiniLM (Wang et al., 2020, Sec. 3): last-layer self-attention distillation, student width free."""

    recipe: Literal["minilm"] = "minilm"
    relation_heads: int = Field(12, ge=1)         # MiniLMv2 relation heads (objective relation_kl)
    teacher_assistant: Literal["auto", "on", "off"] = "auto"  # Sec. 3.3: auto when M <= L/2 and d' <= d/2

    OBJECTIVES_DEFAULT: ClassVar[str] = "minilm"
    COMPUTABLE: ClassVar[tuple[str, ...]] = ("attention_kl", "value_relation_kl", "relation_kl")

    def options(self) -> dict[str, Any]:
        return {**super().options(), "n_relation_heads": self.relation_heads}


class DistilBertRecipe(Recipe):
    """DistilBERT (Sanh et al., 2019, Sec. 3): a student of the teacher's width, initialised from its layers,
    pre-trained by distillation (L = 5 L_ce + 2 L_mlm + 1 L_cos), then fine-tuned."""

    recipe: Literal["distilbert"] = "distilbert"
    init: Annotated[Init, Field(default_factory=TeacherLayersInit)]
    temperature: float = Field(2.0, gt=0)
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    mask_smoothing: float = Field(0.7, ge=0)      # masking probability ~ count^-0.7 (official); 0 = uniform
    adam_beta2: float = Field(0.98, gt=0, lt=1)
    adam_epsilon: float = Field(1e-6, gt=0)
    max_grad_norm: float = Field(5.0, gt=0)
    gradient_accumulation_steps: int = Field(1, ge=1)  # the paper's ~4K-sequence batches: raise on a GPU
    task_distillation: bool = False               # after fine-tuning, distil the prediction layer too

    OBJECTIVES_DEFAULT: ClassVar[str] = "distilbert"
    COMPUTABLE: ClassVar[tuple[str, ...]] = ("soft_target_loss", "mlm_loss", "cosine_loss")

    @property
    def runs_general(self) -> bool:
        if self.general_distillation is not None:
            return self.general_distillation
        return self.init.kind != "checkpoint"

    @property
    def needs_mlm_teacher(self) -> bool:
        return self.runs_general

    def options(self) -> dict[str, Any]:
        return {**super().options(), "temperature": self.temperature}

    def train_options(self) -> dict[str, Any]:
        """TrainingArguments of pre-training distillation that the official code sets."""
        return {"adam_beta2": self.adam_beta2, "adam_epsilon": self.adam_epsilon,
                "max_grad_norm": self.max_grad_norm, "gradient_accumulation_steps": self.gradient_accumulation_steps}


class IBTeacher(Section):
    """MobileBERT's IB-BERT teacher (Sun et al., 2020, Sec. 3.1): inverted bottlenecks give its inter-block feature
    maps the student's width, so eqs. 2-3 compare them without a projection; its intra-block width is its own.

    ``convert``: the pipeline's MLM teacher with bottleneck projections inserted around each of its layers (BERT
    weights inside, new input/output linears) and continued MLM training; ``scratch``: MLM pre-training from random
    weights (the paper), ``shape`` defaulting to the student's depth, width, heads and embedding with an intra-block
    width of twice the inter-block one and FFN 4 x intra (for the ``mobilebert`` student: IB-BERT_LARGE).
    The MLM schedule (lr, batch, warm-up, length) is ``pretrain``'s; ``epochs`` None means ``pretrain.epochs``."""

    init: Literal["convert", "scratch"] = "convert"
    shape: Shape | None = None
    epochs: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _shape_for_scratch(self) -> "IBTeacher":
        if self.shape is not None and self.init != "scratch":
            raise ValueError("`shape` is for init 'scratch' (a converted teacher takes its shape from the teacher)")
        return self


class MobileBertRecipe(Recipe):
    """MobileBERT (Sun et al., 2020, Sec. 3-4): an IB-BERT teacher of the student's feature-map width, layer-wise
    knowledge transfer (feature maps, eq. 2, and attention, eq. 3) with the embedding and classifier copied from the
    teacher, then pre-training distillation (eq. 4), then fine-tuning.

    ``transfer`` (Sec. 3.6, Figure 2): ``progressive`` (L stages; stage l trains layer l at the full learning rate and
    the layers below it and the embedding at ``lower_layer_lr_scale`` x, 0 = frozen), ``joint`` (all layers at once),
    both followed by pre-training distillation; ``auxiliary``: one loss, layer-wise terms + eq. 4, no separate
    transfer stage. ``transfer_epochs`` is the transfer's total (progressive: split evenly over the L stages, like the
    official ``steps_per_phase``); None means ``general_distillation.epochs``. Pre-training distillation uses the
    ``general_distillation`` schedule: ``alpha`` MLM + (1 - alpha) KD on the masked positions + NSP on sentence pairs
    (``next_sentence_prediction``)."""

    recipe: Literal["mobilebert"] = "mobilebert"
    ib_teacher: IBTeacher = IBTeacher()
    transfer: Literal["progressive", "joint", "auxiliary"] = "progressive"
    lower_layer_lr_scale: float = Field(0.1, ge=0, le=1)  # Sec. 3.6 "a small learning rate"; official: 0.1
    transfer_epochs: float | None = Field(None, gt=0)
    feature_map_normalized: bool = False          # official: layer-normalised maps + mean/variance terms
    alpha: float = Field(0.5, gt=0, lt=1)         # eq. 4; Appendix: 0.5 (= official distill_ground_truth_ratio)
    next_sentence_prediction: bool = True         # eq. 4's L_NSP on sentence pairs of the corpus documents
    mlm_probability: float = Field(0.15, gt=0, lt=1)

    OBJECTIVES_DEFAULT: ClassVar[str] = "mobilebert-layerwise"
    COMPUTABLE: ClassVar[tuple[str, ...]] = ("feature_map_loss", "attention_transfer_loss")

    @property
    def needs_mlm_teacher(self) -> bool:
        return self.runs_general and self.ib_teacher.init == "convert"

    @property
    def runs_transfer(self) -> bool:
        """Whether a separate knowledge-transfer stage runs before pre-training distillation."""
        return self.runs_general and self.transfer != "auxiliary"

    def options(self) -> dict[str, Any]:
        return {**super().options(), "feature_map_normalized": self.feature_map_normalized}


StudentRecipe = Annotated[
    Union[TinyBertRecipe, MiniLMRecipe, DistilBertRecipe, MobileBertRecipe], Field(discriminator="recipe")
]
RECIPE_NAMES = ("tinybert", "minilm", "distilbert", "mobilebert")


def recipe_from_yaml(v: Any) -> Any:
    """A student without ``recipe`` is a TinyBERT student (the pipeline's first recipe)."""
    if isinstance(v, dict) and "recipe" not in v:
        return {"recipe": "tinybert", **v}
    return v


# ------------------------------------------------------------------------------------------------ checks

@dataclass(frozen=True)
class Dims:
    """What the checks need to know of a model: depth, width, heads, FFN size, vocabulary, architecture."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int | None = None
    arch: str = "bert"

    @classmethod
    def of_config(cls, cfg) -> "Dims":
        from distillery.models import hidden_size, num_heads, num_layers

        inter = getattr(cfg, "intermediate_size", None) or getattr(cfg, "hidden_dim", 0)
        return cls(num_layers(cfg), hidden_size(cfg), num_heads(cfg), int(inter), getattr(cfg, "vocab_size", None),
                   cfg.model_type)

    @classmethod
    def of_shape(cls, shape, vocab: int | None = None) -> "Dims":
        return cls(shape.layers, shape.hidden, shape.heads, shape.intermediate, vocab, shape.arch)


class RecipeError(UserError, ValueError):
    """A recipe that cannot work with this teacher; the message starts with the params key."""


def teacher_assistant_dims(recipe: MiniLMRecipe, student: Dims, teacher: Dims) -> Dims | None:
    """MiniLM Sec. 3.3: for M <= L/2 and d' <= d/2 (``auto``) or always (``on``), an L-layer, d'-wide assistant
    with the student's heads and FFN size; None when no assistant is used."""
    if recipe.teacher_assistant == "off":
        return None
    if recipe.teacher_assistant == "auto" and not (2 * student.layers <= teacher.layers and 2 * student.hidden <= teacher.hidden):
        return None
    return Dims(teacher.layers, student.hidden, student.heads, student.intermediate, teacher.vocab, "bert")


def student_dims(recipe: Recipe, teacher: Dims, key: str) -> Dims:
    """The student's dims (the resolved shape), raising RecipeError naming ``key`` on an impossible one."""
    from distillery.models import ModelConfigError

    try:
        shape = recipe.shape.resolve()
    except ModelConfigError as exc:
        raise RecipeError(f"{key}.shape: {exc}") from None
    return Dims.of_shape(shape, teacher.vocab)


def check_recipe(recipe: Recipe, teacher: Dims, key: str) -> None:
    """Everything about ``recipe`` that can be checked before training, given the teacher's dims."""
    from distillery.layer_map import LayerMapError, build_layer_map, validate_layer_map

    s = student_dims(recipe, teacher, key)
    names = recipe.weights.active()
    if s.layers > teacher.layers and not isinstance(recipe, MobileBertRecipe):  # MobileBERT: its IB teacher's depth
        raise RecipeError(f"{key}.shape: the student has {s.layers} layers, more than the teacher's {teacher.layers}")
    if recipe.init.kind == "teacher_layers":
        if s.arch not in ("bert", "distilbert") or (s.hidden, s.heads, s.intermediate) != (
                teacher.hidden, teacher.heads, teacher.intermediate):
            raise RecipeError(
                f"{key}.init: teacher_layers needs a bert or distilbert student of the teacher's width "
                f"(hidden {teacher.hidden}, heads {teacher.heads}, intermediate {teacher.intermediate}); the shape "
                f"gives {s.arch} {s.hidden}/{s.heads}/{s.intermediate}")
        layers = recipe.init.teacher_layers
        if layers != "auto":
            if len(layers) != s.layers:
                raise RecipeError(f"{key}.init.teacher_layers: {len(layers)} layers for a {s.layers}-layer student")
            if max(layers) >= teacher.layers:
                raise RecipeError(f"{key}.init.teacher_layers: layer {max(layers)} does not exist in a "
                                  f"{teacher.layers}-layer teacher (0..{teacher.layers - 1})")
    if not recipe.runs_general and recipe.init.kind == "random" and recipe.TASK_STAGE != "distill":
        raise RecipeError(f"{key}.general_distillation: a randomly initialised {recipe.recipe} student needs general "
                          "distillation (or init from teacher_layers / a checkpoint)")
    if isinstance(recipe, TinyBertRecipe):
        try:
            lm = build_layer_map(recipe.layer_map, s.layers, teacher.layers)
            validate_layer_map(lm, s.layers, teacher.layers, s.heads, teacher.heads,
                               head_wise="attention_loss" in names)
        except LayerMapError as exc:
            raise RecipeError(f"{key}.layer_map: {exc}") from None
    elif isinstance(recipe, MiniLMRecipe):
        ta = teacher_assistant_dims(recipe, s, teacher) if recipe.runs_general else None
        pairs = [("teacher", teacher, s)] if ta is None else [("teacher", teacher, ta), ("teacher assistant", ta, s)]
        for what, big, small in pairs:
            if {"attention_kl", "value_relation_kl"} & set(names) and big.heads != small.heads:
                raise RecipeError(
                    f"{key}.objectives: attention_kl / value_relation_kl compare heads one by one: the student has "
                    f"{small.heads} heads, the {what} {big.heads} (use relation_kl with relation_heads)")
            if "relation_kl" in names:
                for who, d in (("student", small), (what, big)):
                    if d.hidden % recipe.relation_heads:
                        raise RecipeError(f"{key}.relation_heads: {recipe.relation_heads} relation heads do not divide "
                                          f"the {who}'s width {d.hidden}")
    elif isinstance(recipe, DistilBertRecipe):
        if "cosine_loss" in names and s.hidden != teacher.hidden:
            raise RecipeError(f"{key}.shape: cosine_loss needs the teacher's hidden size {teacher.hidden}, the student "
                              f"has {s.hidden}")
        if s.arch == "mobilebert":
            raise RecipeError(f"{key}.shape: the distilbert recipe needs a bert or distilbert student")
    elif isinstance(recipe, MobileBertRecipe):
        if s.arch != "mobilebert":
            raise RecipeError(f"{key}.shape: the mobilebert recipe needs a mobilebert shape (a bottleneck student), "
                              f"got {s.arch}")
        if recipe.runs_general and recipe.init.kind == "random":
            from distillery.ib_teacher import IBShapeError, ib_teacher_shape

            try:
                ib = ib_teacher_shape(recipe.shape.resolve(), recipe.ib_teacher.init,
                                      recipe.ib_teacher.shape.resolve() if recipe.ib_teacher.shape else None, teacher)
            except IBShapeError as exc:
                raise RecipeError(f"{key}.ib_teacher: {exc}") from None
            if (s.layers, s.hidden, s.heads) != (ib.layers, ib.hidden, ib.heads):
                raise RecipeError(
                    f"{key}.shape: layer-wise transfer needs the IB teacher's depth, feature-map width and heads "
                    f"({ib.layers}/{ib.hidden}/{ib.heads}); the student has {s.layers}/{s.hidden}/{s.heads}")


def teacher_layers_for(recipe: Recipe, n_student: int, n_teacher: int) -> list[int]:
    """The resolved ``init.teacher_layers`` list ("auto": :func:`official_teacher_layers`)."""
    layers = recipe.init.teacher_layers
    return official_teacher_layers(n_teacher, n_student) if layers == "auto" else list(layers)


__all__ = [
    "Shape", "Recipe", "TinyBertRecipe", "MiniLMRecipe", "DistilBertRecipe", "MobileBertRecipe", "IBTeacher",
    "StudentRecipe",
    "RandomInit", "TeacherLayersInit", "CheckpointInit", "Dims", "RecipeError", "check_recipe",
    "teacher_assistant_dims", "official_teacher_layers", "teacher_layers_for", "RECIPE_NAMES", "OBJECTIVES", "RECIPES",
]


# ------------------------------------------------------------------------------------------------ students

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


def init_student(recipe: Recipe, teacher, tokenizer, *, head: str = "base", **head_kwargs: Any):
    """The student before training, as ``recipe.init`` says: random weights of ``recipe.shape``; the teacher's
    embeddings and ``teacher_layers`` (DistilBERT modules for a distilbert shape, the teacher's own class
    otherwise; heads the teacher has are copied); or a general checkpoint."""
    from distillery.models import build_student, init_from_teacher_layers, num_layers

    shape = recipe.shape.resolve()
    if recipe.init.kind == "checkpoint":
        return load_checkpoint_student(recipe.init.checkpoint, tokenizer, head=head, **head_kwargs)
    if recipe.init.kind == "teacher_layers":
        layers = teacher_layers_for(recipe, shape.layers, num_layers(teacher))
        student = init_from_teacher_layers(teacher, layers, arch="distilbert" if shape.arch == "distilbert" else "same",
                                           head=head)
        for k, v in head_kwargs.items():
            setattr(student.config, k, v)
        return student
    student = build_student(shape, len(tokenizer), head=head, base=teacher.config,
                            num_labels=head_kwargs.get("num_labels", 2))
    for k, v in head_kwargs.items():
        setattr(student.config, k, v)
    return student

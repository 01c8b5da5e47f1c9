"""What every recipe says.

A recipe is one typed, validated entry of ``students.<name>`` in params (a pydantic model, its schema types in
``schema.py``) that owns the paper's behaviour:

* :meth:`Recipe.check`: what it needs of the teacher (depth, width, heads), before any work (`checks.py`);
* ``OBJECTIVES``: the loss terms its layer-wise stage can compute, with the paper's default weights (0 = available but
  off), written once in the recipe's module; ``objectives`` in params overrides them;
* :meth:`Recipe.map_layers`: which student layer learns from which teacher layer;
* ``STUDENT_STAGES`` and :meth:`Recipe.stages`: the student-level stages it adds before the task stage (general
  distillation for every recipe that pre-trains; MiniLM's ``teacher_assistant``, MobileBERT's ``ib_teacher`` and
  ``knowledge_transfer``), each with its body, run with a :class:`StageContext`;
* :meth:`Recipe.plan`: what its student goes through on a task, top to bottom (`distillery.training.plan`; the steps
  every recipe's plan is made of are in ``steps.py``);
* :meth:`Recipe.start_student`: how its student is built and initialised.

The pipeline (``tasks/``) never looks inside a recipe: it hands paths and asks for the stages and the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping

from pydantic import Field, field_validator, model_validator

from distillery.errors import UserError
from distillery.recipes.schema import (LAYER_INITS, BudgetSpec, InitField, RandomInit, RecipeError, Section, Shape,
                                       official_teacher_layers, with_shape)
from distillery.shape import Dims


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
class StudentStage:
    """A student-level stage a recipe adds: its body, and the params section that is its schedule."""

    run: Callable[[StageContext], dict[str, Any]]
    schedule: Literal["general_distillation", "pretrain"] = "general_distillation"


class Recipe(Section):
    """Fields every recipe has; subclasses fix ``recipe``, the paper defaults and the behaviour."""

    recipe: str                                # the paper: tinybert (default) | minilm | distilbert | mobilebert | pkd
    shape: Shape | None = None                 # exactly one of shape and budget
    budget: BudgetSpec | None = None           # a latency budget: the search stage picks the shape
    # how the student's weights start: random | teacher_layers | pruned | checkpoint (a name, or {name: {keys}})
    init: Annotated[InitField, Field(default_factory=RandomInit)]
    objectives: dict[str, float] | None = None  # None: the paper's (``OBJECTIVES``)
    general_distillation: bool | None = None    # None: on unless init is a checkpoint (see ``runs_general``)
    teacher_train_mode: bool = False            # official TinyBERT: teacher dropout on while distilling
    #: after the fine-tuning grid, prediction-layer distillation from the fine-tuned teacher (DistilBERT's SQuAD extra
    #: step, Sec. 4.2; a CPU-budget option for MiniLM and MobileBERT, whose papers fine-tune only, and after BERT-PKD's
    #: task stage); ``augmented``: that step on TinyBERT's augmented set when `augment.enabled` (a CPU-budget option of
    #: this project, no paper's); TinyBERT refuses it (its step 2 is that step)
    task_distillation: bool | Literal["augmented"] = False
    #: before fine-tuning, the recipe's own layer-wise objectives from the fine-tuned teacher on the task's training
    #: set (``task_distillation.intermediate``), as TinyBERT's task step 1 does with its losses: a CPU-budget option
    #: of the recipes that distil task-agnostically (MiniLM, MobileBERT: ``TASK_LAYER_WISE``); TinyBERT's is on
    intermediate_step: bool = False
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
    #: Whether ``intermediate_step`` applies: the recipe's layer-wise objectives can read the fine-tuned teacher.
    TASK_LAYER_WISE: ClassVar[bool] = False
    #: Whether a randomly initialised student may skip general distillation (its task stage distils layer-wise or
    #: from the teacher's hidden states).
    TASK_DISTILLS: ClassVar[bool] = False
    #: ``layers_from``'s default: whether a student initialised from teacher layers copies them from the pre-trained
    #: teacher (a fresh head) even when it runs no general stage (BERT-PKD: its official code starts BERT_k from
    #: pre-trained BERT's first k layers); otherwise such a student starts from the fine-tuned teacher.
    LAYERS_FROM_PRETRAINED: ClassVar[bool] = False
    #: ``teacher_layers: auto``: ``spread`` (`official_teacher_layers`: evenly, the first and the last kept), ``mapped``
    #: (the layers the layer map aligns the student's with), ``first`` (the first k: BERT-PKD).
    TEACHER_LAYERS: ClassVar[Literal["spread", "mapped", "first"]] = "spread"
    #: What trains a student cut from its distilled twin (``init: {pruned: {source: student}}``): ``finetune`` (the
    #: gold labels: the cut's hidden states are narrower than the teacher's, which a layer-wise objective of the recipe
    #: may not compare) or ``prediction`` (the recipe's prediction step again, from the teacher).
    CUT_TRAINING: ClassVar[Literal["finetune", "prediction"]] = "finetune"
    #: The recipe's official-behaviour switches (fields), for the model card and MLflow (`recipe_options`).
    OPTIONS: ClassVar[tuple[str, ...]] = ("teacher_train_mode",)
    #: Every student-level stage :meth:`stages` may return, in order -> the folder of ``models/`` it writes
    #: (``models/<folder>/<student>/model``).
    STUDENT_STAGES: ClassVar[dict[str, str]] = {"general_distillation": "general"}

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        if (self.shape is None) == (self.budget is None):
            raise ValueError("give a shape, or a budget (the search stage then picks the shape), not "
                             + ("both" if self.shape is not None else "neither"))
        if self.layers_from is not None and self.init.kind not in LAYER_INITS:
            raise ValueError(f"layers_from: {self.layers_from} needs an init from teacher layers (teacher_layers or "
                             f"pruned), not {self.init.kind}")
        if self.layers_from == "finetuned" and self.runs_general:
            raise ValueError("layers_from: finetuned: general distillation starts from the pre-trained teacher's "
                             "layers; give general_distillation: false")
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
    def needs_mlm_teacher(self) -> bool:
        """Whether a stage of the recipe distils an MLM teacher's output distribution."""
        return False

    def ablations(self) -> dict[str, tuple[str, "Recipe"]]:
        """The paper's ablations of this student: variant name -> (what the paper calls it, the changed recipe)."""
        return {}

    def loss_options(self):
        """``LossOptions`` of this recipe's equations in its own steps (the extra step's temperature and regression
        target are its section's: `steps.predict`)."""
        from distillery.objectives.registry import LossOptions

        return LossOptions()

    def check(self, teacher: Dims, key: str) -> None:
        """Everything that can be checked before training, given the teacher's dims; subclasses add theirs."""
        from distillery.recipes.checks import common_checks

        common_checks(self, teacher, key)

    def _check_pruned(self, teacher: Dims, s: Dims, key: str) -> None:
        """``init: pruned``: a student shape `distillery.pruning` can cut from the teacher."""
        from distillery.recipes.checks import check_bert_cut

        check_bert_cut(teacher, s, key)

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
        """General distillation on the corpus with the recipe's layer-wise objectives (TinyBERT, MiniLM), from the
        teacher, or from its assistant where an earlier stage trained one (MiniLM, Sec. 3.3)."""
        from transformers import AutoModel, AutoTokenizer

        from distillery.models import num_layers
        from distillery.training.distill import distill
        from distillery.training.spec import TrainRun

        tokenizer = AutoTokenizer.from_pretrained(ctx.teacher)
        teacher = AutoModel.from_pretrained(str(ctx.inputs.get("teacher_assistant", ctx.teacher)))
        train, n = corpus_dataset(ctx, tokenizer)
        model = self.start_student(teacher, tokenizer, head="base", data=train)
        spec = self.layer_wise_spec(num_layers(model), num_layers(teacher))
        distill(teacher, model, spec, TrainRun(ctx.out, train, tokenizer=tokenizer, args=ctx.args))
        return {"metrics": {"sequences": n}}

    def start_student(self, teacher, tokenizer, *, head: str = "base", data=None, **head_kwargs: Any):
        """The student before training, as ``init`` says: random weights of ``shape``; the teacher's embeddings and
        ``teacher_layers`` (DistilBERT modules for a distilbert shape, the teacher's own class otherwise; heads the
        teacher has are copied); the teacher pruned to ``shape`` (``pruned``: importance measured on ``data``, a
        dataset of model inputs; a MobileBERT shape is cut from the teacher converted to an IB teacher); or a general
        checkpoint."""
        from distillery.models import build_student, init_from_teacher_layers, num_layers

        shape = self.shape.resolve()
        num_labels = head_kwargs.get("num_labels", 2)
        if self.init.kind == "checkpoint":
            return load_checkpoint_student(self.init.checkpoint, tokenizer, head=head, **head_kwargs)
        if self.init.kind == "pruned":
            if data is None:
                raise RecipeError("init pruned measures importance on real inputs, and this stage gave none")
            from distillery.pruning import sample_batches

            batches = sample_batches(data, tokenizer, self.init.samples)
            student = cut_from_teacher(teacher, shape, teacher_layers(self, num_layers(teacher), shape.layers),
                                       batches, head=head, num_labels=num_labels)
        elif self.init.kind == "teacher_layers":
            layers = teacher_layers(self, num_layers(teacher), shape.layers)
            student = init_from_teacher_layers(teacher, layers, head=head,
                                               arch="distilbert" if shape.arch == "distilbert" else "same")
        else:
            student = build_student(shape, len(tokenizer), head=head, base=teacher.config, num_labels=num_labels)
        for k, v in head_kwargs.items():
            setattr(student.config, k, v)
        return student

    def plan(self, teacher: Dims, sections: Any):
        """What the student goes through on a task (``sections``: the ``task_distillation`` params): fine-tuning over
        the grid on the gold labels (MiniLM, DistilBERT, MobileBERT), after step 1 (the recipe's layer-wise objectives
        on the task) when ``intermediate_step``, then, with ``task_distillation``, the extra step."""
        from distillery.recipes.steps import after, extra, finetune, intermediate, student_start
        from distillery.training.plan import Plan

        if not self.intermediate_step:
            return Plan((finetune(student_start(self)), *extra(self, sections)))
        return Plan((intermediate(self, student_start(self), teacher), finetune(after("intermediate")),
                     *extra(self, sections)), curve="intermediate")


def recipe_options(recipe: Recipe) -> dict[str, Any]:
    """The recipe's official-behaviour switches (``OPTIONS``), for the model card and MLflow."""
    return {name: getattr(recipe, name) for name in recipe.OPTIONS}


def teacher_layers(recipe: Recipe, n_teacher: int, n_student: int) -> list[int]:
    """The teacher layers (0-based) a layer init copies: ``init.teacher_layers``, or the recipe's ``TEACHER_LAYERS``
    rule for ``auto``."""
    if (layers := recipe.init.teacher_layers) != "auto":
        return list(layers)
    if recipe.TEACHER_LAYERS == "first":
        return list(range(n_student))
    if recipe.TEACHER_LAYERS == "mapped":  # step 1 starts each student layer from the layer it is to imitate
        return list(recipe.map_layers(n_student, n_teacher).teacher_layers)
    return official_teacher_layers(n_teacher, n_student)


def cut_from_teacher(teacher, shape, layers: list[int], batches, *, head: str, num_labels: int):
    """``init: pruned``: the teacher's ``layers`` pruned to ``shape``, importance measured on ``batches``
    (`distillery.pruning`); a MobileBERT shape from the teacher converted to an IB teacher (`distillery.ib_pruning`)."""
    if shape.arch == "mobilebert":
        from distillery.ib_pruning import measure_block_importance, prune_ib_teacher
        from distillery.ib_teacher import convert_bert
        from distillery.models import build_student

        ib = convert_bert(teacher, shape)
        student = build_student(shape, teacher.config.vocab_size, head=head, base=ib.config, num_labels=num_labels)
        return prune_ib_teacher(ib, student, measure_block_importance(ib, batches))
    from distillery.pruning import measure_importance, prune_teacher

    importance = measure_importance(teacher, batches, layers)
    return prune_teacher(teacher, layers, hidden=shape.hidden, heads=shape.heads, intermediate=shape.intermediate,
                         importance=importance, head=head)


def corpus_dataset(ctx: StageContext, tokenizer, max_length: int | None = None):
    """The corpus packed into sequences of the schedule's length and tokenized: (dataset, number of sequences)."""
    from distillery import corpus
    from distillery.training.mlm import tokenize_texts

    length = max_length or ctx.schedule.max_length
    texts = corpus.pack_sequences(corpus.read_sentences(ctx.corpus), tokenizer, length)
    return tokenize_texts(texts, tokenizer, length), len(texts)


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

"""What a training run needs, as two typed values instead of dozens of keyword arguments.

* :class:`TrainRun` says *how to train*: the data, where to write, the Trainer settings, model selection on dev.
  Every loop takes one (``finetune``, ``train_mlm``, ``distill``, the grids, the MobileBERT transfers).
* :class:`DistillSpec` says *what to distil*: the loss terms and their weights (``objectives``), the layer map,
  the stage, the loss options and the distillation-only parameters. A recipe (``distillery.recipes``) builds one per
  stage; ``distillery.training.distill.distill(teacher, student, spec, run)`` trains it.
* :class:`Grid` says *which runs to select from* in a task stage (``distillery.training.grid.prediction_grid``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from distillery.layer_map import LayerMap
from distillery.objectives.registry import LEVELS, TERMS, LossOptions, ObjectiveConfigError, level_terms
from distillery.objectives.weights import ObjectiveWeights

#: The level of the models a distillation's terms read (TinyBERT's "intermediate layer" / "prediction layer"
#: distillation, and the pre-training heads):
#: "intermediate": layer-wise terms (general distillation, TinyBERT step 1, MiniLM, MobileBERT transfer);
#: "prediction": task-stage terms on logits (TinyBERT step 2, DistilBERT's extra step, BERT-PKD);
#: "pretraining": MLM-logit terms (DistilBERT, MobileBERT eq. 4). The level decides what evaluation means: in
#: "intermediate" and "prediction" an eval batch runs the student alone; "pretraining" has no dev set.
Level = Literal["intermediate", "prediction", "pretraining"]


@dataclass(frozen=True)
class DistillSpec:
    """One distillation: L = sum_n w_n L_n over the active terms of ``objectives``.

    ``projection``: a saved ``distill_state.safetensors`` (file or directory) or a ``HiddenProjection`` to
    continue from (TinyBERT's W_h); made fresh when a term needs one. ``teacher_train_mode``: the official TinyBERT
    code leaves the teacher's dropout on. Active terms not registered for ``level``, or no active term, are an
    ``ObjectiveConfigError`` here."""

    objectives: ObjectiveWeights
    level: Level = "intermediate"
    layer_map: LayerMap = field(default_factory=LayerMap)
    options: LossOptions = field(default_factory=LossOptions)
    projection: Any = None
    per_layer_projection: bool = False
    teacher_train_mode: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.objectives, ObjectiveWeights):
            object.__setattr__(self, "objectives", ObjectiveWeights.from_config(self.objectives))
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {list(LEVELS)}, got {self.level!r}")
        active = self.objectives.active()
        if not active:
            raise ObjectiveConfigError(f"level {self.level!r}: no objective has a weight > 0")
        unsupported = [n for n in active if self.level not in TERMS[n].levels]
        if unsupported:
            raise ObjectiveConfigError(
                f"objectives {unsupported} are not computed at the {self.level!r} level (it computes "
                f"{', '.join(level_terms(self.level))})"
            )

    @property
    def active(self) -> tuple[str, ...]:
        """The names of the terms with a weight > 0, in config order."""
        return self.objectives.active()

    def with_(self, **changes: Any) -> "DistillSpec":
        return replace(self, **changes)


def built(args: Any) -> bool:
    """Whether a run's ``args`` are its `TrainingArguments` already (not options a loop builds them from)."""
    from transformers import TrainingArguments

    return isinstance(args, TrainingArguments)


@dataclass(frozen=True)
class TrainRun:
    """Data, output and Trainer settings of one training run.

    ``args``: TrainingArguments fields (a mapping, merged over the loop's defaults), or the run's `TrainingArguments`
    built already by `distillery.training.args.training_arguments` with the loop's `OPTIONS` and its output in
    ``checkpoint_dir(output_dir)`` (a grid's runs), which the loop trains by as they are.
    With ``eval_dataset`` and ``compute_metrics`` the best checkpoint on ``main_score`` is exported.
    ``param_groups``: ``[{"params": [...], "lr_scale": s}, ...]``, the only parameters trained (MobileBERT's
    progressive transfer). ``resume``: continue from the newest complete checkpoint under ``output_dir``."""

    output_dir: Path
    train_dataset: Any
    eval_dataset: Any = None
    tokenizer: Any = None
    data_collator: Callable[[list[dict]], dict] | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    compute_metrics: Callable[..., dict] | None = None
    main_score: Callable[[dict], float] | str | None = None
    callbacks: Sequence[Any] = ()
    resume: bool = True
    param_groups: Sequence[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dir", Path(os.fspath(self.output_dir)))
        if isinstance(self.args, Mapping):
            object.__setattr__(self, "args", dict(self.args))
        elif not built(self.args):
            raise TypeError("TrainRun.args: a mapping of TrainingArguments fields, or TrainingArguments, got "
                            f"{type(self.args).__name__}")

    def training_arguments(self, options: Mapping[str, Any], select: bool):
        """The run's `TrainingArguments`: ``args`` when built already, else built from them over the loop's own
        ``options`` (`distillery.training.args.training_arguments`, ``select``: best-model selection on dev), in
        ``checkpoint_dir(output_dir)``."""
        if built(self.args):
            return self.args
        from distillery.training.args import training_arguments
        from distillery.training.saving import checkpoint_dir

        return training_arguments(checkpoint_dir(self.output_dir), {**options, **self.args}, select=select)

    def with_(self, **changes: Any) -> "TrainRun":
        """A copy with fields replaced; ``args=`` is merged over the current args (a grid run's lr and batch)."""
        if "args" in changes and isinstance(changes["args"], Mapping):
            changes["args"] = {**self.args, **changes["args"]}
        return replace(self, **changes)


@dataclass(frozen=True)
class Grid:
    """Task-stage model selection: one run per (learning rate, global batch size), each ``epochs`` long, the best on
    the dev main score kept (TinyBERT Sec. 4.2 step 2; the fine-tuning grid of MiniLM, DistilBERT, MobileBERT).
    ``cache_teacher_logits``: run the teacher once per example and share its logits across the runs
    (``distillery.training.logits_cache``; in ``cache_dir``, default ``<output_dir>/teacher_logits``)."""

    learning_rates: Sequence[float]
    batch_sizes: Sequence[int]
    epochs: float
    cache_teacher_logits: bool = True
    cache_dir: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "learning_rates", tuple(self.learning_rates))
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        if not self.learning_rates or not self.batch_sizes:
            raise ValueError("a grid needs at least one learning rate and one batch size")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(os.fspath(self.cache_dir)))

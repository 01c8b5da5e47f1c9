"""Knowledge distillation on the Hugging Face Trainer (TinyBERT, Jiao et al. 2020, section 3; MiniLM, Wang et al.
2020, section 3; MobileBERT attention/feature-map transfer).

`DistillationTrainer.compute_loss` runs the teacher (eval mode, `torch.no_grad()`; the official train-mode
teacher is an option), captures ONLY the mapped layers of both models (`distillery.capture`), and combines
the objectives of `distillery.objectives` with their config weights:

    L = sum_n w_n L_n      e.g. TinyBERT intermediate stage: L_attn (eq. 7) + L_hidn (eq. 8) + L_embd (eq. 9)
                                TinyBERT prediction stage:  L_pred (eq. 10), soft CE at temperature t

Prediction-layer distillation may read teacher logits from a `teacher_logits` column (see
`distillery.training.logits_cache`) instead of running the teacher. The learnable hidden projection is an
optimiser parameter, checkpointed with the Trainer state, and exported beside the student
(`distill_state.safetensors`), never inside it.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import datasets
import torch
from torch import Tensor, nn
from transformers import (
    DataCollatorWithPadding,
    PreTrainedModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from distillery.capture import capture
from distillery.layer_map import LayerMap, validate_layer_map
from distillery.objectives import (
    HiddenProjection,
    ObjectiveConfigError,
    ObjectiveWeights,
    attention_kl,
    attention_loss,
    attention_transfer_loss,
    embedding_loss,
    feature_map_loss,
    hidden_loss,
    prediction_loss,
    regression_prediction_loss,
    relation_kl,
    value_relation_kl,
)
from distillery.training.args import training_arguments
from distillery.training.distill_state import load_projection_into, save_projection, state_file
from distillery.training.finetune import selection_args
from distillery.training.log import LOG_NAME, rows_from_state, write_log
from distillery.training.metrics import MetricFn, trainer_metrics
from distillery.training.saving import checkpoint_dir, last_checkpoint, save_final

Stage = Literal["intermediate", "prediction", "both"]

#: Objectives computed from internals of the mapped layers (intermediate stage).
INTERMEDIATE = (
    "attention_loss", "hidden_loss", "embedding_loss", "attention_kl", "value_relation_kl", "relation_kl",
    "attention_transfer_loss", "feature_map_loss",
)
#: Objectives computed from the output logits (prediction stage).
PREDICTION = ("prediction_loss", "regression_prediction_loss")
DEFAULT_OBJECTIVES: dict[str, dict[str, float]] = {
    "intermediate": {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0},
    "prediction": {"prediction_loss": 1.0},
    "both": {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0, "prediction_loss": 1.0},
}
TEACHER_LOGITS = "teacher_logits"


@dataclass
class DistillSettings:
    """Everything `compute_loss` needs besides the two models.

    temperature / prediction_reduction: eq. 10 (`"paper"`: CE summed over classes; `"official"`: 1/C of it).
    regression_target: STS-B prediction loss against the teacher (default) or gold (official code).
    official_attention_masking: TinyBERT eq. 7 with the official -10000/zeroing semantics (default) or
        the paper's valid-pairs-only MSE. n_relation_heads: MiniLM v2 relation heads for `relation_kl`.
    """

    objectives: ObjectiveWeights
    layer_map: LayerMap
    stage: Stage = "both"
    temperature: float = 1.0
    prediction_reduction: Literal["paper", "official"] = "paper"
    regression_target: Literal["teacher", "gold"] = "teacher"
    official_attention_masking: bool = True
    n_relation_heads: int = 12
    feature_map_normalized: bool = False
    active: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.stage not in DEFAULT_OBJECTIVES:
            raise ValueError(f"stage must be one of {sorted(DEFAULT_OBJECTIVES)}, got {self.stage!r}")
        allowed = {"intermediate": INTERMEDIATE, "prediction": PREDICTION, "both": INTERMEDIATE + PREDICTION}[self.stage]
        unsupported = [n for n in self.objectives.active() if n not in INTERMEDIATE + PREDICTION]
        if unsupported:
            raise ObjectiveConfigError(
                f"objectives {unsupported} are not computed by DistillationTrainer (supported: "
                f"{', '.join(INTERMEDIATE + PREDICTION)})"
            )
        self.active = tuple(n for n in self.objectives.active() if n in allowed)
        if not self.active:
            raise ObjectiveConfigError(
                f"stage {self.stage!r}: no active objective among {list(allowed)} (weights: {dict(self.objectives.weights)})"
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def intermediate(self) -> bool:
        return any(n in INTERMEDIATE for n in self.active)

    @property
    def prediction(self) -> bool:
        return any(n in PREDICTION for n in self.active)

    @property
    def needs_projection(self) -> bool:
        return "hidden_loss" in self.active or "embedding_loss" in self.active

    def capture_specs(self) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """(student, teacher) keyword arguments for `capture`: only what the active objectives read."""
        s: dict[str, set[int]] = {}
        t: dict[str, set[int]] = {}

        def need(kind: str, pairs: Sequence[tuple[int, int]]) -> None:
            s.setdefault(kind, set()).update(a for a, _ in pairs)
            t.setdefault(kind, set()).update(b for _, b in pairs)

        lm = self.layer_map
        states = [p for p in lm.hidden if p[0] != 0]
        emb = [p for p in lm.hidden if p[0] == 0]
        if "attention_loss" in self.active:
            need("scores", lm.attention)
        if "attention_kl" in self.active or "attention_transfer_loss" in self.active:
            need("probs", lm.attention)
        if "value_relation_kl" in self.active:
            need("values", lm.attention)
        if "relation_kl" in self.active:
            for kind in ("queries", "keys", "values"):
                need(kind, lm.attention)
        if "hidden_loss" in self.active or "feature_map_loss" in self.active:
            need("hidden", states)
        if "embedding_loss" in self.active:
            need("hidden", emb)
        return ({k: tuple(sorted(v)) for k, v in s.items() if v}, {k: tuple(sorted(v)) for k, v in t.items() if v})


def _forward_keys(model: nn.Module) -> frozenset[str]:
    return frozenset(inspect.signature(model.forward).parameters)


def intermediate_losses(
    settings: DistillSettings,
    student_cap,
    teacher_cap,
    attention_mask: Tensor | None,
    projection: HiddenProjection | None,
) -> dict[str, Tensor]:
    """Per-objective intermediate-layer losses from the captured tensors (unweighted)."""
    lm, act, out = settings.layer_map, settings.active, {}
    s_layers, t_layers = lm.student_layers, lm.teacher_layers
    if "attention_loss" in act:
        out["attention_loss"] = attention_loss(
            student_cap.select("scores", s_layers), teacher_cap.select("scores", t_layers), attention_mask,
            official_masking=settings.official_attention_masking,
        )
    if "attention_kl" in act:
        out["attention_kl"] = attention_kl(
            student_cap.select("probs", s_layers), teacher_cap.select("probs", t_layers), attention_mask
        )
    if "attention_transfer_loss" in act:
        out["attention_transfer_loss"] = attention_transfer_loss(
            student_cap.select("probs", s_layers), teacher_cap.select("probs", t_layers), attention_mask
        )
    if "value_relation_kl" in act:
        out["value_relation_kl"] = value_relation_kl(
            student_cap.select("values", s_layers), teacher_cap.select("values", t_layers), attention_mask
        )
    if "relation_kl" in act:
        out["relation_kl"] = sum(
            relation_kl(student_cap.select(k, s_layers), teacher_cap.select(k, t_layers), attention_mask,
                        settings.n_relation_heads)
            for k in ("queries", "keys", "values")
        )
    # projection index of a hidden pair = its position in layer_map.hidden (per-layer projections)
    indexed = list(enumerate(lm.hidden))
    states = [(i, p) for i, p in indexed if p[0] != 0]
    if "hidden_loss" in act and states:
        out["hidden_loss"] = hidden_loss(
            student_cap.select("hidden", [p[0] for _, p in states]),
            teacher_cap.select("hidden", [p[1] for _, p in states]),
            projection,
            indices=[i for i, _ in states],
        )
    if "embedding_loss" in act:
        emb = [(i, p) for i, p in indexed if p[0] == 0]
        if not emb:
            raise ObjectiveConfigError("embedding_loss is active but the layer map has no embedding pair (0, 0)")
        i, (s0, t0) = emb[0]
        out["embedding_loss"] = embedding_loss(student_cap.hidden[s0], teacher_cap.hidden[t0], projection, index=i)
    if "feature_map_loss" in act and states:
        out["feature_map_loss"] = feature_map_loss(
            student_cap.select("hidden", [p[0] for _, p in states]),
            teacher_cap.select("hidden", [p[1] for _, p in states]),
            attention_mask,
            normalized=settings.feature_map_normalized,
        )
    return out


def prediction_losses(
    settings: DistillSettings, student_logits: Tensor, teacher_logits: Tensor | None, labels: Tensor | None
) -> dict[str, Tensor]:
    """Prediction-layer loss: soft CE (eq. 10) for classification, MSE for a one-output (regression) head."""
    if "prediction_loss" not in settings.active and "regression_prediction_loss" not in settings.active:
        return {}
    regression = student_logits.shape[-1] == 1
    if regression:
        loss = regression_prediction_loss(student_logits, teacher_logits, labels, target=settings.regression_target)
    else:
        if teacher_logits is None:
            raise ValueError("prediction_loss needs teacher logits (teacher forward or a teacher_logits column)")
        loss = prediction_loss(
            student_logits, teacher_logits, settings.temperature, reduction=settings.prediction_reduction
        )
    name = "regression_prediction_loss" if "regression_prediction_loss" in settings.active else "prediction_loss"
    return {name: loss}


class DistillationTrainer(Trainer):
    """`Trainer` whose loss is the weighted sum of distillation objectives (see module docstring).

    Extra constructor arguments: `teacher`, `settings` (DistillSettings), `projection` (HiddenProjection or
    None), `teacher_train_mode` (official behaviour: teacher dropout active; still no gradients).
    Each loss term is logged separately (`train_<name>` keys, averaged over the logging interval).
    """

    def __init__(
        self,
        *args: Any,
        teacher: PreTrainedModel | None,
        settings: DistillSettings,
        projection: HiddenProjection | None = None,
        teacher_train_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.teacher = teacher
        self.settings = settings
        self.projection = projection
        self.teacher_train_mode = teacher_train_mode
        self._student_cap, self._teacher_cap = settings.capture_specs()
        self._student_keys = _forward_keys(self.model)
        self._teacher_keys = _forward_keys(teacher) if teacher is not None else frozenset()
        self._term_sums: dict[str, Tensor] = {}
        self._term_count = 0
        if teacher is not None:
            teacher.to(self.args.device)
            teacher.requires_grad_(False)
            teacher.train(teacher_train_mode)
        if projection is not None:
            projection.to(self.args.device)

    # -- columns and optimiser ------------------------------------------------------------------------
    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if TEACHER_LOGITS not in self._signature_columns:
            self._signature_columns.append(TEACHER_LOGITS)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.projection is not None and not getattr(self, "_projection_in_optimizer", False):
            decay = [p for n, p in self.projection.named_parameters() if not n.endswith("bias")]
            no_decay = [p for n, p in self.projection.named_parameters() if n.endswith("bias")]
            optimizer.add_param_group({"params": decay, "weight_decay": self.args.weight_decay})
            optimizer.add_param_group({"params": no_decay, "weight_decay": 0.0})
            self._projection_in_optimizer = True
        return optimizer

    # -- loss -----------------------------------------------------------------------------------------
    def teacher_forward(self, inputs: Mapping[str, Tensor]):
        """Teacher outputs and captured internals (no gradients; eval mode unless teacher_train_mode)."""
        if self.teacher is None:
            raise ValueError("this distillation needs a teacher forward, but no teacher was given")
        self.teacher.train(self.teacher_train_mode)
        t_in = {k: v for k, v in inputs.items() if k in self._teacher_keys}
        with torch.no_grad(), capture(self.teacher, **self._teacher_cap) as cap:
            out = self.teacher(**t_in)
        return out, cap

    def distillation_loss(self, model: nn.Module, inputs: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor], Any]:
        """(total, {objective: unweighted loss}, student outputs) for one batch."""
        inputs = dict(inputs)
        labels = inputs.pop("labels", None)
        cached = inputs.pop(TEACHER_LOGITS, None)
        s = self.settings
        need_teacher_logits = s.prediction and cached is None and not (
            s.regression_target == "gold" and model.config.num_labels == 1
        )
        teacher_out, teacher_cap = None, None
        if s.intermediate or need_teacher_logits:
            teacher_out, teacher_cap = self.teacher_forward(inputs)
        s_in = {k: v for k, v in inputs.items() if k in self._student_keys}
        if s.intermediate:
            with capture(model, **self._student_cap) as student_cap:
                s_out = model(**s_in)
        else:
            s_out = model(**s_in)
        mask = inputs.get("attention_mask")
        terms: dict[str, Tensor] = {}
        if s.intermediate:
            terms.update(intermediate_losses(s, student_cap, teacher_cap, mask, self.projection))
        if s.prediction:
            t_logits = cached if cached is not None else (teacher_out.logits if teacher_out is not None else None)
            terms.update(prediction_losses(s, s_out.logits, t_logits, labels))
        return s.objectives.combine(terms), terms, s_out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training and "labels" in inputs:
            # evaluation of a task student: its own loss on gold labels, logits for compute_metrics
            inputs = {k: v for k, v in inputs.items() if k in self._student_keys or k == "labels"}
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss
        total, terms, outputs = self.distillation_loss(model, inputs)
        if model.training:
            for name, value in terms.items():
                v = value.detach()
                self._term_sums[name] = self._term_sums.get(name, torch.zeros_like(v)) + v
            self._term_count += 1
        return (total, outputs) if return_outputs else total

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._term_count:
            for name, total in self._term_sums.items():
                logs[f"train_{name}"] = round(float(total) / self._term_count, 6)
            self._term_sums, self._term_count = {}, 0
        super().log(logs, start_time)

    # -- checkpoints: the projection travels with the Trainer state, beside the student ---------------
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        if self.projection is not None and self.args.should_save:
            save_projection(self.projection, output_dir if output_dir is not None else self.args.output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self.projection is not None:
            load_projection_into(self.projection, resume_from_checkpoint)

    def _load_best_model(self) -> None:
        super()._load_best_model()
        if self.projection is not None:
            load_projection_into(self.projection, self.state.best_model_checkpoint)


class DistillationCollator:
    """Pads token columns with `base` and stacks a `teacher_logits` column separately."""

    def __init__(self, base: Callable[[list[dict]], dict]) -> None:
        self.base = base

    def __call__(self, features: list[dict]) -> dict:
        logits = None
        if features and TEACHER_LOGITS in features[0]:
            logits = torch.tensor([f[TEACHER_LOGITS] for f in features], dtype=torch.float32)
            features = [{k: v for k, v in f.items() if k != TEACHER_LOGITS} for f in features]
        batch = self.base(features)
        if logits is not None:
            batch[TEACHER_LOGITS] = logits
        return batch


def make_projection(
    student: PreTrainedModel,
    teacher: PreTrainedModel | None,
    layer_map: LayerMap,
    *,
    shared: bool = True,
    init_from: str | os.PathLike | HiddenProjection | None = None,
) -> HiddenProjection:
    """TinyBERT's W_h/W_e: a fresh Linear(d_student -> d_teacher) (shared, or one per mapped state), optionally
    continued from a saved `distill_state.safetensors` (a general-distillation student's directory)."""
    if isinstance(init_from, HiddenProjection):
        return init_from
    from distillery.models import hidden_size

    d_t = hidden_size(teacher) if teacher is not None else None
    proj = HiddenProjection(hidden_size(student), d_t, n_states=max(1, len(layer_map.hidden)), shared=shared)
    if init_from is not None:
        load_projection_into(proj, init_from)
    return proj


def distill(
    teacher: PreTrainedModel | None,
    student: PreTrainedModel,
    train_dataset: datasets.Dataset,
    eval_dataset: datasets.Dataset | None,
    output_dir: str | os.PathLike,
    *,
    layer_map: LayerMap | None = None,
    objectives: Mapping[str, float] | str | ObjectiveWeights | None = None,
    stage: Stage = "both",
    temperature: float = 1.0,
    prediction_reduction: Literal["paper", "official"] = "paper",
    regression_target: Literal["teacher", "gold"] = "teacher",
    official_attention_masking: bool = True,
    n_relation_heads: int = 12,
    projection: HiddenProjection | str | os.PathLike | None = None,
    per_layer_projection: bool = False,
    teacher_train_mode: bool = False,
    compute_metrics: MetricFn | None = None,
    main_score: Callable[[dict], float] | str | None = None,
    tokenizer=None,
    args: Mapping[str, Any] | TrainingArguments | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    resume: bool = True,
    **overrides: Any,
) -> Path:
    """Distil `teacher` into `student`; return `output_dir/model` (student + tokenizer + distill_state + log).

    stage: "intermediate" (TinyBERT step 1 / general distillation: attention + hidden + embedding by default),
    "prediction" (step 2: soft CE on logits; reads a `teacher_logits` column when present, so the teacher may
    be None) or "both". `objectives` weights select and combine losses (a mapping or a recipe name of
    `distillery.objectives.RECIPES`). `layer_map` is validated against both models before training.
    `projection`: a directory / file of a saved `distill_state.safetensors` to continue from (e.g. the general
    student's), or a HiddenProjection. General distillation = no labels and no eval set.
    With an eval set and `compute_metrics`, the best checkpoint on the main score is exported.
    """
    from distillery.models import num_heads, num_layers

    weights = objectives if isinstance(objectives, ObjectiveWeights) else ObjectiveWeights.from_config(
        objectives if objectives is not None else DEFAULT_OBJECTIVES[stage]
    )
    if layer_map is None:
        layer_map = LayerMap()
    settings = DistillSettings(
        objectives=weights, layer_map=layer_map, stage=stage, temperature=temperature,
        prediction_reduction=prediction_reduction, regression_target=regression_target,
        official_attention_masking=official_attention_masking, n_relation_heads=n_relation_heads,
    )
    if settings.intermediate:
        if teacher is None:
            raise ValueError(f"stage {stage!r} with intermediate objectives {settings.active} needs a teacher")
        if not layer_map.hidden and not layer_map.attention:
            raise ValueError("intermediate objectives need a layer_map (distillery.layer_map.build_layer_map)")
        head_wise = any(n in settings.active for n in ("attention_loss", "attention_kl", "attention_transfer_loss",
                                                        "value_relation_kl"))
        validate_layer_map(layer_map, num_layers(student), num_layers(teacher), num_heads(student),
                           num_heads(teacher), head_wise=head_wise)
    proj = None
    if settings.needs_projection:
        proj = make_projection(student, teacher, layer_map, shared=not per_layer_projection, init_from=projection)
    opts = dict(args) if isinstance(args, Mapping) else {}
    base = args if isinstance(args, TrainingArguments) else None
    has_eval = eval_dataset is not None and compute_metrics is not None
    opts = selection_args({**opts, **overrides}, has_eval)
    opts.setdefault("remove_unused_columns", True)
    targs = training_arguments(checkpoint_dir(output_dir), base, **opts)
    pad = DataCollatorWithPadding(tokenizer) if tokenizer is not None else default_data_collator
    trainer = DistillationTrainer(
        model=student,
        args=targs,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if has_eval else None,
        data_collator=DistillationCollator(pad),
        processing_class=tokenizer,
        compute_metrics=trainer_metrics(compute_metrics, main_score) if has_eval else None,
        callbacks=list(callbacks),
        teacher=teacher,
        settings=settings,
        projection=proj,
        teacher_train_mode=teacher_train_mode,
    )
    trainer.train(resume_from_checkpoint=last_checkpoint(output_dir) if resume else None)
    metrics = trainer.evaluate() if has_eval else None
    rows = rows_from_state(trainer.state.log_history)

    def extra(d: Path) -> None:
        write_log(d / LOG_NAME, rows)
        if proj is not None:
            save_projection(proj, d)

    return save_final(output_dir, trainer.model, tokenizer, metrics=metrics, extra=extra)

"""Knowledge distillation on the Hugging Face Trainer: TinyBERT (Jiao et al. 2020, section 3), MiniLM (Wang et al.
2020, section 3), MobileBERT layer-wise transfer (Sun et al. 2020, section 3.5) and DistilBERT pre-training
distillation (Sanh et al. 2019, section 3).

One mechanism serves every recipe: `Distiller` is one `nn.Module` holding the student and its distillation-only
parameters (TinyBERT's hidden projection); its `forward` runs the teacher (eval mode, `torch.no_grad()`; the
official train-mode teacher is an option), captures ONLY the mapped layers of both models (`distillery.capture`),
and returns the weighted sum of the objectives of `distillery.objectives`:

    L = sum_n w_n L_n      TinyBERT intermediate stage: L_attn (eq. 7) + L_hidn (eq. 8) + L_embd (eq. 9)
                           TinyBERT prediction stage:  L_pred (eq. 10), soft CE at temperature t
                           MiniLM: KL of last-layer attention (eq. 6) + value relation (eqs. 7-9)
                           DistilBERT: 5 L_ce + 2 L_mlm + 1 L_cos
                           MobileBERT: L_FMT (eq. 2) + L_AT (eq. 3) of the mapped layers;
                                       L_PD = alpha L_MLM + (1 - alpha) L_KD + L_NSP (eq. 4)

The Trainer sees one model, so its optimiser, gradient clipping (the official TinyBERT code clips the projection
too), checkpoints, resume, best-model loading and DDP all cover the projection with no private-method overrides.
Under `torchrun` the Trainer wraps the `Distiller` in DistributedDataParallel: the student and its projection are
synchronised, the teacher (outside the module tree, no gradients) is a per-rank replica; see
`distillery.training.distributed` (rank 0 writes the export).
Parameter groups with their own learning rates (MobileBERT's progressive transfer) reach the Trainer through its
public `optimizers` argument (`param_groups`).
The exported student is saved alone (`save_pretrained`); the projection goes beside it
(`distill_state.safetensors`). Prediction-layer distillation may read teacher logits from a `teacher_logits`
column (see `distillery.training.logits_cache`) instead of running the teacher.
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
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import ModelOutput

from distillery.capture import capture
from distillery.layer_map import LayerMap, validate_layer_map
from distillery.objectives import (
    HiddenProjection,
    ObjectiveConfigError,
    ObjectiveWeights,
    attention_kl,
    attention_loss,
    attention_transfer_loss,
    cosine_loss,
    embedding_loss,
    feature_map_loss,
    hidden_loss,
    mlm_loss,
    prediction_loss,
    pretraining_distillation_loss,
    regression_prediction_loss,
    relation_kl,
    soft_target_loss,
    value_relation_kl,
)
from distillery.models import num_layers
from distillery.training.args import collator_for, train_arguments
from distillery.training.distill_state import load_projection_into, save_projection
from distillery.training.log import LOG_NAME, quiet_progress, rows_from_state, write_log
from distillery.training.metrics import MetricFn, trainer_metrics
from distillery.training.saving import last_checkpoint, save_final

Stage = Literal["intermediate", "prediction", "both", "pretraining"]

#: Objectives computed from internals of the mapped layers (intermediate stage).
INTERMEDIATE = (
    "attention_loss", "hidden_loss", "embedding_loss", "attention_kl", "value_relation_kl", "relation_kl",
    "attention_transfer_loss", "feature_map_loss",
)
#: Objectives computed from the output logits (prediction stage).
PREDICTION = ("prediction_loss", "regression_prediction_loss")
#: Pre-training distillation on MLM logits (and last hidden states): DistilBERT's three, MobileBERT's eq. 4.
PRETRAINING = ("soft_target_loss", "mlm_loss", "cosine_loss", "pretraining_distillation_loss")
#: Objectives each stage can compute, and the paper default of each (a RECIPES entry). Pre-training also computes
#: MobileBERT's layer-wise terms (its auxiliary knowledge transfer: layer-wise + eq. 4 in one loss).
STAGE_OBJECTIVES: dict[str, tuple[str, ...]] = {
    "intermediate": INTERMEDIATE, "prediction": PREDICTION, "both": INTERMEDIATE + PREDICTION,
    "pretraining": PRETRAINING + ("feature_map_loss", "attention_transfer_loss"),
}
DEFAULT_OBJECTIVES: dict[str, str] = {
    "intermediate": "tinybert-intermediate", "prediction": "tinybert-prediction", "both": "tinybert-task",
    "pretraining": "distilbert",
}
TEACHER_LOGITS = "teacher_logits"
NSP_LABELS = "next_sentence_label"
#: Batch keys the Distiller reads; every other dataset column is dropped by the collator.
BATCH_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", NSP_LABELS, TEACHER_LOGITS)


@dataclass
class DistillSettings:
    """Everything `compute_loss` needs besides the two models.

    temperature / prediction_reduction: eq. 10 (`"paper"`: CE summed over classes; `"official"`: 1/C of it).
    regression_target: STS-B prediction loss against the teacher (default) or gold (official code).
    official_attention_masking: TinyBERT eq. 7 with the official -10000/zeroing semantics (default) or
        the paper's valid-pairs-only MSE. n_relation_heads: MiniLM v2 relation heads for `relation_kl`.
    feature_map_normalized: MobileBERT eq. 2 in the official normalised form. mlm_alpha: eq. 4's alpha.
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
    mlm_alpha: float = 0.5
    active: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.stage not in STAGE_OBJECTIVES:
            raise ValueError(f"stage must be one of {sorted(STAGE_OBJECTIVES)}, got {self.stage!r}")
        allowed = STAGE_OBJECTIVES[self.stage]
        unsupported = [n for n in self.objectives.active() if n not in allowed]
        if unsupported:
            raise ObjectiveConfigError(
                f"objectives {unsupported} are not computed by the {self.stage!r} distillation stage (it computes "
                f"{', '.join(allowed)})"
            )
        self.active = self.objectives.active()
        if not self.active:
            raise ObjectiveConfigError(f"stage {self.stage!r}: no objective has a weight > 0")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def pretraining(self) -> bool:
        return any(n in PRETRAINING for n in self.active)

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


@dataclass
class DistillerOutput(ModelOutput):
    """`loss` (weighted total in training, the student's own gold-label loss in evaluation), `logits` (the
    student's), `terms` (each unweighted objective, training only)."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    terms: dict[str, Tensor] | None = None


class Distiller(nn.Module):
    """The student and its distillation-only parameters as one module; `forward` returns the distillation loss.

    The teacher is held outside the module tree (not saved, not optimised, not moved by `.to`); it runs under
    `torch.no_grad()` in eval mode unless `teacher_train_mode` (the official TinyBERT behaviour: dropout on).
    In eval mode with labels, `forward` is the student's own forward (gold-label loss + logits), so the Trainer's
    evaluation and best-model selection see the student alone.
    """

    def __init__(
        self,
        student: PreTrainedModel,
        teacher: PreTrainedModel | None,
        settings: DistillSettings,
        projection: HiddenProjection | None = None,
        teacher_train_mode: bool = False,
    ) -> None:
        super().__init__()
        self.student = student
        self.projection = projection
        self._teacher = (teacher,)  # a tuple keeps it out of the module tree
        self.settings = settings
        self.teacher_train_mode = teacher_train_mode
        self._student_cap, self._teacher_cap = settings.capture_specs()
        if settings.pretraining and "cosine_loss" in settings.active:
            self._student_cap = {**self._student_cap, "hidden": (num_layers(student),)}
            self._teacher_cap = {**self._teacher_cap, "hidden": (num_layers(teacher),)}
        self._student_keys = _forward_keys(student)
        self._teacher_keys = _forward_keys(teacher) if teacher is not None else frozenset()
        self._keys_to_ignore_on_save = _tied_keys(self)
        if teacher is not None:
            teacher.requires_grad_(False)
            teacher.train(teacher_train_mode)

    @property
    def teacher(self) -> PreTrainedModel | None:
        return self._teacher[0]

    @property
    def config(self):  # the Trainer reads a few config fields of its model
        return self.student.config

    def tie_weights(self) -> None:
        self.student.tie_weights()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Each tied tensor once (safetensors refuses shared memory); loading restores the tie."""
        state = super().state_dict(*args, **kwargs)
        if args or kwargs.get("destination") is not None or kwargs.get("prefix"):
            return state
        return {k: v for k, v in state.items() if k not in self._keys_to_ignore_on_save}

    def teacher_forward(self, inputs: Mapping[str, Tensor]):
        """Teacher outputs and captured internals (no gradients; eval mode unless teacher_train_mode)."""
        if self.teacher is None:
            raise ValueError("this distillation needs a teacher forward, but no teacher was given")
        self.teacher.train(self.teacher_train_mode)
        t_in = {k: v for k, v in inputs.items() if k in self._teacher_keys}
        with torch.no_grad(), capture(self.teacher, **self._teacher_cap) as cap:
            out = self.teacher(**t_in)
        return out, cap

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        teacher_logits: Tensor | None = None,
    ) -> DistillerOutput:
        inputs = {k: v for k, v in (("input_ids", input_ids), ("attention_mask", attention_mask),
                                    ("token_type_ids", token_type_ids)) if v is not None}
        s_in = {k: v for k, v in inputs.items() if k in self._student_keys}
        if not self.training and labels is not None and not self.settings.pretraining:
            out = self.student(**s_in, labels=labels)
            return DistillerOutput(loss=out.loss, logits=out.logits)
        s = self.settings
        need_teacher_logits = s.prediction and teacher_logits is None and not (
            s.regression_target == "gold" and self.student.config.num_labels == 1
        )
        teacher_out, teacher_cap = None, None
        if s.intermediate or s.pretraining or need_teacher_logits:
            teacher_out, teacher_cap = self.teacher_forward(inputs)
        with capture(self.student, **self._student_cap) as student_cap:
            s_out = self.student(**s_in)
        s_logits = _mlm_logits(s_out)
        terms: dict[str, Tensor] = {}
        if s.intermediate:
            terms.update(intermediate_losses(s, student_cap, teacher_cap, attention_mask, self.projection))
        if s.prediction:
            t_logits = teacher_logits if teacher_logits is not None else (
                teacher_out.logits if teacher_out is not None else None)
            terms.update(prediction_losses(s, s_out.logits, t_logits, labels))
        if s.pretraining:
            nsp = (getattr(s_out, "seq_relationship_logits", None), next_sentence_label)
            terms.update(pretraining_losses(s, s_logits, _mlm_logits(teacher_out), labels, attention_mask,
                                            student_cap, teacher_cap, nsp))
        return DistillerOutput(loss=s.objectives.combine(terms), logits=s_logits, terms=terms)


def _mlm_logits(output) -> Tensor | None:
    """The logits of a model output (`prediction_logits` of a `*ForPreTraining` model: its MLM head)."""
    logits = getattr(output, "prediction_logits", None)
    return logits if logits is not None else getattr(output, "logits", None)


def _tied_keys(module: nn.Module) -> list[str]:
    """State-dict keys whose tensor is another key's (tied embeddings / MLM decoder), all but the first."""
    seen: dict[tuple, str] = {}
    tied = []
    for k, v in nn.Module.state_dict(module).items():
        ident = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if ident in seen:
            tied.append(k)
        else:
            seen[ident] = k
    return tied


def pretraining_losses(
    settings: DistillSettings, s_logits: Tensor, t_logits: Tensor, labels: Tensor | None, attention_mask: Tensor | None,
    student_cap, teacher_cap, nsp: tuple[Tensor | None, Tensor | None] = (None, None),
) -> dict[str, Tensor]:
    """DistilBERT's L_ce (soft targets at temperature T over non-pad tokens), L_mlm and L_cos (last hidden states);
    MobileBERT's eq. 4 on the masked positions, + NSP when the student has an NSP head and the batch NSP labels
    (`nsp` = (student NSP logits, labels))."""
    out: dict[str, Tensor] = {}
    if "pretraining_distillation_loss" in settings.active:
        if labels is None:
            raise ValueError("pretraining_distillation_loss needs masked-LM labels (a masking collator)")
        nsp_logits, nsp_labels = nsp if nsp[0] is not None and nsp[1] is not None else (None, None)
        out["pretraining_distillation_loss"] = pretraining_distillation_loss(
            s_logits, t_logits, labels, settings.mlm_alpha, nsp_logits, nsp_labels)
    if "soft_target_loss" in settings.active:
        out["soft_target_loss"] = soft_target_loss(s_logits, t_logits, attention_mask, settings.temperature)
    if "mlm_loss" in settings.active:
        if labels is None:
            raise ValueError("mlm_loss needs masked-LM labels (a masking collator)")
        out["mlm_loss"] = mlm_loss(s_logits, labels)
    if "cosine_loss" in settings.active:
        (s_last,), (t_last,) = student_cap.hidden.values(), teacher_cap.hidden.values()
        out["cosine_loss"] = cosine_loss(s_last, t_last, attention_mask)
    return out


class DistillationTrainer(Trainer):
    """`Trainer` over a `Distiller`; adds only the per-objective loss log (`train_<name>` keys, averaged over the
    logging interval) through the public `compute_loss` and `log`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._term_sums: dict[str, Tensor] = {}
        self._term_count = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if outputs.terms is not None:
            for name, value in outputs.terms.items():
                v = value.detach()
                self._term_sums[name] = self._term_sums.get(name, torch.zeros_like(v)) + v
            self._term_count += 1
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._term_count:
            names = list(self._term_sums)
            means = torch.stack([self._term_sums[n] for n in names]) / self._term_count
            # under DDP each rank saw its share of every batch: the logged term is the mean over ranks, like `loss`
            means = self.accelerator.reduce(means, reduction="mean")
            for name, mean in zip(names, means.tolist()):
                logs[f"train_{name}"] = round(mean, 6)
            self._term_sums, self._term_count = {}, 0
        super().log(logs, start_time)


class DistillationCollator:
    """Keeps the model-input columns (`BATCH_KEYS`), pads token columns with `base`, and stacks a
    `teacher_logits` column separately."""

    def __init__(self, base: Callable[[list[dict]], dict]) -> None:
        self.base = base

    def __call__(self, features: list[dict]) -> dict:
        logits = None
        if features and TEACHER_LOGITS in features[0]:
            logits = torch.tensor([f[TEACHER_LOGITS] for f in features], dtype=torch.float32)
        features = [{k: v for k, v in f.items() if k in BATCH_KEYS and k != TEACHER_LOGITS} for f in features]
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
    feature_map_normalized: bool = False,
    mlm_alpha: float = 0.5,
    projection: HiddenProjection | str | os.PathLike | None = None,
    per_layer_projection: bool = False,
    teacher_train_mode: bool = False,
    compute_metrics: MetricFn | None = None,
    main_score: Callable[[dict], float] | str | None = None,
    tokenizer=None,
    data_collator: Callable[[list[dict]], dict] | None = None,
    args: Mapping[str, Any] | TrainingArguments | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    resume: bool = True,
    param_groups: Sequence[Mapping[str, Any]] | None = None,
    **overrides: Any,
) -> Path:
    """Distil `teacher` into `student`; return `output_dir/model` (student + tokenizer + distill_state + log).

    stage: "intermediate" (TinyBERT step 1 / general distillation: attention + hidden + embedding by default),
    "prediction" (step 2: soft CE on logits; reads a `teacher_logits` column when present, so the teacher may
    be None), "both", or "pretraining" (DistilBERT: soft targets + MLM + cosine on an MLM student and teacher;
    `data_collator` must mask, e.g. `distillery.training.masking.SmoothedMaskingCollator`). `objectives` weights
    select and combine losses (a mapping or a name of `distillery.objectives.RECIPES`). `layer_map` is
    validated against both models before training. `projection`: a directory / file of a saved
    `distill_state.safetensors` to continue from (e.g. the general student's), or a HiddenProjection.
    General distillation = no labels and no eval set. With an eval set and `compute_metrics`, the best
    checkpoint on the main score is exported. `param_groups`: `[{"params": [...], "lr_scale": s}, ...]`, the only
    parameters trained, each group at `s` x the learning rate (AdamW with the arguments' betas, epsilon and weight
    decay, given to the Trainer through its public `optimizers` argument; the scheduler scales every group alike).
    """
    from distillery.models import num_heads

    weights = objectives if isinstance(objectives, ObjectiveWeights) else ObjectiveWeights.from_config(
        objectives if objectives is not None else DEFAULT_OBJECTIVES[stage]
    )
    if layer_map is None:
        layer_map = LayerMap()
    settings = DistillSettings(
        objectives=weights, layer_map=layer_map, stage=stage, temperature=temperature,
        prediction_reduction=prediction_reduction, regression_target=regression_target,
        official_attention_masking=official_attention_masking, n_relation_heads=n_relation_heads,
        feature_map_normalized=feature_map_normalized, mlm_alpha=mlm_alpha,
    )
    if (settings.intermediate or settings.pretraining) and teacher is None:
        raise ValueError(f"stage {stage!r} with objectives {settings.active} needs a teacher")
    if settings.intermediate:
        if not layer_map.hidden and not layer_map.attention:
            raise ValueError("intermediate objectives need a layer_map (distillery.layer_map.build_layer_map)")
        head_wise = any(n in settings.active for n in ("attention_loss", "attention_kl", "attention_transfer_loss",
                                                        "value_relation_kl"))
        validate_layer_map(layer_map, num_layers(student), num_layers(teacher), num_heads(student),
                           num_heads(teacher), head_wise=head_wise)
    proj = None
    if settings.needs_projection:
        proj = make_projection(student, teacher, layer_map, shared=not per_layer_projection, init_from=projection)
    model = Distiller(student, teacher, settings, proj, teacher_train_mode=teacher_train_mode)
    has_eval = eval_dataset is not None and compute_metrics is not None
    # Evaluation labels are `labels` only: `next_sentence_label` is an input of eq. 4, and the Trainer would otherwise
    # take every forward argument named *label* for one (and skip metrics for batches without it).
    targs = train_arguments(output_dir, args, has_eval, **{"label_names": ["labels"], **overrides})
    if teacher is not None:
        teacher.to(targs.device)
    optimizer = scaled_adamw(param_groups, targs) if param_groups is not None else None
    trainer = DistillationTrainer(
        model=model,
        args=targs,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if has_eval else None,
        data_collator=DistillationCollator(data_collator or collator_for(tokenizer)),
        processing_class=tokenizer,
        compute_metrics=trainer_metrics(compute_metrics, main_score) if has_eval else None,
        callbacks=list(callbacks),
        optimizers=(optimizer, None),
    )
    quiet_progress(trainer)
    trainer.train(resume_from_checkpoint=last_checkpoint(output_dir) if resume else None)
    metrics = trainer.evaluate() if has_eval else None
    rows = rows_from_state(trainer.state.log_history)

    def extra(d: Path) -> None:
        write_log(d / LOG_NAME, rows)
        if proj is not None:
            save_projection(proj, d)

    return save_final(output_dir, model.student, tokenizer, metrics=metrics, extra=extra)


def scaled_adamw(param_groups: Sequence[Mapping[str, Any]], args: TrainingArguments) -> torch.optim.AdamW:
    """AdamW over `[{"params": [...], "lr_scale": s}, ...]`: each group at `s` x `args.learning_rate`, weight decay on
    matrices only (not on biases and normalisation vectors, like the Trainer's default), the arguments' betas/eps."""
    groups = []
    for g in param_groups:
        params = [p for p in g["params"] if p.requires_grad]
        lr = args.learning_rate * float(g.get("lr_scale", 1.0))
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if chosen:
                groups.append({"params": chosen, "lr": lr, "weight_decay": args.weight_decay if decay else 0.0})
    if not groups:
        raise ValueError("param_groups: no trainable parameter")
    return torch.optim.AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                             eps=args.adam_epsilon)

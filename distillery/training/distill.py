"""Knowledge distillation on the Hugging Face Trainer: one generic loop for every recipe (TinyBERT, MiniLM,
MobileBERT, DistilBERT).

`Distiller` is one `nn.Module` holding the student and its distillation-only parameters (TinyBERT's hidden
projection). Its `forward` captures, on the mapped layers only (`distillery.capture`), the union of the features the
active loss terms read (`distillery.objectives.registry.capture_specs`), runs the teacher (eval mode,
`torch.no_grad()`; the official train-mode teacher is an option) only when a term needs its features or its logits
and no `teacher_logits` column gives them, builds one `Batch`, and returns

    L = sum_n w_n TERMS[n].compute(batch)

over the active terms of the `DistillSpec` (`distillery.training.spec`). Which terms exist, what they capture and how
they are computed is the registry's business: each paper module registers its equations.

The Trainer sees one model, so its optimiser, gradient clipping (the official TinyBERT code clips the projection
too), checkpoints, resume, best-model loading and DDP all cover the projection with no private-method overrides.
Under `torchrun` the Trainer wraps the `Distiller` in DistributedDataParallel: the student and its projection are
synchronised, the teacher (outside the module tree, no gradients) is a per-rank replica; see
`distillery.training.distributed` (rank 0 writes the export).
Parameter groups with their own learning rates (MobileBERT's progressive transfer) reach the Trainer through its
public `optimizers` argument (`TrainRun.param_groups`).
The exported student is saved alone (`save_pretrained`); the projection goes beside it
(`distill_state.safetensors`). Prediction-layer distillation may read teacher logits from a `teacher_logits`
column (see `distillery.training.logits_cache`) instead of running the teacher.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, Trainer
from transformers.utils import ModelOutput

from distillery.capture import capture
from distillery.precision import fp32, fp32_region
from distillery.layer_map import LayerMap, validate_layer_map
from distillery.models import hidden_size, num_heads, num_layers
from distillery.objectives import HiddenProjection
from distillery.objectives.registry import TERMS, Batch, capture_specs
from distillery.training.args import collator_for
from distillery.training.compiled import compile_step
from distillery.training.distill_state import load_projection_into, save_projection
from distillery.training.spec import DistillSpec, TrainRun
from distillery.training.trainer import train_and_export

TEACHER_LOGITS = "teacher_logits"
NSP_LABELS = "next_sentence_label"
#: Batch keys the Distiller reads; every other dataset column is dropped by the collator.
#: A span task's gold answer (`*ForQuestionAnswering` models): token positions of its first and last token.
SPAN_LABELS = ("start_positions", "end_positions")
BATCH_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", NSP_LABELS, *SPAN_LABELS, TEACHER_LOGITS)

__all__ = ["BATCH_KEYS", "DistillationCollator", "DistillationTrainer", "Distiller", "DistillerOutput", "check_spec",
           "distill", "make_projection"]


def _forward_keys(model: nn.Module) -> frozenset[str]:
    return frozenset(inspect.signature(model.forward).parameters)


@dataclass
class DistillerOutput(ModelOutput):
    """`loss` (weighted total in training, the student's own gold-label loss in evaluation), `logits` (the
    student's), `terms` (each unweighted objective, training only)."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    terms: dict[str, Tensor] | None = None


class Distiller(nn.Module):
    """The student and its distillation-only parameters as one module; `forward` returns the distillation loss of
    `spec` (a `DistillSpec`).

    The teacher is held outside the module tree (not saved, not optimised, not moved by `.to`); it runs under
    `torch.no_grad()` in eval mode unless `spec.teacher_train_mode` (the official TinyBERT behaviour: dropout on).
    In eval mode with labels, outside the "pretraining" stage, `forward` is the student's own forward (gold-label
    loss + logits), so the Trainer's evaluation and best-model selection see the student alone.
    """

    def __init__(
        self,
        student: PreTrainedModel,
        teacher: PreTrainedModel | None,
        spec: DistillSpec,
        projection: HiddenProjection | None = None,
    ) -> None:
        super().__init__()
        self.student = student
        self.projection = projection
        self._teacher = (teacher,)  # a tuple keeps it out of the module tree
        self.spec = spec
        self.active = spec.objectives.active()
        terms = [TERMS[n] for n in self.active]
        self._student_cap, self._teacher_cap = capture_specs(self.active, spec.layer_map)
        self._teacher_features = any(t.features for t in terms)
        self._teacher_logits = any(t.reads_teacher_logits(spec.options, student) for t in terms)
        self._student_keys = _forward_keys(student)
        self._teacher_keys = _forward_keys(teacher) if teacher is not None else frozenset()
        self._keys_to_ignore_on_save = _tied_keys(self)
        if teacher is not None:
            teacher.requires_grad_(False)
            teacher.train(spec.teacher_train_mode)
        self._compiled_objectives: Callable | None = None

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

    @property
    def reads_internals(self) -> bool:
        """Whether a term reads the student's or the teacher's captured internals (hidden states, attention), not
        only their logits (`distillery.training.unpadding.reads_padding`)."""
        return bool(self._student_cap or self._teacher_cap)

    def runs_teacher(self, inputs: Mapping[str, Any]) -> bool:
        """Whether a training batch runs the teacher: a term reads its internals, or its logits and the batch
        carries none (`teacher_logits`)."""
        return self._teacher_features or (self._teacher_logits and inputs.get("teacher_logits") is None)

    def teacher_forward(self, inputs: Mapping[str, Tensor]):
        """Teacher outputs and captured internals (no gradients; eval mode unless teacher_train_mode)."""
        if self.teacher is None:
            raise ValueError("this distillation needs a teacher forward, but no teacher was given")
        self.teacher.train(self.spec.teacher_train_mode)
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
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        teacher_logits: Tensor | None = None,
    ) -> ModelOutput:
        inputs = {k: v for k, v in (("input_ids", input_ids), ("attention_mask", attention_mask),
                                    ("token_type_ids", token_type_ids)) if v is not None}
        s_in = {k: v for k, v in inputs.items() if k in self._student_keys}
        gold = {"labels": labels} if labels is not None else {}
        if start_positions is not None and end_positions is not None:  # a span task: (B, 2) gold positions
            gold = {"start_positions": start_positions, "end_positions": end_positions}
            labels = torch.stack([start_positions, end_positions], dim=1)
        if not self.training and gold and self.spec.level != "pretraining":
            return self.student(**s_in, **gold)  # its own output: the Trainer evaluates the student as it is
        teacher_out, teacher_cap = None, None
        if self.runs_teacher({"teacher_logits": teacher_logits}):
            teacher_out, teacher_cap = self.teacher_forward(inputs)
        with capture(self.student, **self._student_cap) as student_cap:
            s_out = self.student(**s_in)
        loss, logits, terms = (self._compiled_objectives or self.objectives)(
            student_cap, teacher_cap, attention_mask, labels, _logits(s_out),
            teacher_logits if teacher_logits is not None else _logits(teacher_out),
            (getattr(s_out, "seq_relationship_logits", None), next_sentence_label), _span_mask(s_out, attention_mask))
        return DistillerOutput(loss=loss, logits=logits, terms=terms)

    def objectives(self, student_cap, teacher_cap, attention_mask, labels, student_logits, teacher_logits, nsp,
                   logit_mask) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
        """(loss, the student's fp32 logits, each term): the objectives in fp32 (softmax, KL, MSE, cosine, their
        reductions) on fp32 copies of what bf16 autocast captured (distillery.precision); TinyBERT's projection, a
        linear layer, in the forward's precision (`in_forward_precision`).
        Compiled (`compile_objectives`), the casts fuse into the reductions and no fp32 copy is materialised."""
        nsp_logits, nsp_labels = nsp  # MobileBERT's next-sentence logits and labels, or Nones
        projection = in_forward_precision(self.projection)
        with fp32_region(next(self.student.parameters()).device):
            batch = Batch(
                student=student_cap.float(), teacher=teacher_cap.float() if teacher_cap is not None else None,
                layer_map=self.spec.layer_map, options=self.spec.options,
                attention_mask=attention_mask, labels=labels, student_logits=fp32(student_logits),
                teacher_logits=fp32(teacher_logits), nsp_logits=fp32(nsp_logits), nsp_labels=nsp_labels,
                projection=projection, logit_mask=logit_mask,
            )
            terms = {name: TERMS[name].compute(batch) for name in self.active}
            return self.spec.objectives.combine(terms), batch.student_logits, terms

    def compile_objectives(self) -> None:
        """Compile `objectives` (`torch.compile`; its backward too): one fused kernel where eager runs a cast, a
        difference, a square and a reduction over each captured tensor."""
        if self._compiled_objectives is None:
            self._compiled_objectives = torch.compile(self.objectives)


def in_forward_precision(projection: HiddenProjection | None) -> Callable[[Tensor, int], Tensor] | None:
    """`projection` (TinyBERT's W_h and W_e: a linear layer, not a reduction) as the step's other linear layers run:
    under bf16 autocast a bf16 matmul, whose output the objectives read in float32; the projection itself otherwise."""
    if projection is None:
        return None
    device = next(projection.parameters()).device.type
    if not torch.is_autocast_enabled(device):
        return projection
    dtype = torch.get_autocast_dtype(device)

    def run(x: Tensor, index: int = 0) -> Tensor:
        with torch.autocast(device, dtype=dtype):
            return projection(x, index).float()

    return run


def _logits(output) -> Tensor | None:
    """The logits of a model output: `prediction_logits` of a `*ForPreTraining` model (its MLM head); a
    `*ForQuestionAnswering` model's start and end logits stacked, (B, 2, tokens), so that a term on the last axis
    (TinyBERT eq. 10, DistilBERT's L_ce) is the mean of its value on the start and on the end distribution; None for
    no output."""
    if output is None:
        return None
    logits = getattr(output, "prediction_logits", None)
    if logits is None and getattr(output, "start_logits", None) is not None:
        logits = torch.stack([output.start_logits, output.end_logits], dim=1)
    return logits if logits is not None else getattr(output, "logits", None)


def _span_mask(output, attention_mask: Tensor | None) -> Tensor | None:
    """(B, 1, tokens) real tokens of a `*ForQuestionAnswering` output (its stacked span logits' positions), so that
    padding is out of every softmax over positions; None for other outputs or no mask."""
    if attention_mask is None or getattr(output, "start_logits", None) is None:
        return None
    return (attention_mask != 0)[:, None, :]


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


class DistillationTrainer(Trainer):
    """`Trainer` over a `Distiller`; adds only the per-objective loss log (`train_<name>` keys, averaged over the
    logging interval) through the public `compute_loss` and `log`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._term_sums: dict[str, Tensor] = {}
        self._term_count = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if getattr(outputs, "terms", None) is not None:  # training; in evaluation the student's own output
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
    d_t = hidden_size(teacher) if teacher is not None else None
    proj = HiddenProjection(hidden_size(student), d_t, n_states=max(1, len(layer_map.hidden)), shared=shared)
    if init_from is not None:
        load_projection_into(proj, init_from)
    return proj


def check_spec(teacher: PreTrainedModel | None, student: PreTrainedModel, spec: DistillSpec, train_dataset: Any) -> None:
    """What can be checked before training: a teacher (or a `teacher_logits` column) for the terms that read it, a
    layer map that fits both models for the terms that read mapped layers."""
    terms = [TERMS[n] for n in spec.active]
    mapped = [t.name for t in terms if t.features]
    logits = [t.name for t in terms if t.reads_teacher_logits(spec.options, student)]
    if teacher is None:
        if mapped:
            raise ValueError(f"level {spec.level!r} with objectives {list(spec.active)} needs a teacher")
        columns = getattr(train_dataset, "column_names", None) or ()
        if logits and TEACHER_LOGITS not in columns:
            raise ValueError(f"objectives {logits} read the teacher's logits: give a teacher or a {TEACHER_LOGITS!r} "
                             "column (distillery.training.logits_cache)")
    if mapped:
        lm = spec.layer_map
        if not lm.hidden and not lm.attention:
            raise ValueError(f"objectives {mapped} read mapped layers: they need a layer_map "
                             "(distillery.layer_map.build_layer_map)")
        validate_layer_map(lm, num_layers(student), num_layers(teacher), num_heads(student), num_heads(teacher),
                           head_wise=any(t.head_wise for t in terms))


#: The loop's own TrainingArguments options, under the run's: evaluation labels are `labels` only
#: (`next_sentence_label` is an input of eq. 4, and the Trainer would otherwise take every forward argument named
#: *label* for one, and skip metrics for batches without it).
OPTIONS: dict[str, Any] = {"label_names": ["labels"]}


def distill(teacher: PreTrainedModel | None, student: PreTrainedModel, spec: DistillSpec, run: TrainRun) -> Path:
    """Distil `teacher` into `student` with the loss of `spec`; return `run.output_dir/model` (student + tokenizer +
    distill_state + log).

    General distillation = no labels and no eval set. With `run.eval_dataset` and `run.compute_metrics`, the best
    checkpoint on the main score is exported. The teacher may be None when every active term reads only the teacher's
    logits and the training set has a `teacher_logits` column. A term that needs TinyBERT's projection gets one
    (continued from `spec.projection` when given; one per mapped state with `spec.per_layer_projection`).
    "pretraining" needs a masking `run.data_collator` (e.g. `distillery.training.masking.SmoothedMaskingCollator`).
    """
    check_spec(teacher, student, spec, run.train_dataset)
    proj = None
    if any(TERMS[n].projection for n in spec.active):
        proj = make_projection(student, teacher, spec.layer_map, shared=not spec.per_layer_projection,
                               init_from=spec.projection)
    model = Distiller(student, teacher, spec, proj)
    has_eval = run.eval_dataset is not None and run.compute_metrics is not None
    targs = run.training_arguments(OPTIONS, select=has_eval)
    if teacher is not None:
        teacher.to(targs.device)
    compile_step(model, device=targs.device, evaluates=has_eval)
    collator = DistillationCollator(run.data_collator or collator_for(run.tokenizer))
    return train_and_export(DistillationTrainer, model, run, targs, data_collator=collator, evaluate=has_eval,
                            export=student, extra=(lambda d: save_projection(proj, d)) if proj is not None else None)

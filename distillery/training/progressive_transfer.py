"""MobileBERT's layer-wise knowledge transfer from the IB-BERT teacher (Sun et al., 2020, Sec. 3.5-3.6, Figure 2).

The student has the teacher's depth, inter-block width and heads, so layer l's feature map (its block output,
eq. 2) and its per-head attention distributions (eq. 3) are fitted to the teacher's layer l directly: no
projection exists anywhere. Before transfer the student's embedding and classifier (the MLM head) are copied from
the teacher (:func:`student_from_teacher`); they get no transfer loss of their own.

* :func:`progressive_transfer` (PKT): L stages; stage l minimises L_KT of layer l only. Layer l trains at the full
  learning rate, the layers below it and the embedding at ``lower_layer_lr_scale`` x (the paper's "small learning
  rate"; 0 freezes them, Figure 2 (c)), everything above is untouched. Each stage is one run of the pipeline's
  single training mechanism (``distillery.training.distill``: the Distiller on the Trainer), its learning rates
  handed to the Trainer as optimizer parameter groups; a finished stage is kept on disk, so an interrupted
  transfer resumes at the layer it reached.
* :func:`joint_transfer` (JKT): every layer's L_KT at once, all parameters at the full rate.

Both are followed by pre-training distillation (``distillery.training.pretraining_distillation``); auxiliary
knowledge transfer (AKT) is that stage with the layer-wise terms added to eq. 4.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping

from torch import nn
from transformers import PreTrainedModel

from distillery.layer_map import LayerMap
from distillery.models import build_student, num_layers
from distillery.training.distill import distill
from distillery.training.spec import DistillSpec, TrainRun
from distillery.training.distributed import is_main
from distillery.training.log import LOG_NAME, read_log, write_log
from distillery.training.saving import model_dir, save_final

__all__ = [
    "layer_wise_map", "layer_pairs", "student_from_teacher", "copy_embedding_and_classifier",
    "progressive_param_groups", "progressive_transfer", "joint_transfer",
]


def layer_wise_map(layers: Iterable[int]) -> LayerMap:
    """Student layer l (1-based) <- teacher layer l: block output l (eq. 2) and attention of layer l (eq. 3)."""
    layers = tuple(layers)
    return LayerMap(hidden=tuple((l, l) for l in layers), attention=tuple((l - 1, l - 1) for l in layers))


def copy_embedding_and_classifier(teacher: PreTrainedModel, student: PreTrainedModel) -> list[str]:
    """Copy the teacher's embedding module and MLM head into the student (Figure 2: "copied from the IB-BERT
    teacher"); return the names copied. The embedding normalisation is copied only when both use the same kind
    (a LayerNorm's parameters mean something else in a NoNorm student, which keeps its own)."""
    copied = []
    t_emb, s_emb = teacher.base_model.embeddings, student.base_model.embeddings
    same_norm = getattr(teacher.config, "normalization_type", None) == getattr(student.config, "normalization_type", None)
    s_state = s_emb.state_dict()
    for name, value in t_emb.state_dict().items():
        if name.startswith("LayerNorm.") and not same_norm or name not in s_state:
            continue
        if s_state[name].shape != value.shape:
            raise ValueError(f"copy_embedding_and_classifier: embeddings.{name} has shape {tuple(value.shape)} in the "
                             f"teacher, {tuple(s_state[name].shape)} in the student")
        s_state[name].copy_(value)
        copied.append(f"embeddings.{name}")
    t_head = getattr(getattr(teacher, "cls", None), "predictions", None)
    s_head = getattr(getattr(student, "cls", None), "predictions", None)
    if t_head is not None and s_head is not None:
        s_head.load_state_dict(t_head.state_dict())
        copied += [f"cls.predictions.{k}" for k in t_head.state_dict()]
    student.tie_weights()
    return copied


def student_from_teacher(shape, teacher: PreTrainedModel, *, head: str = "pretraining") -> PreTrainedModel:
    """The MobileBERT student before transfer: random layers of `shape`, embedding and MLM head from `teacher`."""
    student = build_student(shape, teacher.config.vocab_size, head=head, base=teacher.config)
    copy_embedding_and_classifier(teacher, student)
    return student


def _below_and_layer(student: PreTrainedModel, layer: int) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    base = student.base_model
    below = list(base.embeddings.parameters())
    for lower in base.encoder.layer[: layer - 1]:
        below += list(lower.parameters())
    return below, list(base.encoder.layer[layer - 1].parameters())


def progressive_param_groups(student: PreTrainedModel, layer: int, lower_layer_lr_scale: float = 0.1) -> list[dict]:
    """Optimizer groups of progressive stage `layer` (1-based): the layer at lr scale 1, the embedding and the layers
    below at `lower_layer_lr_scale`. Every other parameter, and with scale 0 the lower ones too, stops requiring
    gradients (`student.requires_grad_(True)` restores them)."""
    if not 1 <= layer <= num_layers(student):
        raise ValueError(f"progressive stage {layer} of a {num_layers(student)}-layer student")
    below, current = _below_and_layer(student, layer)
    student.requires_grad_(False)
    for p in current:
        p.requires_grad_(True)
    groups = [{"params": current, "lr_scale": 1.0}]
    if lower_layer_lr_scale > 0 and below:
        for p in below:
            p.requires_grad_(True)
        groups.append({"params": below, "lr_scale": float(lower_layer_lr_scale)})
    return groups


def _epochs(args: Mapping[str, Any], epochs: float | None) -> float:
    if epochs is not None:
        return float(epochs)
    return float(args.get("num_train_epochs", 3.0))


def _transfer_map(spec: DistillSpec, student: PreTrainedModel) -> LayerMap:
    """The spec's layer map, or MobileBERT's layer-wise map of every layer when it has none."""
    lm = spec.layer_map
    return lm if lm.hidden or lm.attention else layer_wise_map(range(1, num_layers(student) + 1))


def layer_pairs(layer_map: LayerMap, layer: int) -> LayerMap:
    """The pairs of `layer_map` that train student layer `layer` (1-based): its block output (hidden state `layer`)
    and its attention (0-based layer `layer - 1`)."""
    return LayerMap(hidden=tuple(p for p in layer_map.hidden if p[0] == layer),
                    attention=tuple(p for p in layer_map.attention if p[0] == layer - 1))


def progressive_transfer(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    spec: DistillSpec,
    run: TrainRun,
    *,
    lower_layer_lr_scale: float = 0.1,
    epochs: float | None = None,
) -> Path:
    """Progressive knowledge transfer; return `run.output_dir/model` (the student, heads included, and its log).

    `spec`: the layer-wise objectives (e.g. `feature_map_loss` + `attention_transfer_loss`) and options; stage l
    distils the pairs of `spec.layer_map` (default: layer l <- layer l for every layer) that belong to student layer
    l. `epochs` is the total over the L stages (each gets `epochs / L`, as the official ``steps_per_phase``);
    None takes `run.args["num_train_epochs"]`."""
    output_dir = run.output_dir
    n = num_layers(student)
    per_stage = _epochs(run.args, epochs) / n
    full = _transfer_map(spec, student)
    rows: list[dict[str, Any]] = []
    for layer in range(1, n + 1):
        stage_dir = output_dir / "layers" / f"layer-{layer}"
        done = model_dir(stage_dir)
        if not (done / "config.json").is_file():
            groups = progressive_param_groups(student, layer, lower_layer_lr_scale)
            try:
                distill(teacher, student, spec.with_(layer_map=layer_pairs(full, layer)),
                        run.with_(output_dir=stage_dir, param_groups=groups, args={"num_train_epochs": per_stage}))
            finally:
                student.requires_grad_(True)
        else:  # finished before an interruption: continue from its saved student
            student = type(student).from_pretrained(str(done))
        offset = rows[-1]["step"] if rows else 0
        rows += [{**r, "step": int(r["step"]) + offset, "layer": layer} for r in read_log(done / LOG_NAME)]
        if is_main():  # under a launcher: rank 0 wrote the stage (the others waited for it in `distill`)
            shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)
    final = save_final(output_dir, student, run.tokenizer, extra=lambda d: write_log(d / LOG_NAME, rows))
    if is_main():
        shutil.rmtree(output_dir / "layers", ignore_errors=True)
    return final


def joint_transfer(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    spec: DistillSpec,
    run: TrainRun,
    *,
    epochs: float | None = None,
) -> Path:
    """Joint knowledge transfer: every pair of `spec.layer_map` (default: every layer's) at once, `epochs` in total
    (None: `run.args["num_train_epochs"]`)."""
    return distill(teacher, student, spec.with_(layer_map=_transfer_map(spec, student)),
                   run.with_(args={"num_train_epochs": _epochs(run.args, epochs)}))

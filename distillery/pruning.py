"""Width from the teacher: a narrower student initialised by structured pruning of the teacher (Muralidharan et al.,
2024, "Compact Language Models via Pruning and Knowledge Distillation" (Minitron), Sec. 2.2, activation-based
importance; the structured-pruning-then-distil recipe of CoFi, Xia et al., 2022).

The student keeps `layers` of the teacher (as DistilBERT's initialisation) and, in them, the most important
attention heads, FFN neurons and hidden channels, ranked on a sample of real inputs (the task's training set or the
corpus) by the teacher's own activations:

* a head: the L2 norm of its context vector (its slice of the attention output before the output projection),
  averaged over the real tokens of the sample (Minitron: the head's output norm);
* an FFN neuron: the mean absolute value of its activation (after the non-linearity) over the real tokens;
* a hidden channel: the mean absolute value of the LayerNorm outputs in that channel (the embedding output and every
  layer's two LayerNorms), over the real tokens and those LayerNorms (Minitron ranks embedding channels by the
  LayerNorm activations; it aggregates a batch by mean and a sequence by L2 norm, we average both).

The kept slices are copied in the teacher's order into a model of the student's shape: every matrix that reads or
writes the hidden state keeps the kept channels, Q/K/V keep the kept heads' rows and the output projection their
columns, the FFN its kept neurons. The head size stays the teacher's (student hidden / heads = teacher hidden /
heads). A LayerNorm over fewer channels normalises over those: the pruned student is a start, distillation recovers
what pruning cost. BERT-type encoders (``model_type`` bert) with any head (sequence classification, question
answering, MLM, base).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from distillery.errors import UserError

__all__ = ["Importance", "PruningError", "measure_importance", "prune_teacher", "run_sample"]


class PruningError(UserError, ValueError):
    """A student shape that cannot be cut from the teacher, or a teacher this module cannot prune."""


@dataclass
class Importance:
    """Per kept teacher layer: head scores (heads,) and neuron scores (intermediate,); hidden channel scores (d,)."""

    heads: dict[int, Tensor]
    neurons: dict[int, Tensor]
    channels: Tensor


def _layers(model) -> Any:
    base = model.base_model
    if getattr(model.config, "model_type", None) != "bert" or not hasattr(base, "encoder"):
        raise PruningError(f"structured pruning needs a BERT-type teacher, got {model.config.model_type!r}")
    return base


@torch.no_grad()
def measure_importance(teacher, batches: Iterable[Mapping[str, Tensor]], layers: Sequence[int]) -> Importance:
    """Activation-based importance of the heads, neurons and hidden channels of `teacher` on `batches` (dicts of
    input_ids / attention_mask / token_type_ids), for its `layers`."""
    base = _layers(teacher)
    cfg = teacher.config
    h, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    heads = {i: torch.zeros(h, dtype=torch.float64) for i in layers}
    neurons = {i: torch.zeros(cfg.intermediate_size, dtype=torch.float64) for i in layers}
    channels = torch.zeros(cfg.hidden_size, dtype=torch.float64)

    def attach(real: Callable[[Tensor], Tensor]) -> list:
        def on_channels(_m, _inp, out):
            channels.add_(real(out).abs().sum(0))

        norms = [base.embeddings.LayerNorm]
        hooks = []
        for i, layer in enumerate(base.encoder.layer):
            norms += [layer.attention.output.LayerNorm, layer.output.LayerNorm]
            if i in heads:
                def on_context(_m, inp, i=i):
                    heads[i].add_(real(inp[0]).reshape(-1, h, dh).norm(dim=-1).sum(0))

                def on_neurons(_m, _inp, out, i=i):
                    neurons[i].add_(real(out).abs().sum(0))

                hooks.append(layer.attention.output.dense.register_forward_pre_hook(on_context))
                hooks.append(layer.intermediate.register_forward_hook(on_neurons))
        return hooks + [norm.register_forward_hook(on_channels) for norm in norms]

    n = run_sample(teacher, base, batches, attach, what="structured pruning")
    norms = 1 + 2 * len(base.encoder.layer)  # the LayerNorms every forward passes: embedding + two per layer
    return Importance({i: v / n for i, v in heads.items()}, {i: v / n for i, v in neurons.items()},
                      channels / (n * norms))


def run_sample(model, base, batches: Iterable[Mapping[str, Tensor]],
               attach: Callable[[Callable[[Tensor], Tensor]], list], *, what: str) -> float:
    """Runs `base` (the encoder of `model`) in eval mode over `batches` with the forward hooks `attach(real)` returns
    (``real(x)``: the rows of real tokens of the current batch, (B, T, D) -> (N, D) in float64), removes them and
    restores the training mode; the number of real tokens seen (none is an error naming `what`)."""
    state: dict[str, Any] = {"tokens": 0.0}

    def real(x: Tensor) -> Tensor:
        return x.reshape(-1, x.shape[-1])[state["mask"].reshape(-1)].double()

    hooks = attach(real)
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            mask = batch.get("attention_mask")
            state["mask"] = (torch.ones_like(batch["input_ids"]) if mask is None else mask).bool()
            state["tokens"] += float(state["mask"].sum())
            base(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    if state["tokens"] == 0:
        raise PruningError(f"{what}: no input tokens to measure importance on")
    return state["tokens"]


def _top(scores: Tensor, k: int) -> Tensor:
    """The indices of the `k` largest scores, in increasing index order (the teacher's order is kept)."""
    return torch.sort(torch.topk(scores, k).indices).values


def prune_teacher(teacher, layers: Sequence[int], *, hidden: int, heads: int, intermediate: int,
                  importance: Importance, head: str | None = None):
    """A student of `len(layers)` layers, `hidden` channels, `heads` heads and `intermediate` FFN neurons whose
    weights are the teacher's most important slices. `head` ("base", "sequence-classification", ... as
    `distillery.models.load_model`): the student's head, None for the teacher's; a head the teacher lacks starts as
    initialised. The student carries ``kept_channels`` (the teacher's hidden channels it keeps, in order; not saved)
    for a distillation projection to start as their selection (``HiddenProjection.selecting``)."""
    cfg = teacher.config
    d, h, f = cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size
    dh = d // h
    if hidden * h != heads * d:
        raise PruningError(f"structured pruning keeps the head size {dh}: hidden {hidden} / heads {heads} must be {dh}")
    if not (0 < hidden <= d and 0 < heads <= h and 0 < intermediate <= f):
        raise PruningError(f"structured pruning cuts widths down: hidden {hidden} <= {d}, heads {heads} <= {h}, "
                           f"intermediate {intermediate} <= {f}")
    layers = list(layers)
    if not layers or len(set(layers)) != len(layers) or not all(0 <= i < cfg.num_hidden_layers for i in layers):
        raise PruningError(f"structured pruning: teacher layers {layers} are not distinct layers of a "
                           f"{cfg.num_hidden_layers}-layer teacher")
    ch = _top(importance.channels, hidden)
    kept_heads = {s: _top(importance.heads[t], heads) for s, t in enumerate(layers)}
    kept_dims = {s: (kept_heads[s][:, None] * dh + torch.arange(dh)).reshape(-1) for s in kept_heads}
    kept_neurons = {s: _top(importance.neurons[t], intermediate) for s, t in enumerate(layers)}

    student_cfg = copy.deepcopy(cfg)
    student_cfg.update({"num_hidden_layers": len(layers), "hidden_size": hidden, "num_attention_heads": heads,
                        "intermediate_size": intermediate})
    if head is None:
        student = type(teacher)(student_cfg)
    else:
        from distillery.models import _auto_class

        student = _auto_class(head).from_config(student_cfg)
    student.to(next(teacher.parameters()).dtype)
    source = teacher.state_dict()
    target = student.state_dict()
    prefix_t = teacher.base_model_prefix + "."
    out = {}
    for key, value in target.items():
        teacher_key = _teacher_key(key, layers, prefix_t, source)
        if teacher_key is None:
            out[key] = value  # a head the teacher lacks: as initialised
            continue
        w = source[teacher_key]
        sliced = _slice(key, w, ch, kept_dims, kept_neurons)
        if sliced.shape != value.shape:
            raise PruningError(f"structured pruning: {key} is {tuple(sliced.shape)} after slicing, the student "
                               f"needs {tuple(value.shape)}")
        out[key] = sliced.clone()
    student.load_state_dict(out)
    student.kept_channels = ch
    return student.train(teacher.training)


LAYER = re.compile(r"encoder\.layer\.(\d+)\.")


def _teacher_key(key: str, layers: list[int], prefix: str, source: Mapping[str, Tensor]) -> str | None:
    """The teacher's key of a student weight (the student's layer s is the teacher's layers[s])."""
    mapped = LAYER.sub(lambda m: f"encoder.layer.{layers[int(m.group(1))]}.", key)
    for candidate in (mapped, prefix + mapped, mapped.removeprefix(prefix)):
        if candidate in source:
            return candidate
    return None


def _slice(key: str, w: Tensor, ch: Tensor, dims: Mapping[int, Tensor], neurons: Mapping[int, Tensor]) -> Tensor:
    m = LAYER.search(key)
    s = int(m.group(1)) if m else None
    if s is not None and re.search(r"attention\.self\.(query|key|value)\.weight$", key):
        return w[dims[s]][:, ch]
    if s is not None and re.search(r"attention\.self\.(query|key|value)\.bias$", key):
        return w[dims[s]]
    if s is not None and key.endswith("attention.output.dense.weight"):
        return w[ch][:, dims[s]]
    if s is not None and key.endswith("intermediate.dense.weight"):
        return w[neurons[s]][:, ch]
    if s is not None and key.endswith("intermediate.dense.bias"):
        return w[neurons[s]]
    if s is not None and key.endswith("output.dense.weight"):  # the FFN's output projection
        return w[ch][:, neurons[s]]
    if re.search(r"(pooler|transform)\.dense\.weight$", key):
        return w[ch][:, ch]
    if re.search(r"(LayerNorm\.(weight|bias)|dense\.bias)$", key):
        return w[ch]
    if re.search(r"(_embeddings|classifier|qa_outputs|decoder)\.weight$", key):
        return w[:, ch]
    return w  # a classifier's or decoder's bias, position ids: not over the hidden channels


def sample_batches(data, tokenizer, samples: int):
    """Padded batches of model inputs from the first `samples` rows of `data` (the importance sample)."""
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    keep = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in data.column_names]
    sample = data.select(range(min(samples, len(data)))).select_columns(keep)
    return DataLoader(sample, batch_size=32, collate_fn=DataCollatorWithPadding(tokenizer))

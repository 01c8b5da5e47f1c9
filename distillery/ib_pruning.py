"""A MobileBERT student cut from its IB teacher: the bottleneck student starts from the teacher's weights, not at
random (the structured pruning of `distillery.pruning`, Minitron's activation importance, applied inside the blocks).

MobileBERT's student and IB teacher share the inter-block width, depth, heads and embedding; they differ inside the
blocks (intra-block width, head size, FFN). A student of the teacher's inter-block width keeps, from each teacher
block, ranked on a sample of real inputs by the teacher's own activations:

* intra-block channels: one set for every block (the mean absolute LayerNorm outputs of the input bottleneck, the
  attention and the FFN, over the real tokens and the blocks), so that what one block writes is what the next reads
  when the IB teacher is a converted BERT (`distillery.ib_teacher.convert_bert`, whose blocks chain BERT's hidden
  state through identity bottlenecks): the student then computes the BERT teacher pruned to that hidden size;
* in every head, the query/key dimensions with the largest mean |q_j| x mean |k_j| (their share of the attention
  scores) and the value dimensions with the largest mean |context_j|; the heads stay (eq. 3 compares them one to one),
  the head size shrinks, and the queries are scaled by sqrt(student head size / teacher head size) so that the kept
  dimensions' dot products keep the scores' scale;
* FFN neurons: the largest mean |activation|.

Every other weight (embedding, MLM head, the output bottleneck's LayerNorm) is the teacher's. The layer-wise transfer
and pre-training distillation then recover what the cut cost. Needs a teacher and student with bottlenecks, attention
reading the bottleneck (``use_bottleneck_attention``, as a converted teacher has), one FFN per block, and the same
normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch
from torch import Tensor

from distillery.pruning import PruningError, _top, run_sample

__all__ = ["BlockImportance", "measure_block_importance", "prune_ib_teacher"]

#: Config attributes a pruned student must share with its IB teacher.
SHARED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "embedding_size", "trigram_input",
          "normalization_type", "hidden_act", "use_bottleneck", "use_bottleneck_attention", "key_query_shared_bottleneck")


@dataclass
class BlockImportance:
    """Intra-block channel scores (intra,); per block: query/key and value dimension scores (heads, head size) and
    FFN neuron scores (intermediate,)."""

    channels: Tensor
    qk: dict[int, Tensor]
    v: dict[int, Tensor]
    neurons: dict[int, Tensor]


def _check_teacher(ib) -> None:
    cfg = ib.config
    if getattr(cfg, "model_type", None) != "mobilebert" or not cfg.use_bottleneck:
        raise PruningError(f"cutting a MobileBERT student needs a MobileBERT IB teacher with bottlenecks, got "
                           f"{getattr(cfg, 'model_type', None)!r}")
    if not cfg.use_bottleneck_attention or cfg.num_feedforward_networks != 1:
        raise PruningError("cutting a MobileBERT student needs an IB teacher whose attention reads the bottleneck "
                           "(use_bottleneck_attention) with one FFN per block, as `convert_bert` makes")


@torch.no_grad()
def measure_block_importance(ib, batches: Iterable[Mapping[str, Tensor]]) -> BlockImportance:
    """Activation importance of the IB teacher's intra-block channels, head dimensions and FFN neurons on `batches`
    (dicts of input_ids / attention_mask / token_type_ids)."""
    _check_teacher(ib)
    cfg, base = ib.config, ib.base_model
    n_layers, h = cfg.num_hidden_layers, cfg.num_attention_heads
    d = cfg.intra_bottleneck_size
    dh = d // h
    zeros = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
    channels = zeros(d)
    q, k, v = ({i: zeros(h, dh) for i in range(n_layers)} for _ in range(3))
    neurons = {i: zeros(cfg.intermediate_size) for i in range(n_layers)}

    def attach(real: Callable[[Tensor], Tensor]) -> list:
        def add(target: Tensor, per_head: bool = False):
            def hook(_m, args, out=None):
                x = real(out if out is not None else args[0]).abs().sum(0)
                target.add_(x.reshape(h, dh) if per_head else x)
            return hook

        hooks = []
        for i, layer in enumerate(base.encoder.layer):
            for norm in (layer.bottleneck.input.LayerNorm, layer.attention.output.LayerNorm, layer.output.LayerNorm):
                hooks.append(norm.register_forward_hook(add(channels)))
            hooks.append(layer.attention.self.query.register_forward_hook(add(q[i], True)))
            hooks.append(layer.attention.self.key.register_forward_hook(add(k[i], True)))
            hooks.append(layer.attention.output.dense.register_forward_pre_hook(add(v[i], True)))
            hooks.append(layer.intermediate.register_forward_hook(add(neurons[i])))
        return hooks

    n = run_sample(ib, base, batches, attach, what="cutting a MobileBERT student")
    return BlockImportance(channels / (3 * n_layers * n), {i: q[i] * k[i] / n**2 for i in q},
                           {i: v[i] / n for i in v}, {i: neurons[i] / n for i in neurons})


def _per_head(scores: Tensor, keep: int) -> Tensor:
    """Flat indices (into heads x head size) of the `keep` best dimensions of every head, in the teacher's order."""
    dh = scores.shape[1]
    return torch.cat([head * dh + _top(row, keep) for head, row in enumerate(scores)])


def prune_ib_teacher(ib, student, importance: BlockImportance):
    """`student` (a MobileBERT model of its shape, any head) with its weights cut from the IB teacher `ib`; returns
    it. Weights whose shape the cut does not change are copied; a head the teacher lacks stays as initialised."""
    _check_teacher(ib)
    tc, sc = ib.config, student.config
    differ = [f"{a} {getattr(sc, a, None)} != {getattr(tc, a, None)}" for a in SHARED
              if getattr(sc, a, None) != getattr(tc, a, None)]
    if sc.num_feedforward_networks != 1:
        differ.append(f"num_feedforward_networks {sc.num_feedforward_networks} != 1")
    if differ:
        raise PruningError("a MobileBERT student cut from its IB teacher shares its inter-block shape and attention "
                           "layout: " + "; ".join(differ))
    h = tc.num_attention_heads
    d_t, d_s = tc.intra_bottleneck_size, sc.intra_bottleneck_size
    if d_s % h or not (0 < d_s <= d_t) or not (0 < sc.intermediate_size <= tc.intermediate_size):
        raise PruningError(f"cutting cuts widths down: intra-block {d_s} <= {d_t} (a multiple of the {h} heads), "
                           f"intermediate {sc.intermediate_size} <= {tc.intermediate_size}")
    ch = _top(importance.channels, d_s)
    qk = {i: _per_head(s, d_s // h) for i, s in importance.qk.items()}
    v = {i: _per_head(s, d_s // h) for i, s in importance.v.items()}
    neurons = {i: _top(s, sc.intermediate_size) for i, s in importance.neurons.items()}
    scale = ((d_s // h) / (d_t // h)) ** 0.5
    source = ib.state_dict()
    prefix = student.base_model_prefix + "."
    out = {}
    for key, value in student.state_dict().items():
        if key not in source or not key.startswith(prefix):  # a head (or pooler): the teacher's if it has the same
            out[key] = source[key].clone() if key in source and source[key].shape == value.shape else value
            continue
        cut = _cut(key.removeprefix(prefix), source[key], ch, qk, v, neurons, scale)
        if cut.shape != value.shape:
            raise PruningError(f"cutting a MobileBERT student: {key} is {tuple(cut.shape)} after the cut, the student "
                               f"needs {tuple(value.shape)}")
        out[key] = cut.clone()
    student.load_state_dict(out)
    return student


def _cut(key: str, w: Tensor, ch: Tensor, qk: Mapping[int, Tensor], v: Mapping[int, Tensor],
         neurons: Mapping[int, Tensor], scale: float) -> Tensor:
    if not key.startswith("encoder.layer."):
        return w  # embeddings, pooler: the inter-block width
    i = int(key.split(".")[2])
    rest = key.split(".", 3)[3]
    weight = rest.endswith(".weight")
    if rest.startswith(("bottleneck.input.", "attention.output.LayerNorm", "output.LayerNorm")):
        return w[ch]
    if rest.startswith("attention.self."):
        rows = v[i] if ".value." in rest else qk[i]
        cut = w[rows][:, ch] if weight else w[rows]
        return cut * scale if ".query." in rest else cut
    if rest.startswith("attention.output.dense"):
        return w[ch][:, v[i]] if weight else w[ch]
    if rest.startswith("intermediate.dense"):
        return w[neurons[i]][:, ch] if weight else w[neurons[i]]
    if rest.startswith("output.dense"):
        return w[ch][:, neurons[i]] if weight else w[ch]
    if rest.startswith("output.bottleneck.dense"):
        return w[:, ch] if weight else w
    return w  # the output bottleneck's LayerNorm, the shared attention bottleneck if any: inter-block

"""Unpadded batches: an encoder's layers run on a batch's real tokens alone, on a CPU.

A task's batches are padded to their longest sentence, and GLUE sentences are far shorter than most of a batch's
longest: 50-70% of the positions of the local preset's batches are padding. Every position-wise part of a layer (the
query, key, value and output projections, the feed-forward network, LayerNorm, dropout, the residual adds) does as
much work on a padded position as on a real one. Here, as in MosaicBERT and ModernBERT, the encoder reads the real
tokens alone, as one (1, R, D) sequence: a forward pre-hook on the encoder gathers them from the embeddings' (B, T, D)
output (N real tokens, then copies of the first up to a multiple of `ROWS`, whose outputs nothing reads: a bf16 matmul
on a CPU builds a kernel for each new shape, and N changes with every batch); each layer's attention (`attention`)
lays its queries, keys and values out by sentence in length groups (`groups`: the sentences sorted by length and cut
where a group's attention padded to its own longest sentence saves more than a group costs, so short sentences no
longer pay for the batch's longest), runs the attention the model ran before on each group
(`distillery.training.cpu_kernels.attention`, which for a model that infers is PyTorch's fused SDPA but in bf16 on a
CPU without AMX; padded keys masked as before) and gathers its output again; and a forward hook on the encoder
scatters the last hidden state back to (B, T, D), zero at the padded positions, for the pooler and the heads.

A real token's value is the padded forward's: the same products of the same operands (tests/test_unpadding.py holds
logits and gradients to float32 rounding). A padded position's is not (zero, where a padded forward computes values
nothing should read), so `reads_padding` allows unpadding only for a training whose loss reads no padded position: a
sequence classifier's (its [CLS] token), a masked LM's (labels on real tokens), and a distillation whose objectives
read logits only (TinyBERT's official attention and hidden-state losses read padded positions, as the paper's code
does, and every captured internal is kept in its padded layout). Dropout draws its masks for the R rows (and the
attention's for each group's layout): an unpadded run draws other masks than a padded one, from the same distribution,
and the same seed gives the same run.

Training enters it where `reads_padding` allows (`distillery.training.trainer`); so do a sequence classifier's
inference forwards (`inferring`: dev scores, test predictions, the teacher-logits cache).

`python -m benchmarks.unpadded` times a fine-tuning step padded, unpadded with the attention in one group, unpadded in
length groups, and the same at the exact length N, on fresh real GLUE batches, side by side.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from distillery.training import cpu_kernels

#: the attention implementation name `used` gives a model (`attention`)
ATTENTION = "unpadded_cpu"
#: model types whose base model runs ``encoder(hidden_states, attention_mask=...)`` with BERT's attention
ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra"})
#: heads whose loss reads no padded position: [CLS] (classification, next sentence) or labels on real tokens (MLM)
HEADS = ("ForSequenceClassification", "ForMaskedLM", "ForPreTraining")


#: what the attention of one more length group costs, in the unit of its work (sentences x length^2): `groups`
#: starts a new group where it saves more than this (`python -m benchmarks.unpadded --group-cost C` measures a value)
GROUP_COST = 8192
#: the unpadded sequence's length is rounded up to a multiple of ROWS, with copies of its first token whose outputs
#: nothing reads: a bf16 matmul on a CPU (oneDNN) builds a kernel for each new shape, about 5 ms for a linear layer's,
#: and keeps 1,024 of them, so a length that changed with every batch built most of a step's linear kernels afresh
#: at every step (`python -m benchmarks.unpadded` times fresh batches, as the pipeline's)
ROWS = 64


def groups(lengths: list[int], cost: float | None = None) -> list[list[int]]:
    """The sentences of a batch (their `lengths`) in length groups whose attentions cost least: each group is padded
    to its longest sentence and costs ``len(group) * longest**2 + cost`` (`GROUP_COST` by default). The sentences
    sorted longest first (ties in batch order), cut where an exact dynamic programme over the sorted order says; a
    list of groups of indices."""
    cost = GROUP_COST if cost is None else cost
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: the least cost of the first j sorted sentences
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # the last group: sorted sentences i..j-1, padded to the longest, sentence i's
            c = best[i] + (j - i) * lengths[order[i]] ** 2 + cost
            if c < best[j]:
                best[j], cut[j] = c, i
    out: list[list[int]] = []
    j = n
    while j:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


@dataclass(frozen=True)
class _Tokens:
    """The real tokens of a (B, T) batch: their flat positions ``index`` (N,) in B x T, and ``rows`` (a multiple of
    `ROWS`), the positions the unpadded sequence reads (``index``, then copies of its first); for the attention, the
    real tokens' places ``slots`` (N,) in the length groups' padded layouts laid end to end (`groups`), the places
    each row reads its output from (``row_slots``), each group's (n, L) shape and its (n, 1, 1, L) mask of real
    keys."""

    index: Tensor
    batch: int
    length: int
    rows: Tensor
    slots: Tensor
    row_slots: Tensor
    shapes: tuple[tuple[int, int], ...]
    masks: tuple[Tensor, ...]

    @classmethod
    def of(cls, real: Tensor) -> "_Tokens":
        """The real tokens of a batch whose (B, T) boolean mask is `real` (a sentence's real tokens need not be a
        prefix: each group lays them out from its first position, in their order)."""
        b, t = real.shape
        index = real.reshape(-1).nonzero().squeeze(1)
        lengths = real.sum(1)
        start, shapes, masks = [0] * b, [], []
        offset = 0
        for group in groups(lengths.tolist()):
            longest = int(lengths[group[0]])
            if longest == 0:  # sentences without a real token: nothing to attend
                continue
            for slot, i in enumerate(group):
                start[i] = offset + slot * longest
            shapes.append((len(group), longest))
            masks.append((torch.arange(longest) < lengths[group, None]).view(len(group), 1, 1, longest))
            offset += len(group) * longest
        rank = (real.cumsum(1) - 1).reshape(-1).index_select(0, index)  # each token's place in its sentence
        slots = torch.tensor(start).index_select(0, index // t) + rank
        extra = -index.numel() % ROWS if index.numel() else 0
        rows, row_slots = (torch.cat([x, x[:1].expand(extra)]) for x in (index, slots))
        return cls(index, b, t, rows, slots, row_slots, tuple(shapes), tuple(masks))

    def grouped(self, x: Tensor) -> list[Tensor]:
        """(1, H, R, d) per-head rows -> each length group's (n, H, L, d) of the real tokens, zero elsewhere."""
        heads, d = x.shape[1], x.shape[3]
        flat = x.transpose(1, 2).reshape(-1, heads * d)[: self.index.numel()]
        size = sum(n * length for n, length in self.shapes)
        out = flat.new_zeros(size, heads * d).index_copy(0, self.slots, flat)
        return [part.view(n, length, heads, d).transpose(1, 2)
                for part, (n, length) in zip(out.split([n * length for n, length in self.shapes]), self.shapes)]

    def ungrouped(self, outs: list[Tensor]) -> Tensor:
        """Each length group's (n, L, H, d) output -> the rows' (1, R, H, d)."""
        heads, d = outs[0].shape[2:]
        flat = torch.cat([o.reshape(-1, heads * d) for o in outs]) if len(outs) > 1 else outs[0].reshape(-1, heads * d)
        return flat.index_select(0, self.row_slots).view(1, -1, heads, d)

    def gathered(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (1, R, ...): the rows (the real tokens, then copies of the first)."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.rows).unsqueeze(0)

    def scattered(self, x: Tensor) -> Tensor:
        """(1, R, D) rows -> (B, T, D) of the real tokens, zero at padded positions."""
        flat = x[0, : self.index.numel()]
        out = flat.new_zeros(self.batch * self.length, *flat.shape[1:]).index_copy(0, self.index, flat)
        return out.view(self.batch, self.length, *flat.shape[1:])


#: the real tokens of the forward in progress (set by the encoder's pre-hook, cleared by its hook)
_TOKENS: contextvars.ContextVar[_Tokens | None] = contextvars.ContextVar("distillery_unpadded", default=None)


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """The attention of an unpadded forward: (1, H, N, d) queries, keys and values laid out by sentence in each length
    group's padded (n, H, L, d) layout, `cpu_kernels.attention` (for a module that infers PyTorch's SDPA, but in
    bf16 on a CPU without AMX) on each group with its mask of real keys, and the output's real tokens, (1, N, H, d)
    (no probabilities: nothing unpadded reads them); outside an unpadded forward, the same attention as it is."""
    tokens = _TOKENS.get()
    if tokens is None:
        return cpu_kernels.attention(module, query, key, value, attention_mask, **kwargs)
    outs = [cpu_kernels.attention(module, q, k, v, mask, **kwargs)[0] for q, k, v, mask in
            zip(tokens.grouped(query), tokens.grouped(key), tokens.grouped(value), tokens.masks)]
    return tokens.ungrouped(outs), None


def _gather(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The encoder's forward pre-hook: its (B, T, D) input's real tokens as (1, N, D), where its attention mask is
    the boolean (B, 1, T, T) one transformers makes for SDPA (a batch without padding has none: nothing to do)."""
    _TOKENS.set(None)
    mask = kwargs.get("attention_mask")
    if not args or not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 4 \
            or kwargs.get("encoder_hidden_states") is not None:
        return None
    hidden = args[0]
    b, t = hidden.shape[:2]
    if mask.shape[0] != b or mask.shape[-1] != t:
        return None
    tokens = _Tokens.of(mask[:, 0, 0, :])  # each query row of the mask: the real keys
    if not tokens.index.numel():  # no real token at all: nothing to gather
        return None
    _TOKENS.set(tokens)
    return (tokens.gathered(hidden), *args[1:]), kwargs


def _scatter(_module: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> Any:
    """The encoder's forward hook: its last hidden state back in the (B, T, D) layout."""
    tokens = _TOKENS.get()
    _TOKENS.set(None)
    if tokens is None:
        return None
    if isinstance(output, tuple):
        return (tokens.scattered(output[0]), *output[1:])
    output.last_hidden_state = tokens.scattered(output.last_hidden_state)
    return output


def reads_padding(model: nn.Module | None) -> bool:
    """Whether a training of `model` may read a padded position (True where it cannot tell): a `Distiller` whose
    objectives read captured internals, or whose student or teacher does; a model outside `ENCODERS`, with another
    head than `HEADS`, or whose config asks for every layer's hidden states or attentions."""
    if model is None:
        return False
    if hasattr(model, "student"):  # a Distiller
        return getattr(model, "reads_internals", True) or reads_padding(model.student) \
            or reads_padding(getattr(model, "teacher", None))
    config = getattr(model, "config", None)
    return not (getattr(config, "model_type", None) in ENCODERS and type(model).__name__.endswith(HEADS)
                and not getattr(config, "output_hidden_states", False)
                and not getattr(config, "output_attentions", False))


@contextmanager
def used(model: nn.Module | None, device: torch.device | str) -> Iterator[bool]:
    """Within the block, every encoder of `model` in `ENCODERS` runs unpadded on a CPU (`device`), unless compiled;
    all put back on exit. Yields whether one does. The caller decides that nothing its training reads is padded
    (`reads_padding`)."""
    if model is None or torch.device(device).type != "cpu":
        yield False
        return
    hooks: list[Any] = []
    switched: list[tuple[nn.Module, str]] = []
    try:
        for module, config in cpu_kernels.outermost_models(model):
            encoder = getattr(module.base_model, "encoder", None)
            if getattr(config, "model_type", None) not in ENCODERS or encoder is None \
                    or getattr(module, "_compiled_call_impl", None) is not None:
                continue
            cpu_kernels.register_attention(ATTENTION, attention)
            hooks.append(encoder.register_forward_pre_hook(_gather, with_kwargs=True))
            hooks.append(encoder.register_forward_hook(_scatter, with_kwargs=True))
            switched.append((module, config._attn_implementation))
            module.set_attn_implementation(ATTENTION)
        yield bool(switched)
    finally:
        for hook in hooks:
            hook.remove()
        for module, before in switched:
            module.set_attn_implementation(before)
        _TOKENS.set(None)


@contextmanager
def inferring(model: nn.Module | None, device: torch.device | str) -> Iterator[bool]:
    """Within the block, `model`'s inference forwards on a CPU run unpadded where nothing its outputs give is read
    from a padded position (`reads_padding`: a sequence classifier's logits); yields whether they do."""
    if reads_padding(model):
        yield False
        return
    with used(model, device) as unpadded:
        yield unpadded


__all__ = ["ATTENTION", "ENCODERS", "GROUP_COST", "HEADS", "ROWS", "attention", "groups", "inferring", "reads_padding",
           "used"]

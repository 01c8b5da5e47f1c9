"""Capture the internals that the distillation objectives fit, for the mapped layers only.

What is captured (notation of TinyBERT, Jiao et al., 2020, eqs. 3-9, and MiniLM, Wang et al., 2020):

* hidden states H_m (TinyBERT eq. 8; state 0 = embedding output E, eq. 9);
* pre-softmax attention scores A = Q K^T / sqrt(d_k) (TinyBERT eq. 7 fits these), *without* the
  padding mask added (the objectives decide how padding is treated);
* attention distributions softmax(A + mask) over keys, padded keys masked, before dropout
  (MiniLM eq. 2 / MobileBERT attention transfer);
* per-head queries, keys and values (MiniLM value relation, eq. 3; MiniLM v2 relations).

How: forward hooks on the query/key/value ``nn.Linear`` modules of the requested layers keep
their outputs (no recomputation), and a forward hook on the layer's self-attention module builds
scores/probs from them with the very attention mask that module received. Hidden states come from
forward hooks on the embedding module and the requested transformer layers. The model keeps its own
attention implementation (SDPA stays SDPA for every layer); nothing is detached, so gradients flow
through the captured tensors of a student.

Which models: everything above for encoders in BERT's layout (``READS_ATTENTION``: BERT, RoBERTa, XLM-R, CamemBERT,
ELECTRA, DistilBERT, MobileBERT); hidden states only for DeBERTa-v2/v3 and ModernBERT, whose attention is not a
query/key/value triple of ``nn.Linear`` modules (an attention capture there raises ``CaptureError`` naming the type).
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch
from torch import Tensor, nn

__all__ = ["Captured", "capture", "CaptureError", "READS_ATTENTION", "model_parts"]


_KINDS = ("hidden", "scores", "probs", "values", "queries", "keys")


class CaptureError(ValueError):
    """The model's structure is not supported, or a requested layer does not exist."""


@dataclass
class Captured:
    """Tensors captured during one forward pass (keys are layer / state indices).

    hidden: state index -> (B, T, D); 0 = embedding output, i = output of layer i (1-based).
    scores: 0-based layer -> (B, H, T, T) pre-softmax Q K^T / sqrt(d_head), no mask added, in the forward's
        precision (bf16 under bf16 autocast).
    probs: 0-based layer -> (B, H, T, T) softmax over keys with padded keys masked (pre-dropout).
    values / queries / keys: 0-based layer -> (B, H, T, d_head).
    """

    hidden: dict[int, Tensor] = field(default_factory=dict)
    scores: dict[int, Tensor] = field(default_factory=dict)
    probs: dict[int, Tensor] = field(default_factory=dict)
    values: dict[int, Tensor] = field(default_factory=dict)
    queries: dict[int, Tensor] = field(default_factory=dict)
    keys: dict[int, Tensor] = field(default_factory=dict)

    def select(self, kind: str, indices: Iterable[int]) -> list[Tensor]:
        """Tensors of ``kind`` ("hidden", "scores", ...) in the order of ``indices`` (e.g. a layer
        map's ``teacher_layers``), ready for the list-in objectives."""
        table = getattr(self, kind, None)
        indices = list(indices)
        if kind not in _KINDS or not isinstance(table, dict):
            raise CaptureError(f"capture: unknown kind {kind!r}; expected one of {', '.join(_KINDS)}")
        missing = [i for i in indices if i not in table]
        if missing:
            raise CaptureError(f"capture: {kind} not captured for index(es) {missing}; captured: {sorted(table)}")
        return [table[i] for i in indices]

    def float(self) -> "Captured":
        """The same tensors in float32 (the objectives' inputs under bf16 autocast; no copy of fp32 tensors), but for
        the scores: the attention loss reads them in fp32 a slice at a time, without a float32 copy of each."""
        from distillery.precision import fp32

        return Captured(**{kind: getattr(self, kind) if kind == "scores" else fp32(getattr(self, kind))
                           for kind in _KINDS})

    def clear(self) -> None:
        for d in (self.hidden, self.scores, self.probs, self.values, self.queries, self.keys):
            d.clear()


#: Model types whose self-attention ``capture`` reads (query/key/value ``nn.Linear`` modules, BERT's layout): the
#: attention-level objectives (scores, probs, queries, keys, values) need a teacher and a student of these types.
#: Other encoders (DeBERTa-v2/v3: disentangled attention; ModernBERT: fused Wqkv, rotary positions) give hidden states
#: only.
READS_ATTENTION = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "mobilebert"})


@dataclass
class _Parts:
    embeddings: nn.Module
    layers: list[nn.Module]
    self_attention: list[nn.Module | None]
    qkv_names: tuple[str, str, str] | None
    model_type: str


def model_parts(model: nn.Module) -> _Parts:
    """Locate embeddings, transformer layers and (where its layout is BERT's) self-attention modules of an encoder or
    its ``*For*`` heads (DDP / ``torch.compile`` wrappers unwrapped): BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT and
    MobileBERT fully; DeBERTa-v2 and ModernBERT for their hidden states."""
    for _ in range(4):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    base = getattr(model, "base_model", model)
    model_type = str(getattr(getattr(model, "config", None), "model_type", type(model).__name__))
    # ELECTRA with factorised embeddings: state 0 is what the layers read, after the projection to the hidden size
    embeddings = getattr(base, "embeddings_project", None) or getattr(base, "embeddings", None)
    container = getattr(base, "encoder", None) or getattr(base, "transformer", None)
    layers = getattr(container, "layer", None) if container is not None else getattr(base, "layers", None)
    if embeddings is None or layers is None:
        raise CaptureError(
            f"capture: unsupported model {type(model).__name__}: expected a BERT-family encoder "
            "(embeddings + encoder.layer / transformer.layer / layers)"
        )
    attn: list[nn.Module | None] = []
    names: tuple[str, str, str] | None = None
    for layer in layers:
        a = getattr(layer, "attention", None)
        a = getattr(a, "self", a)
        for cand in (("query", "key", "value"), ("q_lin", "k_lin", "v_lin")):
            if a is not None and all(isinstance(getattr(a, n, None), nn.Linear) for n in cand):
                names = cand
                break
        else:
            a = None
        attn.append(a)
    return _Parts(embeddings=embeddings, layers=list(layers), self_attention=attn,
                  qkv_names=names if all(a is not None for a in attn) else None, model_type=model_type)


def _heads(x: Tensor, head_size: int) -> Tensor:
    """(B, T, H*d) -> (B, H, T, d)."""
    b, t, _ = x.shape
    return x.view(b, t, -1, head_size).transpose(1, 2)


def _apply_mask(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Add the module's attention mask to the scores, whatever form the attention backend uses."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:  # SDPA-style: True = attend
        return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores + mask.to(scores.dtype)  # eager-style additive mask (0 / dtype minimum)


def _as_tensor(output: Any) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    raise CaptureError(f"capture: cannot read a hidden state from a {type(output).__name__} output")


def _indices(name: str, values: Iterable[int], limit: int) -> tuple[int, ...]:
    out = tuple(sorted(set(int(v) for v in values)))
    for v in out:
        if not 0 <= v < limit:
            raise CaptureError(f"capture: {name} index {v} out of range 0..{limit - 1}")
    return out


@contextmanager
def capture(
    model: nn.Module,
    *,
    hidden: Iterable[int] = (),
    scores: Iterable[int] = (),
    probs: Iterable[int] = (),
    values: Iterable[int] = (),
    queries: Iterable[int] = (),
    keys: Iterable[int] = (),
) -> Iterator[Captured]:
    """Within the block, every forward of ``model`` fills the yielded :class:`Captured`.

    Each forward overwrites the previous one's entries. Only the listed layers are hooked; the
    model's attention implementation is untouched. Hooks are removed on exit.
    """
    parts = model_parts(model)
    n = len(parts.layers)
    hidden_idx = _indices("hidden state", hidden, n + 1)
    score_idx = _indices("scores layer", scores, n)
    prob_idx = _indices("probs layer", probs, n)
    value_idx = _indices("values layer", values, n)
    query_idx = _indices("queries layer", queries, n)
    key_idx = _indices("keys layer", keys, n)
    out = Captured()
    handles: list[Any] = []

    def keep_hidden(index: int):
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            out.hidden[index] = _as_tensor(output)

        return hook

    try:
        for i in hidden_idx:
            module = parts.embeddings if i == 0 else parts.layers[i - 1]
            handles.append(module.register_forward_hook(keep_hidden(i)))

        attn_layers = sorted(set(score_idx) | set(prob_idx) | set(value_idx) | set(query_idx) | set(key_idx))
        if attn_layers and parts.qkv_names is None:
            raise CaptureError(f"capture: the attention of a {parts.model_type} model cannot be read (query/key/value "
                               f"projections in BERT's layout: {', '.join(sorted(READS_ATTENTION))}); only hidden "
                               "states can be captured")
        for i in attn_layers:
            attn = parts.self_attention[i]
            head_size = int(attn.attention_head_size)
            scale = float(getattr(attn, "scaling", 1.0 / math.sqrt(head_size)))
            need_q = i in score_idx or i in prob_idx or i in query_idx
            need_k = need_q or i in key_idx
            need_v = i in value_idx
            store: dict[str, Tensor] = {}

            def keep_linear(slot: str, store: dict[str, Tensor] = store):
                def hook(_module: nn.Module, _args: Any, output: Tensor) -> None:
                    store[slot] = output

                return hook

            q_name, k_name, v_name = parts.qkv_names
            if need_q:
                handles.append(getattr(attn, q_name).register_forward_hook(keep_linear("q")))
            if need_k:
                handles.append(getattr(attn, k_name).register_forward_hook(keep_linear("k")))
            if need_v:
                handles.append(getattr(attn, v_name).register_forward_hook(keep_linear("v")))
            signature = inspect.signature(attn.forward)

            def on_attention(
                module: nn.Module,
                args: tuple,
                kwargs: dict,
                _output: Any,
                i: int = i,
                store: dict[str, Tensor] = store,
                head_size: int = head_size,
                scale: float = scale,
                signature: inspect.Signature = signature,
            ) -> None:
                q = _heads(store.pop("q"), head_size) if "q" in store else None
                k = _heads(store.pop("k"), head_size) if "k" in store else None
                v = _heads(store.pop("v"), head_size) if "v" in store else None
                if i in query_idx:
                    out.queries[i] = q
                if i in key_idx:
                    out.keys[i] = k
                if i in value_idx:
                    out.values[i] = v
                if i in score_idx:
                    # in the forward's precision (under bf16 autocast q and k are bf16: the product a bf16 attention
                    # computes), scaled on q (d < T), contiguous: one copy each; the attention loss reads them in fp32
                    # a slice at a time (distillery.objectives.tinybert)
                    with torch.autocast(q.device.type, enabled=False):
                        qs = q.to(memory_format=torch.contiguous_format, copy=True).mul_(scale)
                        ks = k.to(memory_format=torch.contiguous_format)
                        out.scores[i] = torch.matmul(qs, ks.transpose(-1, -2))
                if i in prob_idx:
                    # in fp32 whatever the forward's precision: under bf16 autocast q and k are bf16, and the
                    # objectives fit these probabilities (distillery.precision)
                    with torch.autocast(q.device.type, enabled=False):
                        qf = q.to(torch.float32, copy=True, memory_format=torch.contiguous_format).mul_(scale)
                        kf = k.to(torch.float32, memory_format=torch.contiguous_format)
                        s = torch.matmul(qf, kf.transpose(-1, -2))  # scaled on q (d < T), contiguous: one copy each
                        bound = signature.bind_partial(*args, **kwargs).arguments
                        out.probs[i] = torch.softmax(_apply_mask(s, bound.get("attention_mask")), dim=-1)

            handles.append(attn.register_forward_hook(on_attention, with_kwargs=True))
        yield out
    finally:
        for h in handles:
            h.remove()

"""Cheaper kernels for a model's training step on a CPU: the dropout mask, the attention, the bias of a bf16 matmul.

`python -m benchmarks.precision` times the distillation step with and without them side by side (`kernels_gain`;
its runs are rows of the results log, docs/results.md):

* **Dropout.** PyTorch's CPU dropout draws one Bernoulli sample per element, a large share of a BERT step (the
  attention probabilities are B x H x T x T elements a layer). `dropout` draws its mask from 64-bit words of the same
  generator (`torch.Generator`, seeded by the Trainer as before), each split into four 16-bit draws: an element is
  dropped when its draw falls below ``round(p * 65536)``, so the drop probability is ``p`` to within 2^-17
  (0.1 -> 0.100006), and kept elements are scaled by the inverse of the exact keep probability, so the expectation is
  unchanged. Same seed, same mask: training stays bit-reproducible.
* **Attention.** `attention` is BERT's eager attention (matmul, mask, softmax, dropout, matmul) whose scores stay in
  the dtype of the matmul that gives them: under bf16 autocast no float32 copy of each (B, H, T, T) tensor is made
  and cast back (the probabilities' matmul with the values casts them to bf16 anyway; softmax accumulates in
  float32 inside its kernel). For a module that infers (a teacher, an evaluation) it is PyTorch's fused SDPA, but
  in bf16 on a CPU without AMX (`eager_infers`): there SDPA's flash kernel at BERT's head size of 32 was the slower
  (`python -m benchmarks.precision`, (c), times a model's inference both ways).
* **Mask.** The padding mask goes onto the bf16 scores as an additive bias broadcast over the heads: the same
  scores as filling the padded keys with the dtype's minimum (the minimum plus a score rounds to the minimum), at
  less than half the time of ``masked_fill_`` with the boolean (B, 1, T, T) mask on this machine.
* **Residual stream.** Under bf16 autocast the embeddings' output (float32: their tables and LayerNorm are float32)
  is cast to bf16 once, so every layer's residual stream stays bf16: LayerNorm keeps its input's dtype under autocast
  (it accumulates in float32 inside its kernel), and the next layer's query, key and value projections read its bf16
  output instead of each casting a float32 copy of it, and backward casts no gradient of it back. The hidden states
  the losses read are then bf16 (their fp32 copies are what the objectives reduce, as for the attention scores).
* **Bias.** On a CPU without AMX (AVX512-BF16 alone), PyTorch's bf16 matmul with a bias (``addmm``) is slower than
  the same matmul without one followed by the bias added to its output: `Linear` does the latter under bf16 autocast
  (the bias in bf16, as autocast's own ``linear`` casts it), and is ``nn.Linear`` otherwise. With AMX, oneDNN adds the
  bias inside the matmul and is the faster: there `used` leaves ``nn.Linear`` as it is (`bias_after_matmul`).

`used` puts them in a model for its training or inference on a CPU (`put`, for a copy that is never put back):
every ``nn.Dropout`` becomes `Dropout`, every ``nn.Linear`` a `Linear` (same parameters; on a CPU without AMX), the
BERT-layout encoders' residual stream goes bf16 under bf16 autocast, and their attention runs `attention`, registered
with transformers' `AttentionInterface` as ``ATTENTION`` (a teacher's objectives read scores and probabilities computed
apart by `distillery.capture`); all is put back after, and nothing is saved with the model. In fp32 a model that
infers computes what it computed without them, bit for bit. On a GPU, PyTorch's fused kernels are already cheap and
models are left as they are.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

#: resolution of the drop probability: one 16-bit draw per element
LEVELS = 1 << 16
#: the attention implementation name `used` gives a model (`attention`)
ATTENTION = "eager_cpu_kernels"
#: model types whose eager attention is BERT's, so `attention` computes the same thing
BERT_ATTENTION = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "mobilebert"})


def drop_levels(p: float) -> int:
    """How many of the `LEVELS` 16-bit draws drop an element at probability `p`."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return round(p * LEVELS)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.bool) -> Tensor:
    """A mask of `shape`, each element True (kept) with probability ``1 - drop_levels(p) / LEVELS``; in a float
    `dtype`, 1 (kept) or 0, written by the comparison itself (see `dropout`)."""
    n = 1
    for s in shape:
        n *= int(s)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(1 << 63), (1 << 63) - 1)
    draws = words.view(torch.int16)[:n].view(tuple(shape))
    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    return torch.ge(draws, drop_levels(p) - LEVELS // 2, out=out)  # int16 draws are uniform on [-32768, 32767]


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of `x` (as `torch.nn.functional.dropout`), with `keep_mask`'s mask in `x`'s dtype: on a CPU
    PyTorch casts a boolean mask to a float dtype several times slower than it compares, and the product's backward
    would cast it again. The same mask and the same result as with the boolean one, bit for bit."""
    if not training or p == 0.0:
        return x
    dropped = drop_levels(p)
    if dropped >= LEVELS:
        return x * 0.0
    return _Masked.apply(x, keep_mask(x.shape, p, x.device, x.dtype), LEVELS / (LEVELS - dropped))


class _Masked(torch.autograd.Function):
    """``x * keep * scale`` for a 0/1 `keep` of `x`'s dtype, and its gradient ``grad * keep * scale``, each one
    pass (``addcmul``: the product in float32 for bf16 and float32, rounded once: the bits of ``x * scale``)."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.addcmul(x.new_zeros(()), x, keep, value=scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.addcmul(grad.new_zeros(()), grad, keep, value=ctx.scale), None, None


_drop = dropout  # `attention` takes transformers' ``dropout`` argument, which hides the function's name


class Dropout(nn.Dropout):
    """`torch.nn.Dropout` with `dropout`'s mask."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class Linear(nn.Linear):
    """`torch.nn.Linear` whose bias, under bf16 autocast on a CPU, is added after the matmul (see the module's
    docstring); the same computation as ``nn.Linear`` but for the rounding of the matmul's output before the bias."""

    def forward(self, x: Tensor) -> Tensor:
        if self.bias is None or not torch.is_autocast_enabled("cpu") or x.device.type != "cpu":
            return super().forward(x)
        out = nn.functional.linear(x, self.weight)
        return out.add_(self.bias.to(out.dtype))


@lru_cache(maxsize=1)
def bias_after_matmul() -> bool:
    """Whether `used` makes ``nn.Linear`` a `Linear` on this CPU: where it has no AMX (see the module's docstring)."""
    from distillery.precision import cpu_bf16_flags

    return "amx_bf16" not in cpu_bf16_flags()


def eager_infers(query: Tensor) -> bool:
    """Whether a module that infers runs `attention`'s own computation on these queries rather than PyTorch's fused
    SDPA: bf16 on a CPU without AMX, where SDPA's flash kernel at BERT's head sizes was the slower (see the module's
    docstring)."""
    return query.dtype == torch.bfloat16 and query.device.type == "cpu" and bias_after_matmul()


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """BERT's eager attention (transformers' ``eager_attention_forward``) with `dropout`'s mask on the probabilities:
    (B, T, H, d) output and (B, H, T, T) probabilities. `attention_mask`: True where a key is attended (the masks
    transformers makes for SDPA, which `used` asks for) or additive. The scores stay in the dtype of the matmul that
    gives them: under bf16 autocast the scaling goes on the queries, the mask, softmax (which accumulates in float32
    inside the kernel) and dropout run on bf16 scores, the precision the probabilities' matmul with the values
    casts them to anyway, instead of a float32 copy of every (B, H, T, T) tensor and its cast back."""
    if not module.training and not eager_infers(query):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query * scaling, key.transpose(2, 3))
    if attention_mask is not None:
        low = torch.finfo(weights.dtype).min
        if attention_mask.dtype == torch.bool:  # one bias for every head (see the module's docstring)
            bias = torch.zeros(attention_mask.shape, dtype=weights.dtype, device=weights.device)
            bias = bias.masked_fill_(~attention_mask, low)
        else:
            bias = attention_mask.to(weights.dtype).clamp_min(low)
        weights = weights.add_(bias)
    with torch.autocast(weights.device.type, enabled=False):
        weights = torch.softmax(weights, dim=-1)
    weights = _drop(weights, dropout, module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def register_attention(name: str, function: Any) -> None:
    """`function` as transformers' attention implementation `name`, with the boolean masks transformers makes for
    SDPA (a name without a mask function of its own gets no mask at all); once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, function)
    if name not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(name, sdpa_mask)


def outermost_models(model: nn.Module) -> Iterator[tuple[nn.Module, Any]]:
    """(module, its config) for the outermost transformers model of each config inside `model` (a ``*For*`` model
    and its base model share one; a Distiller holds its student), in module order."""
    seen: set[int] = set()
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(module, "set_attn_implementation") and id(config) not in seen:
            seen.add(id(config))
            yield module, config


def _low_precision_stream(_module: nn.Module, _args: Any, output: Any) -> Tensor | None:
    """A forward hook on the embeddings: their output in autocast's dtype under CPU autocast (see the module's
    docstring), else unchanged."""
    if (isinstance(output, Tensor) and output.is_floating_point() and output.device.type == "cpu"
            and torch.is_autocast_enabled("cpu")):
        return output.to(torch.get_autocast_dtype("cpu"))
    return None


def put(model: nn.Module | None, device: torch.device | str) -> Callable[[], None]:
    """`model` made to run with these kernels on a CPU (`device`): its ``nn.Dropout`` modules swapped for `Dropout`,
    its ``nn.Linear`` modules made `Linear` (without AMX: `bias_after_matmul`), and for a BERT-layout encoder its
    residual stream bf16 under bf16 autocast and its attention `ATTENTION`. Returns the function that puts all back.
    Elsewhere, or for None, nothing changes."""
    undo: list[Callable[[], None]] = []

    def restore() -> None:
        while undo:
            undo.pop()()

    if model is None or torch.device(device).type != "cpu":
        return restore
    from distillery.capture import model_parts

    try:
        for module in list(model.modules()):
            if type(module) is nn.Linear and bias_after_matmul():
                module.__class__ = Linear  # the same module and parameters, `Linear`'s forward
                undo.append(lambda m=module: setattr(m, "__class__", nn.Linear))
            for name, child in list(module.named_children()):
                if type(child) is nn.Dropout:
                    replacement = Dropout(child.p, child.inplace)
                    replacement.train(child.training)
                    setattr(module, name, replacement)
                    undo.append(lambda m=module, n=name, c=child: (c.train(getattr(m, n).training), setattr(m, n, c)))
        for module, config in outermost_models(model):
            if getattr(config, "model_type", None) not in BERT_ATTENTION:
                continue
            hook = model_parts(module).embeddings.register_forward_hook(_low_precision_stream)
            undo.append(hook.remove)
            before = getattr(config, "_attn_implementation", None)
            if before in ("eager", "sdpa"):
                register_attention(ATTENTION, attention)
                module.set_attn_implementation(ATTENTION)
                undo.append(lambda m=module, b=before: m.set_attn_implementation(b))
    except BaseException:
        restore()
        raise
    return restore


@contextmanager
def used(model: nn.Module | None, device: torch.device | str) -> Iterator[None]:
    """Within the block, `model` runs with these kernels on a CPU (`device`, `put`); all put back on exit."""
    restore = put(model, device)
    try:
        yield
    finally:
        restore()


__all__ = ["ATTENTION", "BERT_ATTENTION", "Dropout", "LEVELS", "Linear", "attention", "bias_after_matmul",
           "drop_levels", "dropout", "eager_infers", "keep_mask", "outermost_models", "put", "register_attention",
           "used"]

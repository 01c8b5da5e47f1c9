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
  float32 inside its kernel).
* **Bias.** On a CPU without AMX (AVX512-BF16 alone), PyTorch's bf16 matmul with a bias (``addmm``) is slower than
  the same matmul without one followed by the bias added to its output: `Linear` does the latter under bf16 autocast
  (the bias in bf16, as autocast's own ``linear`` casts it), and is ``nn.Linear`` otherwise. With AMX, oneDNN adds the
  bias inside the matmul and is the faster: there `used` leaves ``nn.Linear`` as it is (`bias_after_matmul`).

`used` puts them in a model for its training on a CPU: every ``nn.Dropout`` becomes `Dropout`, every ``nn.Linear`` a
`Linear` (same parameters; on a CPU without AMX), and the attention of the BERT-layout encoders runs `attention`,
registered with transformers' `AttentionInterface` as ``ATTENTION``; all is put back after the training, and nothing
is saved with the model. On a GPU, PyTorch's fused kernels are already cheap and models are left as they are.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

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


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A boolean mask of `shape`, each element True (kept) with probability ``1 - drop_levels(p) / LEVELS``."""
    n = 1
    for s in shape:
        n *= int(s)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(1 << 63), (1 << 63) - 1)
    draws = words.view(torch.int16)[:n].view(tuple(shape))
    return draws >= drop_levels(p) - LEVELS // 2  # int16 draws are uniform on [-32768, 32767]


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of `x` (as `torch.nn.functional.dropout`), with `keep_mask`'s mask."""
    if not training or p == 0.0:
        return x
    dropped = drop_levels(p)
    if dropped >= LEVELS:
        return x * 0.0
    keep = keep_mask(x.shape, p, x.device)
    return x.mul(keep).mul_(LEVELS / (LEVELS - dropped))


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


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              scaling: float | None = None, dropout: float = 0.0, **_: Any) -> tuple[Tensor, Tensor]:
    """BERT's eager attention (transformers' ``eager_attention_forward``) with `dropout`'s mask on the probabilities:
    (B, T, H, d) output and (B, H, T, T) probabilities. `attention_mask`: True where a key is attended (the masks
    transformers makes for SDPA, which `used` asks for) or additive. The scores stay in the dtype of the matmul that
    gives them: under bf16 autocast the scaling goes on the queries, the mask, softmax (which accumulates in float32
    inside the kernel) and dropout run on bf16 scores, the precision the probabilities' matmul with the values
    casts them to anyway, instead of a float32 copy of every (B, H, T, T) tensor and its cast back."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query * scaling, key.transpose(2, 3))
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        weights = weights.masked_fill_(~attention_mask, torch.finfo(weights.dtype).min)
    elif attention_mask is not None:
        weights = weights + attention_mask.to(weights.dtype).clamp_min(torch.finfo(weights.dtype).min)
    with torch.autocast(weights.device.type, enabled=False):
        weights = torch.softmax(weights, dim=-1)
    weights = _drop(weights, dropout, module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _register() -> None:
    """`attention` under the name `ATTENTION`, with the boolean masks transformers makes for SDPA (a name without a
    mask function of its own gets no mask at all)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, attention)
    if ATTENTION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)


@contextmanager
def used(model: nn.Module | None, device: torch.device | str) -> Iterator[None]:
    """Within the block, `model` trains with these kernels on a CPU (`device`): its ``nn.Dropout`` modules swapped for
    `Dropout`, its ``nn.Linear`` modules made `Linear` (without AMX: `bias_after_matmul`), a BERT-layout encoder's
    attention set to `ATTENTION`; all put back on exit. Elsewhere, or for None, nothing changes."""
    if model is None or torch.device(device).type != "cpu":
        yield
        return
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    linears: list[nn.Module] = []
    switched: list[tuple[nn.Module, str]] = []
    try:
        for module in list(model.modules()):
            if type(module) is nn.Linear and bias_after_matmul():
                module.__class__ = Linear  # the same module and parameters, `Linear`'s forward
                linears.append(module)
            for name, child in list(module.named_children()):
                if type(child) is nn.Dropout:
                    replacement = Dropout(child.p, child.inplace)
                    replacement.train(child.training)
                    setattr(module, name, replacement)
                    swapped.append((module, name, child))
        seen: set[int] = set()
        for module in model.modules():  # the outermost model of each config (a Distiller holds its student)
            config = getattr(module, "config", None)
            before = getattr(config, "_attn_implementation", None)
            if not hasattr(module, "set_attn_implementation") or id(config) in seen:
                continue
            seen.add(id(config))
            if getattr(config, "model_type", None) in BERT_ATTENTION and before in ("eager", "sdpa"):
                _register()
                module.set_attn_implementation(ATTENTION)
                switched.append((module, before))
        yield
    finally:
        for module, name, original in swapped:
            original.train(getattr(module, name).training)
            setattr(module, name, original)
        for module, before in switched:
            module.set_attn_implementation(before)
        for module in linears:
            module.__class__ = nn.Linear


__all__ = ["ATTENTION", "BERT_ATTENTION", "Dropout", "LEVELS", "Linear", "attention", "bias_after_matmul",
           "drop_levels", "dropout", "keep_mask", "used"]

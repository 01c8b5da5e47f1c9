"""DistilBERT's dynamic masking (Sanh et al., 2019, Sec. 3; the official distiller's `prepare_batch_mlm`).

Per batch, ``ceil(p * n_tokens)`` positions are drawn without replacement among the non-pad, non-special tokens,
with probability proportional to ``count(token) ** -smoothing`` (token-frequency smoothing, 0.7 officially:
rare tokens are masked more often than uniform masking would); each chosen position becomes [MASK] / a random
token / itself with probabilities 0.8 / 0.1 / 0.1. Labels are the original ids there and -100 elsewhere.
``smoothing=0`` is uniform masking over the eligible tokens.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
from torch import Tensor


def token_counts(sequences: Iterable[Sequence[int]], vocab_size: int) -> Tensor:
    """How often each token id occurs in the training sequences (the official `token_counts.pickle`)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for ids in sequences:
        counts += torch.bincount(torch.as_tensor(list(ids), dtype=torch.int64), minlength=vocab_size)[:vocab_size].double()
    return counts


def masking_weights(counts: Tensor, smoothing: float, special_ids: Iterable[int]) -> Tensor:
    """Per-token-id masking weights ``max(count, 1) ** -smoothing``, 0 for special tokens."""
    w = torch.clamp(counts.double(), min=1.0) ** (-float(smoothing))
    for i in special_ids:
        if i is not None and 0 <= i < w.numel():
            w[i] = 0.0
    return w.float()


class SmoothedMaskingCollator:
    """Pads a list of `{"input_ids": [...]}` examples and masks them as described in the module docstring.

    Returns `input_ids`, `attention_mask` and `labels` (no token-type ids: DistilBERT has no segments)."""

    def __init__(self, tokenizer, weights: Tensor, mlm_probability: float = 0.15,
                 mask_split: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int | None = None) -> None:
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("masking needs a tokenizer with [MASK] and [PAD] tokens")
        self.tokenizer = tokenizer
        self.weights = weights
        self.p = float(mlm_probability)
        self.split = torch.tensor(mask_split, dtype=torch.float)
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    def __call__(self, features: list[dict]) -> dict[str, Tensor]:
        ids = [list(f["input_ids"]) for f in features]
        width = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, x in enumerate(ids):
            input_ids[row, : len(x)] = torch.as_tensor(x)
            attention_mask[row, : len(x)] = 1
        masked, labels = self.mask(input_ids, attention_mask)
        return {"input_ids": masked, "attention_mask": attention_mask, "labels": labels}

    def mask(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        probs = self.weights[input_ids.clamp(max=self.weights.numel() - 1)] * attention_mask.float()
        flat = probs.flatten()
        eligible = int((flat > 0).sum())
        n_target = min(eligible, math.ceil(self.p * int(attention_mask.sum())))
        labels = torch.full_like(input_ids, -100)
        if n_target == 0:
            return input_ids.clone(), labels
        chosen = torch.multinomial(flat, n_target, replacement=False, generator=self.generator)
        pred = torch.zeros_like(flat, dtype=torch.bool)
        pred[chosen] = True
        pred = pred.view_as(input_ids)
        labels[pred] = input_ids[pred]
        real = input_ids[pred]
        kind = torch.multinomial(self.split, real.numel(), replacement=True, generator=self.generator)
        rand = torch.randint(len(self.tokenizer), real.shape, generator=self.generator)
        new = torch.where(kind == 0, torch.full_like(real, self.tokenizer.mask_token_id),
                          torch.where(kind == 1, rand, real))
        out = input_ids.clone()
        out[pred] = new
        return out, labels

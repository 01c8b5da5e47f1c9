"""Shared tensor helpers for the distillation objectives (masking, pairing, KL over rows).

Conventions used by every objective in this package:

* ``attention_mask`` is ``(B, T)`` with 1 for real tokens and 0 for padding (HF convention).
* A "per-sequence average over valid positions" divides each sequence's sum by its own number of
  valid positions (the ``1/|x|`` or ``1/T`` of the papers' per-input equations) and then averages
  over the batch.
* Teacher tensors are targets: they are detached inside every objective, so gradients only reach
  the student's inputs.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

TensorOrList = Union[Tensor, Sequence[Tensor]]


def as_pairs(student: TensorOrList, teacher: TensorOrList, what: str) -> list[tuple[Tensor, Tensor]]:
    """Pair student/teacher tensors (one tensor each, or equal-length lists over mapped layers)."""
    s_list = [student] if isinstance(student, Tensor) else list(student)
    t_list = [teacher] if isinstance(teacher, Tensor) else list(teacher)
    if not s_list:
        raise ValueError(f"{what}: empty list of student tensors (no mapped layers?)")
    if len(s_list) != len(t_list):
        raise ValueError(
            f"{what}: {len(s_list)} student tensors but {len(t_list)} teacher tensors; "
            "the layer map must pair them one to one"
        )
    return [(s, t.detach()) for s, t in zip(s_list, t_list)]


def check_same_shape(s: Tensor, t: Tensor, what: str, index: int) -> None:
    if s.shape != t.shape:
        raise ValueError(f"{what}: pair {index}: student shape {tuple(s.shape)} != teacher shape {tuple(t.shape)}")


def check_heads(s: Tensor, t: Tensor, what: str, index: int) -> None:
    """(B,H,T,*) tensors: batch, heads and length must match (the last dim may differ)."""
    if s.dim() != 4 or t.dim() != 4:
        raise ValueError(f"{what}: pair {index}: expected (B, H, T, *) tensors, got {tuple(s.shape)} and {tuple(t.shape)}")
    if s.shape[1] != t.shape[1]:
        raise ValueError(
            f"{what}: pair {index}: student has {s.shape[1]} heads, teacher has {t.shape[1]}; this head-wise "
            "loss needs equal head counts (use relation_kl with relation heads, or drop this loss)"
        )
    if s.shape[0] != t.shape[0] or s.shape[2] != t.shape[2]:
        raise ValueError(f"{what}: pair {index}: batch/length differ: {tuple(s.shape)} vs {tuple(t.shape)}")


def token_mask(attention_mask: Tensor | None, batch: int, length: int, device: torch.device, what: str) -> Tensor:
    """Return a bool (B, T) mask of valid tokens; all-true when ``attention_mask`` is None."""
    if attention_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if attention_mask.shape != (batch, length):
        raise ValueError(f"{what}: attention_mask shape {tuple(attention_mask.shape)} != (batch, length) {(batch, length)}")
    return attention_mask.to(device=device) != 0


def per_sequence_mean(values: Tensor, valid: Tensor) -> Tensor:
    """values, valid: (B, ...) -> mean over batch of (sum of valid values / number of valid entries)."""
    b = values.shape[0]
    valid = valid.expand_as(values)
    num = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device)).reshape(b, -1).sum(-1)
    den = valid.reshape(b, -1).sum(-1).clamp_min(1).to(values.dtype)
    return (num / den).mean()


def masked_logits(logits: Tensor, key_valid: Tensor) -> Tensor:
    """Fill invalid keys (broadcastable bool mask) with the dtype minimum before a softmax."""
    return logits.masked_fill(~key_valid, torch.finfo(logits.dtype).min)


def kl_rows_from_log_probs(t_logp: Tensor, s_logp: Tensor, key_valid: Tensor) -> Tensor:
    """sum_k p_T(k) (log p_T(k) - log p_S(k)) over valid keys k -> tensor without the last dim."""
    zero = torch.zeros((), dtype=s_logp.dtype, device=s_logp.device)
    term = torch.where(key_valid, t_logp.exp() * (t_logp - s_logp), zero)
    return term.sum(-1)


def kl_rows_from_probs(t_p: Tensor, s_p: Tensor, key_valid: Tensor) -> Tensor:
    """KL(p_T || p_S) per row from probabilities; 0 log 0 = 0; padded keys contribute nothing."""
    tiny = torch.finfo(s_p.dtype).tiny
    use = key_valid & (t_p > 0)
    one = torch.ones((), dtype=s_p.dtype, device=s_p.device)
    t_log = torch.log(torch.where(use, t_p, one))
    s_log = torch.log(torch.where(key_valid, s_p, one).clamp_min(tiny))
    zero = torch.zeros((), dtype=s_p.dtype, device=s_p.device)
    return torch.where(use, t_p * (t_log - s_log), zero).sum(-1)


def real_classes(mask: Tensor, logits: Tensor, what: str) -> Tensor:
    """``mask`` (True = a real class, broadcastable to ``logits``) as a bool tensor of the logits' shape; every row
    needs one real class (span logits: [CLS] is always real)."""
    try:
        real = (mask != 0).to(logits.device).expand_as(logits)
    except RuntimeError:
        raise ValueError(f"{what}: mask shape {tuple(mask.shape)} does not broadcast to logits {tuple(logits.shape)}") \
            from None
    if not bool(real.any(-1).all()):
        raise ValueError(f"{what}: a row of the mask has no real class")
    return real


def masked_log_softmax(logits: Tensor, real: Tensor) -> Tensor:
    """log-softmax over the real classes of each row (``real``: bool, the logits' shape); 0 at the others, so a
    product with a probability that is 0 there stays 0 (no -inf * 0) and no gradient reaches them."""
    logp = F.log_softmax(logits.masked_fill(~real, float("-inf")), dim=-1)
    return torch.where(real, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))


def gold_rows(labels: Tensor) -> Tensor:
    """The rows of a gold-label tensor that carry a label: classes >= 0, scores not NaN (an unlabelled row,
    `distillery.unlabeled`, has -1 or NaN)."""
    return labels == labels if labels.is_floating_point() else labels >= 0

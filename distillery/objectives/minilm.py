"""MiniLM objectives (Wang et al., 2020, "MiniLM: Deep Self-Attention Distillation ...") and the
relation-head regrouping of MiniLMv2 (Wang et al., 2021).

* eq. 6  L_AT = 1/(A_h |x|) sum_a sum_t KL(A^T_{L,a,t} || A^S_{M,a,t})
* eq. 7-9 VR = softmax(V V^T / sqrt(d_k)),  L_VR = 1/(A_h |x|) sum_a sum_t KL(VR^T_{L,a,t} || VR^S_{M,a,t})
* v2: concat heads, re-split into R relation heads of width d_r, R = softmax(X X^T / sqrt(d_r)),
  L = 1/(R |x|) sum_r sum_t KL(R^T_{r,t} || R^S_{r,t}) for X in {Q, K, V}.

Padding: padded keys are excluded from every distribution (probability 0) and padded query rows
are excluded from the average; the 1/|x| uses each sequence's own length, then the batch is averaged.
Inputs may be one tensor (the last layer, as in MiniLM) or lists over mapped layers (summed).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from ._common import (
    TensorOrList,
    as_pairs,
    check_heads,
    kl_rows_from_log_probs,
    kl_rows_from_probs,
    masked_logits,
    per_sequence_mean,
    token_mask,
)
from .registry import Batch, register_term


def attention_kl(student_probs: TensorOrList, teacher_probs: TensorOrList, attention_mask: Tensor | None) -> Tensor:
    """MiniLM self-attention distribution transfer, eq. 6: ``KL(A^T || A^S)`` per head and query.

    Inputs: post-softmax attention probabilities (B, H, T, T) with padded keys at probability 0
    (``Captured.probs``); head counts must match (ValueError), the hidden size is free.
    Averaged over heads and valid query positions per sequence, then over the batch; summed over
    the list when lists are given.
    """
    total = None
    for i, (s, t) in enumerate(as_pairs(student_probs, teacher_probs, "attention_kl")):
        check_heads(s, t, "attention_kl", i)
        b, _, n, _ = s.shape
        valid = token_mask(attention_mask, b, n, s.device, "attention_kl")
        rows = kl_rows_from_probs(t.to(s.dtype), s, valid[:, None, None, :])  # (B,H,T)
        loss = per_sequence_mean(rows, valid[:, None, :])
        total = loss if total is None else total + loss
    return total


@register_term("attention_kl", levels=("intermediate",), features=(("probs", "attention"),), head_wise=True,
          paper="MiniLM eq. 6")
def _attention_kl_term(batch: Batch) -> Tensor:
    return attention_kl(*batch.select("probs", "attention"), batch.attention_mask)


def _relation_log_probs(x: Tensor, valid: Tensor) -> Tensor:
    """log softmax(X X^T / sqrt(d)) over valid keys; x: (B, H, T, d)."""
    logits = x @ x.transpose(-1, -2) / math.sqrt(x.shape[-1])
    return F.log_softmax(masked_logits(logits, valid[:, None, None, :]), dim=-1)


def _relation_kl_heads(s: Tensor, t: Tensor, valid: Tensor) -> Tensor:
    s_logp = _relation_log_probs(s, valid)
    t_logp = _relation_log_probs(t.to(s.dtype), valid)
    rows = kl_rows_from_log_probs(t_logp, s_logp, valid[:, None, None, :])
    return per_sequence_mean(rows, valid[:, None, :])


def value_relation_kl(student_values: TensorOrList, teacher_values: TensorOrList, attention_mask: Tensor | None) -> Tensor:
    """MiniLM value-relation transfer, eqs. 7-9: ``KL(VR^T || VR^S)``, ``VR = softmax(V V^T / sqrt(d_head))``.

    Inputs: per-head values (B, H, T, d_head) (``Captured.values``).  Each model uses its own d_head
    (student and teacher widths may differ) but head counts must match (ValueError).  Padded keys
    are masked out of the softmax; averaged over heads and valid queries per sequence, then batch.
    """
    total = None
    for i, (s, t) in enumerate(as_pairs(student_values, teacher_values, "value_relation_kl")):
        check_heads(s, t, "value_relation_kl", i)
        valid = token_mask(attention_mask, s.shape[0], s.shape[2], s.device, "value_relation_kl")
        loss = _relation_kl_heads(s, t, valid)
        total = loss if total is None else total + loss
    return total


@register_term("value_relation_kl", levels=("intermediate",), features=(("values", "attention"),), head_wise=True,
          paper="MiniLM eqs. 7-9")
def _value_relation_term(batch: Batch) -> Tensor:
    return value_relation_kl(*batch.select("values", "attention"), batch.attention_mask)


def split_relation_heads(x: Tensor, n_relation_heads: int, what: str = "relation_kl") -> Tensor:
    """MiniLMv2 regrouping: (B, H, T, d_head) or (B, T, D) -> concat heads -> (B, R, T, D/R)."""
    if n_relation_heads <= 0:
        raise ValueError(f"{what}: n_relation_heads must be >= 1, got {n_relation_heads}")
    if x.dim() == 4:
        b, h, n, d = x.shape
        x = x.transpose(1, 2).reshape(b, n, h * d)
    elif x.dim() != 3:
        raise ValueError(f"{what}: expected (B,H,T,d_head) or (B,T,D), got {tuple(x.shape)}")
    b, n, width = x.shape
    if width % n_relation_heads:
        raise ValueError(f"{what}: width {width} is not divisible by n_relation_heads={n_relation_heads}")
    return x.reshape(b, n, n_relation_heads, width // n_relation_heads).transpose(1, 2)


def relation_kl(
    student_x: TensorOrList, teacher_x: TensorOrList, attention_mask: Tensor | None, n_relation_heads: int
) -> Tensor:
    """MiniLMv2 self-attention relation transfer with relation heads: ``KL(R^T || R^S)``.

    ``x`` is queries, keys or values of one layer, per head (B, H, T, d_head) or concatenated (B, T, D).
    Both models' heads are concatenated and re-split into ``n_relation_heads`` relation heads, so
    teacher and student head counts (and widths) may differ; ``R = softmax(X_r X_r^T / sqrt(d_r))``
    with d_r = D / n_relation_heads of each model.  Use with Q-Q, K-K and V-V pairs (one call each).
    Averaged over relation heads and valid queries per sequence, then batch; summed over lists.
    """
    total = None
    for i, (s, t) in enumerate(as_pairs(student_x, teacher_x, "relation_kl")):
        sr = split_relation_heads(s, n_relation_heads)
        tr = split_relation_heads(t, n_relation_heads)
        if sr.shape[0] != tr.shape[0] or sr.shape[2] != tr.shape[2]:
            raise ValueError(f"relation_kl: pair {i}: batch/length differ: {tuple(s.shape)} vs {tuple(t.shape)}")
        valid = token_mask(attention_mask, sr.shape[0], sr.shape[2], sr.device, "relation_kl")
        loss = _relation_kl_heads(sr, tr, valid)
        total = loss if total is None else total + loss
    return total


@register_term("relation_kl", levels=("intermediate",),
          features=(("queries", "attention"), ("keys", "attention"), ("values", "attention")),
          paper="MiniLMv2 (Q-Q, K-K and V-V relations)")
def _relation_term(batch: Batch) -> Tensor:
    """The Q-Q, K-K and V-V relation KLs, summed."""
    return sum(
        relation_kl(*batch.select(kind, "attention"), batch.attention_mask, batch.options.n_relation_heads)
        for kind in ("queries", "keys", "values")
    )

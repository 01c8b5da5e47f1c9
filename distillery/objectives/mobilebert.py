"""MobileBERT objectives (Sun et al., 2020, "MobileBERT: a Compact Task-Agnostic BERT ...").

* eq. 2 feature-map transfer: L_FMT = 1/(TN) sum_t sum_n (H^tr_{t,n} - H^st_{t,n})^2
* eq. 3 attention transfer:   L_AT  = 1/(TA) sum_t sum_a KL(a^tr_{t,a} || a^st_{t,a})
* eq. 4 pre-training distillation: L_PD = alpha L_MLM + (1 - alpha) L_KD + L_NSP
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ._common import TensorOrList, as_pairs, check_heads, check_same_shape, per_sequence_mean, token_mask
from .minilm import attention_kl
from .registry import Batch, register_term

#: Official relative weights (beta/hidden = 5000/100, gamma/hidden = 5/100) of the statistics terms.
OFFICIAL_MEAN_VAR_WEIGHT = (50.0, 0.05)


def _layer_norm_no_params(x: Tensor, eps: float) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def feature_map_loss(
    s: TensorOrList,
    t: TensorOrList,
    attention_mask: Tensor | None,
    *,
    normalized: bool = False,
    mean_var_weight: float | tuple[float, float] = OFFICIAL_MEAN_VAR_WEIGHT,
    eps: float = 1e-3,
) -> Tensor:
    """Feature-map transfer, eq. 2: MSE between student and teacher block outputs (B, T, N), summed over layers.

    Default: per sequence ``1/(T N) sum (H^tr - H^st)^2`` over its T valid tokens, averaged over the batch.
    ``normalized=True`` is the official decomposition ("normalised feature map discrepancy and
    feature map statistics discrepancy"): MSE between parameter-free layer-normalised maps
    (eps 1e-3, the Keras default of the official code) + ``beta * (mu^st - mu^tr)^2`` +
    ``gamma * |sigma2^st - sigma2^tr|`` with per-token mean/variance over the feature axis, each term
    averaged over valid tokens.  ``mean_var_weight=(beta, gamma)`` (a float sets both) defaults to the
    official ratios 5000/100 and 5/100 relative to the normalised term; give the objective weight 100
    to reproduce the official totals.  The official code also averages over padded tokens; we do not.
    """
    if isinstance(mean_var_weight, (int, float)):
        beta = gamma = float(mean_var_weight)
    else:
        beta, gamma = (float(w) for w in mean_var_weight)
    total = None
    for i, (a, b) in enumerate(as_pairs(s, t, "feature_map_loss")):
        check_same_shape(a, b, "feature_map_loss", i)
        if a.dim() != 3:
            raise ValueError(f"feature_map_loss: pair {i}: expected (B, T, N) feature maps, got {tuple(a.shape)}")
        b = b.to(a.dtype)
        valid = token_mask(attention_mask, a.shape[0], a.shape[1], a.device, "feature_map_loss")
        if not normalized:
            loss = per_sequence_mean((a - b) ** 2, valid[:, :, None])
        else:
            loss = per_sequence_mean(
                (_layer_norm_no_params(a, eps) - _layer_norm_no_params(b, eps)) ** 2, valid[:, :, None]
            )
            if beta:
                loss = loss + beta * per_sequence_mean((a.mean(-1) - b.mean(-1)) ** 2, valid)
            if gamma:
                var_diff = (a.var(-1, unbiased=False) - b.var(-1, unbiased=False)).abs()
                loss = loss + gamma * per_sequence_mean(var_diff, valid)
        total = loss if total is None else total + loss
    return total


@register_term("feature_map_loss", levels=("intermediate", "pretraining"), features=(("hidden", "states"),),
          paper="MobileBERT eq. 2")
def _feature_map_term(batch: Batch) -> Tensor:
    return feature_map_loss(*batch.select("hidden", "states"), batch.attention_mask,
                            normalized=batch.options.feature_map_normalized)


def attention_transfer_loss(s_probs: TensorOrList, t_probs: TensorOrList, attention_mask: Tensor | None) -> Tensor:
    """Attention transfer, eq. 3: ``KL(a^tr || a^st)`` per head and query, summed over layers.

    Inputs: post-softmax attention (B, A, T, T) with padded keys at 0; head counts must match.
    Averaged over heads and valid queries per sequence (the 1/(TA)), then over the batch.
    The official code uses the cross-entropy ``-sum a^tr log a^st`` (KL + the teacher's entropy, a
    constant: same gradients) averaged over all query rows, padded ones included.
    """
    for i, (a, b) in enumerate(as_pairs(s_probs, t_probs, "attention_transfer_loss")):
        check_heads(a, b, "attention_transfer_loss", i)
    return attention_kl(s_probs, t_probs, attention_mask)


@register_term("attention_transfer_loss", levels=("intermediate", "pretraining"), features=(("probs", "attention"),),
          head_wise=True, paper="MobileBERT eq. 3")
def _attention_transfer_term(batch: Batch) -> Tensor:
    return attention_transfer_loss(*batch.select("probs", "attention"), batch.attention_mask)


def pretraining_distillation_loss(
    mlm_logits_s: Tensor,
    mlm_logits_t: Tensor,
    mlm_labels: Tensor,
    alpha: float,
    nsp_logits: Tensor | None = None,
    nsp_labels: Tensor | None = None,
    *,
    temperature: float = 1.0,
) -> Tensor:
    """Pre-training distillation, eq. 4: ``alpha L_MLM + (1 - alpha) L_KD (+ L_NSP)``.

    Over the masked positions (``mlm_labels != -100``), averaged over them:
    L_MLM = CE(student, gold token); L_KD = soft cross-entropy ``-sum_v p^T_v log p^S_v`` with
    p = softmax(logits / temperature) (= KL(p^T || p^S) + H(p^T): same gradients as KL).  With
    temperature 1 this equals the official code's single CE against the mixed target
    ``alpha * onehot + (1 - alpha) * p^T`` (distill_ground_truth_ratio = alpha = 0.5).
    L_NSP = CE(nsp_logits, nsp_labels) averaged over the batch, added only when ``nsp_logits`` is given.
    With no masked position the MLM/KD terms are 0 (not NaN).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"pretraining_distillation_loss: alpha must be in [0, 1], got {alpha}")
    if temperature <= 0:
        raise ValueError(f"pretraining_distillation_loss: temperature must be > 0, got {temperature}")
    if mlm_logits_s.shape != mlm_logits_t.shape:
        raise ValueError(
            f"pretraining_distillation_loss: student MLM logits {tuple(mlm_logits_s.shape)} != "
            f"teacher {tuple(mlm_logits_t.shape)}"
        )
    if mlm_labels.shape != mlm_logits_s.shape[:-1]:
        raise ValueError(
            f"pretraining_distillation_loss: mlm_labels shape {tuple(mlm_labels.shape)} does not match "
            f"logits {tuple(mlm_logits_s.shape)}"
        )
    sel = mlm_labels != -100
    s = mlm_logits_s[sel]
    if s.shape[0] == 0:
        loss = mlm_logits_s.sum() * 0.0
    else:
        tt = mlm_logits_t.detach()[sel].to(s.dtype)
        mlm = F.cross_entropy(s, mlm_labels[sel])
        kd = -(F.softmax(tt / temperature, -1) * F.log_softmax(s / temperature, -1)).sum(-1).mean()
        loss = alpha * mlm + (1.0 - alpha) * kd
    if nsp_logits is not None:
        if nsp_labels is None:
            raise ValueError("pretraining_distillation_loss: nsp_logits given without nsp_labels")
        loss = loss + F.cross_entropy(nsp_logits, nsp_labels)
    return loss


@register_term("pretraining_distillation_loss", levels=("pretraining",), teacher_logits=True, paper="MobileBERT eq. 4")
def _pretraining_distillation_term(batch: Batch) -> Tensor:
    """Eq. 4 on the MLM logits (alpha = ``options.mlm_alpha``), + NSP when the student has an NSP head and the batch
    NSP labels."""
    if batch.labels is None:
        raise ValueError("pretraining_distillation_loss needs masked-LM labels (a masking collator)")
    nsp = batch.nsp_logits is not None and batch.nsp_labels is not None
    return pretraining_distillation_loss(batch.student_logits, batch.teacher_logits, batch.labels,
                                         batch.options.mlm_alpha, batch.nsp_logits if nsp else None,
                                         batch.nsp_labels if nsp else None)

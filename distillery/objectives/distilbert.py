"""DistilBERT objectives (Sanh et al., 2019, "DistilBERT, a distilled version of BERT").

L = a_ce L_ce + a_mlm L_mlm + a_cos L_cos  (published run: 5.0 / 2.0 / 1.0, T = 2)

* L_ce  = T^2 * 1/N sum_i KL(softmax(t_i/T) || softmax(s_i/T)) over the N non-pad tokens i
* L_mlm = 1/|M| sum_{i in M} -log softmax(s_i)_{y_i} over masked positions M (labels != -100)
* L_cos = 1/N sum_i (1 - cos(h^S_i, h^T_i)) over non-pad tokens (CosineEmbeddingLoss, target 1)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .registry import Batch, register_term


def _select_tokens(x: Tensor, attention_mask: Tensor | None, what: str) -> Tensor:
    """(B, T, D) -> (N, D) rows of non-pad tokens; (B, D) passes through when attention_mask is None."""
    if attention_mask is None:
        return x.reshape(-1, x.shape[-1])
    if attention_mask.shape != x.shape[:-1]:
        raise ValueError(f"{what}: attention_mask shape {tuple(attention_mask.shape)} != {tuple(x.shape[:-1])}")
    return x[attention_mask.to(x.device) != 0]


def soft_target_loss(
    s_logits: Tensor, t_logits: Tensor, attention_mask: Tensor | None, temperature: float = 2.0
) -> Tensor:
    """Distillation loss L_ce: ``KL(softmax(t/T) || softmax(s/T)) * T^2``, "batchmean" over non-pad tokens.

    Logits (B, T, V) are flattened to tokens x vocab and the rows with ``attention_mask == 1`` kept,
    exactly as the official distiller (``restrict_ce_to_mask=False``).  Also accepts (B, C) logits
    with ``attention_mask=None`` (sequence-level distillation).
    """
    if temperature <= 0:
        raise ValueError(f"soft_target_loss: temperature must be > 0, got {temperature}")
    if s_logits.shape != t_logits.shape:
        raise ValueError(f"soft_target_loss: student logits {tuple(s_logits.shape)} != teacher {tuple(t_logits.shape)}")
    s = _select_tokens(s_logits, attention_mask, "soft_target_loss")
    t = _select_tokens(t_logits.detach(), attention_mask, "soft_target_loss").to(s.dtype)
    if s.shape[0] == 0:
        return s_logits.sum() * 0.0
    kl = F.kl_div(F.log_softmax(s / temperature, -1), F.log_softmax(t / temperature, -1), reduction="batchmean", log_target=True)
    return kl * temperature**2


@register_term("soft_target_loss", levels=("pretraining",), teacher_logits=True, paper="DistilBERT L_ce")
def _soft_target_term(batch: Batch) -> Tensor:
    return soft_target_loss(batch.student_logits, batch.teacher_logits, batch.attention_mask, batch.options.temperature)


def mlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Masked-LM loss L_mlm: cross-entropy averaged over positions where ``labels != -100``.

    Returns 0 (connected to the graph) when no position is masked, instead of NaN.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"mlm_loss: labels shape {tuple(labels.shape)} does not match logits {tuple(logits.shape)}")
    if not bool((labels != -100).any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


@register_term("mlm_loss", levels=("pretraining",), paper="DistilBERT L_mlm")
def _mlm_term(batch: Batch) -> Tensor:
    if batch.labels is None:
        raise ValueError("mlm_loss needs masked-LM labels (a masking collator)")
    return mlm_loss(batch.student_logits, batch.labels)


def cosine_loss(s_hidden: Tensor, t_hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Cosine embedding loss L_cos (target 1): mean over non-pad tokens of ``1 - cos(h^S, h^T)``.

    Uses the last-layer hidden states (B, T, D); student and teacher widths must be equal (ValueError).
    """
    if s_hidden.shape != t_hidden.shape:
        raise ValueError(
            f"cosine_loss: student hidden {tuple(s_hidden.shape)} != teacher hidden {tuple(t_hidden.shape)} "
            "(the cosine loss needs equal hidden sizes)"
        )
    s = _select_tokens(s_hidden, attention_mask, "cosine_loss")
    t = _select_tokens(t_hidden.detach(), attention_mask, "cosine_loss").to(s.dtype)
    if s.shape[0] == 0:
        return s_hidden.sum() * 0.0
    target = torch.ones(s.shape[0], dtype=s.dtype, device=s.device)
    return F.cosine_embedding_loss(s, t, target, reduction="mean")


@register_term("cosine_loss", levels=("pretraining",), features=(("hidden", "states"),), paper="DistilBERT L_cos")
def _cosine_term(batch: Batch) -> Tensor:
    """L_cos on the hidden-state pairs of the layer map after the embedding (DistilBERT: the last layers,
    ``LayerMap(hidden=((n_student, n_teacher),))``), summed over pairs."""
    pairs = batch.pairs("states")
    if not pairs:
        raise ValueError("cosine_loss reads hidden states: the layer map has no hidden pair after the embedding "
                         "(DistilBERT: LayerMap(hidden=((n_student_layers, n_teacher_layers),)))")
    total = None
    for s, t in pairs:
        loss = cosine_loss(batch.student.hidden[s], batch.teacher.hidden[t], batch.attention_mask)
        total = loss if total is None else total + loss
    return total

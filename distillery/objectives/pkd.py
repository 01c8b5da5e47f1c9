"""BERT-PKD (Sun et al., EMNLP 2019, "Patient Knowledge Distillation for BERT Model Compression", Sec. 3):

    L_PKD = (1 - alpha) L_CE + alpha L_DS + beta L_PT

L_CE: the student's cross-entropy with the gold labels (eq. 2; MSE for a one-output regression head).
L_DS: cross-entropy with the teacher's softened distribution at temperature T (eq. 1) -- TinyBERT's
      ``prediction_loss`` at temperature T, registered there.
L_PT: the patient loss (eq. 4), over the student's intermediate layers j and the teacher layers I_pt(j) they learn
      from (PKD-Skip / PKD-Last), on the [CLS] hidden state of each:

      L_PT = sum_j || h_s,j / ||h_s,j||_2 - h_t,I_pt(j) / ||h_t,I_pt(j)||_2 ||_2^2

      averaged over the batch (the paper sums over the N training examples; a batch mean is its stochastic
      estimate, as every other loss here). ``reduction="official"``: the official code's ``F.mse_loss`` of the
      normalised states, a mean over the batch, the layers and the hidden dimension (the paper's value / (M d)).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from distillery.objectives._common import gold_rows, masked_log_softmax, real_classes
from distillery.objectives.registry import Batch, register_term

__all__ = ["hard_label_loss", "patient_loss"]


def patient_loss(student_cls: Sequence[Tensor], teacher_cls: Sequence[Tensor],
                 reduction: Literal["paper", "official"] = "paper") -> Tensor:
    """L_PT over mapped layers: lists of (B, d) [CLS] states, student and teacher, in layer-map order."""
    if len(student_cls) != len(teacher_cls) or not student_cls:
        raise ValueError(f"patient_loss: {len(student_cls)} student and {len(teacher_cls)} teacher states; give one "
                         "teacher state per mapped student layer (at least one)")
    s = F.normalize(torch.stack(list(student_cls), dim=1), p=2, dim=-1)           # (B, M, d)
    t = F.normalize(torch.stack(list(teacher_cls), dim=1).detach(), p=2, dim=-1)
    if s.shape != t.shape:
        raise ValueError(f"patient_loss: student states {tuple(s.shape)} vs teacher {tuple(t.shape)}: BERT-PKD "
                         "compares hidden states of equal width (no projection)")
    squared = (s - t).pow(2)
    if reduction == "official":
        return squared.mean()
    if reduction != "paper":
        raise ValueError(f"reduction must be 'paper' or 'official', got {reduction!r}")
    return squared.sum(dim=(1, 2)).mean()


def hard_label_loss(logits: Tensor, labels: Tensor, mask: Tensor | None = None) -> Tensor:
    """L_CE: cross-entropy with the gold labels (MSE with the gold score for a one-output head). Span logits
    (B, 2, tokens) with (B, 2) gold positions: the mean of the start and the end cross-entropy, as a
    `*ForQuestionAnswering` model's own loss, with ``mask`` (True = a real token, broadcastable to the logits) over
    the real tokens only (padding out of the softmax). Rows without a gold label (unlabelled text the teacher labels,
    `distillery.unlabeled`) are left out: the mean over the labelled rows, 0 for a batch of none."""
    gold = gold_rows(labels)
    if gold.dim() == 1 and not bool(gold.all()):
        if not bool(gold.any()):
            return logits.sum() * 0.0
        logits, labels = logits[gold], labels[gold]
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
    if mask is not None:
        real = real_classes(mask, logits, "hard_label_loss")
        if not bool(real.gather(-1, labels.unsqueeze(-1).to(real.device)).all()):
            raise ValueError("hard_label_loss: a gold position is a padded token")
        logp = masked_log_softmax(logits, real)
        return F.nll_loss(logp.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


@register_term("patient_loss", levels=("prediction",), features=(("hidden", "states"),), paper="BERT-PKD eq. 4")
def _patient(b: Batch) -> Tensor:
    pairs = b.pairs("states")
    student = [h[:, 0] for h in b.student.select("hidden", [s for s, _ in pairs])]
    teacher = [h[:, 0] for h in b.teacher.select("hidden", [t for _, t in pairs])]
    return patient_loss(student, teacher, b.options.extra.get("patient_reduction", "paper"))


@register_term("hard_label_loss", levels=("prediction",), paper="BERT-PKD eq. 2")
def _hard_label(b: Batch) -> Tensor:
    if b.labels is None:
        raise ValueError("hard_label_loss needs the gold labels of the batch")
    return hard_label_loss(b.student_logits, b.labels, b.logit_mask)

"""TinyBERT objectives (Jiao et al., 2020, "TinyBERT: Distilling BERT for Natural Language Understanding").

Equations (paper numbering):

* eq. 7  attention:  L_attn = 1/h sum_i MSE(A_i^S, A_i^T), A = QK^T / sqrt(d_k) (pre-softmax scores)
* eq. 8  hidden:     L_hidn = MSE(H^S W_h, H^T)
* eq. 9  embedding:  L_embd = MSE(E^S W_e, E^T)
* eq. 10 prediction: L_pred = CE(z^T / t, z^S / t) = -sum_c softmax(z^T/t)_c log softmax(z^S/t)_c

Defaults follow the official code where it only changes bookkeeping (see each docstring), and
the paper where the official code changes the result; both are selectable.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distillery.precision import fp32

from ._common import (TensorOrList, as_pairs, check_heads, gold_rows, masked_log_softmax, per_sequence_mean, real_classes,
                      token_mask)
from .registry import Batch, LossOptions, ObjectiveConfigError, register_term

#: Additive padding mask value of the official code, and the threshold below which scores are zeroed.
OFFICIAL_MASK_VALUE = -10000.0
OFFICIAL_ZERO_THRESHOLD = -100.0


#: elements of the (B, H, T, T) scores the official attention loss reads at a time on a CPU (1 MiB of float32): the
#: masking, the difference, its square and its gradient run on a slice while it is in the cache. On a GPU the whole
#: tensor is one slice: there each slice costs a handful of kernel launches, and many slices bind the step to the host
CHUNK = 1 << 18


class _OfficialScoreMSE(torch.autograd.Function):
    """MSE(official(s), official(t)) for student scores `s` and teacher scores `t` (B, H, T, T), `offset` (B, 1, 1, T):
    official(x) is x + offset (0, or OFFICIAL_MASK_VALUE on padded keys) with entries at or below
    OFFICIAL_ZERO_THRESHOLD set to 0, which is `torch.nn.functional.threshold`. Slice by slice of `CHUNK` elements (on a
    CPU; one slice elsewhere): each slice in float32 (float64 stays float64; bf16 scores, as bf16 autocast captures
    them, are read a slice at a time, so no float32 copy of the whole tensor is made), its difference, its sum of
    squares (a dot product) and its gradient, 2/N (official(s) - official(t)) where the student's entry is kept, which
    the forward saves in the scores' dtype; one read of `s` and `t` and one write, in a few elementwise kernels."""

    @staticmethod
    def forward(ctx, s: Tensor, offset: Tensor, t: Tensor) -> Tensor:
        b, h, n, _ = s.shape
        s, t = s.reshape(b * h, n, n), t.reshape(b * h, n, n)
        exact = torch.promote_types(s.dtype, torch.float32)
        offset = offset.to(exact).expand(b, h, 1, n).reshape(b * h, 1, n)
        masked_diff = torch.empty_like(s)
        step = max(1, CHUNK // (n * n)) if s.device.type == "cpu" else b * h
        total = torch.zeros((), dtype=exact, device=s.device)
        for i in range(0, b * h, step):
            sl = slice(i, i + step)
            shifted = s[sl].to(exact) + offset[sl]
            target = F.threshold_(t[sl].to(exact) + offset[sl], OFFICIAL_ZERO_THRESHOLD, 0.0)
            diff = F.threshold(shifted, OFFICIAL_ZERO_THRESHOLD, 0.0).sub_(target)
            flat = diff.view(-1)
            total += torch.dot(flat, flat)
            torch.ops.aten.threshold_backward.grad_input(diff, shifted, OFFICIAL_ZERO_THRESHOLD,
                                                        grad_input=masked_diff[sl])  # rounded to the scores' dtype
        ctx.scale, ctx.shape = 2.0 / s.numel(), (b, h, n, n)
        ctx.save_for_backward(masked_diff)
        return total / s.numel()

    @staticmethod
    def backward(ctx, grad: Tensor):
        (masked_diff,) = ctx.saved_tensors
        return (masked_diff * (grad * ctx.scale)).view(ctx.shape), None, None


def attention_loss(
    student_scores: TensorOrList,
    teacher_scores: TensorOrList,
    attention_mask: Tensor | None,
    *,
    official_masking: bool = True,
) -> Tensor:
    """TinyBERT attention loss, eq. 7, summed over the mapped layers.

    Inputs are lists over mapped layers of pre-softmax scores ``QK^T/sqrt(d_head)`` of shape
    (B, H, T, T) WITHOUT the padding mask (as returned by ``distillery.capture``); student and
    teacher must have the same number of heads (ValueError otherwise).

    ``official_masking=True`` (default) reproduces the official code exactly: add the additive mask
    (-10000 on padded keys) to both score tensors, then replace every entry <= -100 by 0 in both, so
    padded keys contribute 0 (and so does any genuine score <= -100); the MSE is the mean over batch,
    heads, query and key positions (padded query rows included), and the per-layer losses are
    SUMMED over mapped layers.  Because padded entries are 0 for both models, this is the paper's
    MSE diluted by the padding fraction of the batch.

    ``official_masking=False`` is the paper's intent on padded batches: per sequence, the MSE over
    valid (query, key) pairs only, averaged over heads, then averaged over the batch; summed over layers.
    """
    pairs = as_pairs(student_scores, teacher_scores, "attention_loss")
    total = None
    for i, (s, t) in enumerate(pairs):
        check_heads(s, t, "attention_loss", i)
        if s.shape[-1] != t.shape[-1] or s.shape[-1] != s.shape[-2]:
            raise ValueError(f"attention_loss: pair {i}: scores must be (B,H,T,T), got {tuple(s.shape)} / {tuple(t.shape)}")
        b, _, n, _ = s.shape
        valid = token_mask(attention_mask, b, n, s.device, "attention_loss")
        if official_masking:  # bf16 scores read in float32 a slice at a time
            offset = (~valid[:, None, None, :]).to(torch.promote_types(s.dtype, torch.float32)) * OFFICIAL_MASK_VALUE
            loss = _OfficialScoreMSE.apply(s, offset, t)
        else:
            s = fp32(s)
            t = fp32(t).to(s.dtype)
            pair_valid = valid[:, None, :, None] & valid[:, None, None, :]
            loss = per_sequence_mean((s - t) ** 2, pair_valid)
        total = loss if total is None else total + loss
    return total


@register_term("attention_loss", levels=("intermediate",), features=(("scores", "attention"),), head_wise=True,
          paper="TinyBERT eq. 7")
def _attention_term(batch: Batch) -> Tensor:
    s, t = batch.select("scores", "attention")
    return attention_loss(s, t, batch.attention_mask, official_masking=batch.options.official_attention_masking)


class HiddenProjection(nn.Module):
    """Learnable W_h / W_e of eqs. 8-9 mapping student width to teacher width.

    ``shared=True`` (default, as the official ``fit_dense``): one ``Linear(d_student, d_teacher)`` used
    for every mapped state, the embedding output included.  ``shared=False``: one Linear per mapped
    state (``n_states`` of them, index 0 = embedding state).  Call as ``proj(x, index)``.
    These are distillation-only parameters: save them beside the student, never inside it.
    """

    def __init__(self, d_student: int, d_teacher: int, n_states: int = 1, shared: bool = True) -> None:
        super().__init__()
        if d_student <= 0 or d_teacher <= 0:
            raise ValueError(f"HiddenProjection: widths must be positive, got d_student={d_student}, d_teacher={d_teacher}")
        if not shared and n_states <= 0:
            raise ValueError(f"HiddenProjection: per-layer projections need n_states >= 1, got {n_states}")
        self.d_student, self.d_teacher, self.shared = d_student, d_teacher, shared
        self.n_states = 1 if shared else n_states
        self.layers = nn.ModuleList(nn.Linear(d_student, d_teacher) for _ in range(self.n_states))

    @classmethod
    def selecting(cls, channels: Tensor, d_teacher: int, n_states: int = 1, shared: bool = True) -> "HiddenProjection":
        """A projection that starts as the selection of a student pruned from the teacher: student channel j goes to
        teacher channel ``channels[j]``, the teacher's other channels to zero (bias zero). For a structurally pruned
        student the mapped states then start as the teacher's on the kept channels, and the loss first teaches the
        projection the dropped ones instead of moving the student (CoFi, Xia et al., 2022, Sec. 3.3: the layer-wise
        distillation's transformation starts as the identity)."""
        channels = torch.as_tensor(channels, dtype=torch.long)
        proj = cls(len(channels), d_teacher, n_states, shared)
        if len(set(channels.tolist())) != len(channels) or not all(0 <= int(c) < d_teacher for c in channels):
            raise ValueError(f"HiddenProjection.selecting: channels must be distinct teacher channels < {d_teacher}")
        with torch.no_grad():
            for layer in proj.layers:
                layer.weight.zero_()
                layer.bias.zero_()
                layer.weight[channels, torch.arange(len(channels))] = 1.0
        return proj

    def forward(self, x: Tensor, index: int = 0) -> Tensor:
        if self.shared:
            return self.layers[0](x)
        if not 0 <= index < self.n_states:
            raise IndexError(f"HiddenProjection: state index {index} out of range for {self.n_states} per-layer projections")
        return self.layers[index](x)

    def extra_repr(self) -> str:
        return f"d_student={self.d_student}, d_teacher={self.d_teacher}, shared={self.shared}, n_states={self.n_states}"


Projection = Callable[[Tensor, int], Tensor]


def _project(x: Tensor, target: Tensor, projection: Projection | None, index: int, what: str) -> Tensor:
    y = x if projection is None else projection(x, index)
    if y.shape != target.shape:
        raise ValueError(
            f"{what}: state {index}: projected student shape {tuple(y.shape)} != teacher shape {tuple(target.shape)}"
            + (" (pass a HiddenProjection when widths differ)" if projection is None else "")
        )
    return y


def hidden_loss(
    student_states: TensorOrList,
    teacher_states: TensorOrList,
    projection: Projection | None,
    *,
    indices: Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """TinyBERT hidden-state loss, eq. 8 (and eq. 9 for state 0), summed over mapped states.

    ``MSE(proj(H^S_m, m), H^T_{g(m)})`` with mean over batch, positions and features (padded
    positions included, as in the paper and the official code), summed over the list.  ``indices``
    gives the projection index of each list entry (default 0..n-1; pass e.g. 1..M when the embedding
    state is handled by ``embedding_loss``).  ``projection=None`` means identity (equal widths).
    With ``attention_mask`` the mean is per sequence over valid tokens only (not the default).
    """
    pairs = as_pairs(student_states, teacher_states, "hidden_loss")
    idx = list(range(len(pairs))) if indices is None else list(indices)
    if len(idx) != len(pairs):
        raise ValueError(f"hidden_loss: {len(idx)} indices for {len(pairs)} state pairs")
    total = None
    for k, (s, t) in zip(idx, pairs):
        y = _project(s, t, projection, k, "hidden_loss")
        t = t.to(y.dtype)
        if attention_mask is None:
            loss = F.mse_loss(y, t)
        else:
            valid = token_mask(attention_mask, y.shape[0], y.shape[1], y.device, "hidden_loss")
            loss = per_sequence_mean((y - t) ** 2, valid[:, :, None])
        total = loss if total is None else total + loss
    return total


def embedding_loss(s_emb: Tensor, t_emb: Tensor, projection: Projection | None, *, index: int = 0) -> Tensor:
    """TinyBERT embedding loss, eq. 9: ``MSE(E^S W_e, E^T)`` (mean over batch, positions, features).

    The official code computes it as the index-0 term of the hidden loss with the shared projection;
    this function is that term alone (projection index ``index``, 0 by default).
    """
    return hidden_loss([s_emb], [t_emb], projection, indices=[index])


def _indexed_states(batch: Batch, embedding: bool) -> list[tuple[int, tuple[int, int]]]:
    """(projection index, pair) of the hidden pairs after (or of) the embedding: the index of a pair is its position
    in ``layer_map.hidden`` (one Linear per mapped state with per-layer projections)."""
    return [(i, p) for i, p in enumerate(batch.layer_map.hidden) if (p[0] == 0) == embedding]


@register_term("hidden_loss", levels=("intermediate",), features=(("hidden", "states"),), projection=True,
          paper="TinyBERT eq. 8")
def _hidden_term(batch: Batch) -> Tensor:
    states = _indexed_states(batch, embedding=False)
    return hidden_loss(
        batch.student.select("hidden", [p[0] for _, p in states]),
        batch.teacher.select("hidden", [p[1] for _, p in states]),
        batch.projection,
        indices=[i for i, _ in states],
    )


@register_term("embedding_loss", levels=("intermediate",), features=(("hidden", "embedding"),), projection=True,
          paper="TinyBERT eq. 9")
def _embedding_term(batch: Batch) -> Tensor:
    emb = _indexed_states(batch, embedding=True)
    if not emb:
        raise ObjectiveConfigError("embedding_loss is active but the layer map has no embedding pair (0, 0)")
    i, (s0, t0) = emb[0]
    return embedding_loss(batch.student.hidden[s0], batch.teacher.hidden[t0], batch.projection, index=i)


def prediction_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    *,
    reduction: Literal["paper", "official"] = "paper",
    scale_by_t2: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """TinyBERT prediction loss, eq. 10: soft cross-entropy ``-sum_c softmax(z^T/t)_c log softmax(z^S/t)_c``.

    ``reduction="paper"``: sum over classes, mean over the rows (the usual CE).
    ``reduction="official"``: mean over rows AND classes, as the official code (1/C of the paper's
    value; same optimum, gradients scaled by 1/C).
    No T^2 factor by default (neither the paper nor the official code has one; T = 1 there);
    ``scale_by_t2=True`` multiplies by t^2 (Hinton et al.) to keep gradient scale when t != 1.
    Logits may be (B, C) or (..., C); the class axis is last.

    ``mask`` (bool, broadcastable to the logits; True = a real class): the classes of a row are its real ones only.
    Span logits (B, 2, T) give the batch's real tokens, so a padded position is out of both softmaxes (the teacher's
    and the student's) and an example's loss does not depend on how far its batch was padded; ``"official"`` then
    divides each row by its own number of real positions.
    """
    if temperature <= 0:
        raise ValueError(f"prediction_loss: temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"prediction_loss: student logits {tuple(student_logits.shape)} != teacher logits {tuple(teacher_logits.shape)}"
        )
    if reduction not in ("paper", "official"):
        raise ValueError(f"prediction_loss: unknown reduction {reduction!r}; expected 'paper' or 'official'")
    t = teacher_logits.detach().to(student_logits.dtype) / temperature
    s = student_logits / temperature
    if mask is None:
        ce = -(F.softmax(t, dim=-1) * F.log_softmax(s, dim=-1))
        loss = ce.sum(-1).mean() if reduction == "paper" else ce.mean()
    else:
        real = real_classes(mask, s, "prediction_loss")
        ce = -(F.softmax(t.masked_fill(~real, float("-inf")), dim=-1) * masked_log_softmax(s, real))
        per_row = ce.sum(-1) if reduction == "paper" else ce.sum(-1) / real.sum(-1)
        loss = per_row.mean()
    return loss * temperature**2 if scale_by_t2 else loss


def regression_prediction_loss(
    student_pred: Tensor,
    teacher_pred: Tensor | None = None,
    gold: Tensor | None = None,
    *,
    target: Literal["teacher", "gold"] = "teacher",
) -> Tensor:
    """Prediction-layer loss for regression tasks (STS-B): ``MSE(y^S, y^T)`` or ``MSE(y^S, y_gold)``.

    ``target="teacher"`` (default) distils the teacher's prediction, the paper's prediction-layer
    distillation applied to a regression head.  ``target="gold"`` is the official code's behaviour
    (the teacher is ignored at this stage).  Predictions of shape (B, 1) are squeezed to (B,).
    """
    if target == "teacher":
        ref, name = teacher_pred, "teacher_pred"
    elif target == "gold":
        ref, name = gold, "gold"
    else:
        raise ValueError(f"regression_prediction_loss: unknown target {target!r}; expected 'teacher' or 'gold'")
    if ref is None:
        raise ValueError(f"regression_prediction_loss: target={target!r} needs {name}")
    s = student_pred.squeeze(-1) if student_pred.dim() > 1 and student_pred.shape[-1] == 1 else student_pred
    r = ref.detach()
    r = r.squeeze(-1) if r.dim() > 1 and r.shape[-1] == 1 else r
    if s.shape != r.shape:
        raise ValueError(f"regression_prediction_loss: student {tuple(s.shape)} != {name} {tuple(r.shape)}")
    if target == "gold" and not bool((keep := gold_rows(r)).all()):  # unlabelled rows (`distillery.unlabeled`)
        return F.mse_loss(s[keep], r[keep].to(s.dtype)) if bool(keep.any()) else s.sum() * 0.0
    return F.mse_loss(s, r.to(s.dtype))


def _gold_regression(options: LossOptions, student) -> bool:
    return options.regression_target == "gold" and student.config.num_labels == 1


@register_term("prediction_loss", levels=("prediction",), teacher_logits=lambda o, s: not _gold_regression(o, s),
          paper="TinyBERT eq. 10")
def _prediction_term(batch: Batch) -> Tensor:
    """Soft cross-entropy (eq. 10) on a classification head; on a one-output (regression) head the MSE of
    ``regression_prediction_loss`` against the teacher or gold (``options.regression_target``)."""
    if batch.student_logits.shape[-1] == 1:
        return regression_prediction_loss(batch.student_logits, batch.teacher_logits, batch.labels,
                                          target=batch.options.regression_target)
    if batch.teacher_logits is None:
        raise ValueError("prediction_loss needs teacher logits (teacher forward or a teacher_logits column)")
    return prediction_loss(batch.student_logits, batch.teacher_logits, batch.options.temperature,
                           reduction=batch.options.prediction_reduction, mask=batch.logit_mask)


@register_term("regression_prediction_loss", levels=("prediction",),
          teacher_logits=lambda o, s: o.regression_target != "gold", paper="TinyBERT eq. 10 on a regression head")
def _regression_prediction_term(batch: Batch) -> Tensor:
    if batch.student_logits.shape[-1] != 1:
        raise ObjectiveConfigError(
            f"regression_prediction_loss needs a one-output (regression) head, the student has "
            f"{batch.student_logits.shape[-1]} outputs (use prediction_loss)")
    return regression_prediction_loss(batch.student_logits, batch.teacher_logits, batch.labels,
                                      target=batch.options.regression_target)

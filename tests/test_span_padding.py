"""Span losses see only real tokens (issue 43, item 1): the same example's loss is the same, to float64 round-off,
whether its batch is padded to its own length or far past it, at T = 1, 2 and 10.

The terms on span logits (B, 2, T): TinyBERT eq. 10 (also DistilBERT's extra step and BERT-PKD's L_DS, at their
temperature), the gold cross-entropy (BERT-PKD's L_CE) and the official reduction (a mean over the real positions).
Each is checked against an independent float64 loop over the real positions, and end to end through the `Distiller`
with float64 span models.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from distillery.layer_map import LayerMap
from distillery.objectives import prediction_loss
from distillery.objectives.pkd import hard_label_loss
from distillery.objectives.registry import LossOptions
from distillery.training.distill import Distiller
from distillery.training.spec import DistillSpec

REAL, WIDE = 171, 384


def eq10_by_hand(s: list[list[float]], t: list[list[float]], temp: float, reduction: str) -> float:
    """-sum_i softmax(t/T)_i log softmax(s/T)_i over the real positions i, for the start row and the end row,
    averaged (``official``: each row's sum divided by its number of positions first)."""
    rows = []
    for s_row, t_row in zip(s, t):
        zs = math.log(sum(math.exp(v / temp) for v in s_row))
        zt = sum(math.exp(v / temp) for v in t_row)
        ce = -sum(math.exp(tv / temp) / zt * (sv / temp - zs) for sv, tv in zip(s_row, t_row))
        rows.append(ce / len(s_row) if reduction == "official" else ce)
    return sum(rows) / len(rows)


def one_example(width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(student, teacher) span logits (1, 2, width) of one example with REAL real tokens and its (1, width) mask;
    pads as a batch would give them: the teacher near -8, the student anything."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, 2, WIDE, generator=g, dtype=torch.float64) * 3
    t = torch.randn(1, 2, WIDE, generator=g, dtype=torch.float64) * 4
    t[..., REAL:] = -8.0
    mask = torch.zeros(1, WIDE, dtype=torch.long)
    mask[:, :REAL] = 1
    return s[..., :width], t[..., :width], mask[:, :width]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 10.0])
@pytest.mark.parametrize("reduction", ["paper", "official"])
def test_eq10_on_span_logits_ignores_padding(temperature, reduction):
    s_short, t_short, m_short = one_example(REAL)
    s_long, t_long, m_long = one_example(WIDE)
    expected = eq10_by_hand(s_short[0].tolist(), t_short[0].tolist(), temperature, reduction)
    short = prediction_loss(s_short, t_short, temperature, reduction=reduction, mask=m_short[:, None, :])
    long = prediction_loss(s_long, t_long, temperature, reduction=reduction, mask=m_long[:, None, :])
    assert short.item() == pytest.approx(expected, rel=1e-12)
    assert long.item() == pytest.approx(expected, rel=1e-12)
    # what an unmasked softmax does to the same example: it depends on the batch's width
    unmasked = prediction_loss(s_long, t_long, temperature, reduction=reduction)
    assert abs(unmasked.item() / expected - 1) > 1e-3


def test_the_gradient_never_reaches_padding():
    s, t, m = one_example(WIDE)
    s.requires_grad_(True)
    prediction_loss(s, t, 10.0, mask=m[:, None, :]).backward()
    assert torch.isfinite(s.grad).all()
    assert s.grad[..., REAL:].abs().max().item() == 0.0
    assert s.grad[..., :REAL].abs().max().item() > 0.0


def test_gold_cross_entropy_ignores_padding():
    s_short, _, m_short = one_example(REAL)
    s_long, _, m_long = one_example(WIDE)
    gold = torch.tensor([[17, 23]])
    expected = sum(-(s_short[0, k, int(gold[0, k])].item() - math.log(sum(math.exp(v) for v in s_short[0, k].tolist())))
                   for k in range(2)) / 2
    assert hard_label_loss(s_short, gold, m_short[:, None, :]).item() == pytest.approx(expected, rel=1e-12)
    assert hard_label_loss(s_long, gold, m_long[:, None, :]).item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="padded token"):
        hard_label_loss(s_long, torch.tensor([[17, REAL + 5]]), m_long[:, None, :])


def test_a_mask_row_without_a_real_token_is_refused():
    s, t, _ = one_example(8)
    with pytest.raises(ValueError, match="no real class"):
        prediction_loss(s, t, mask=torch.zeros(1, 1, 8, dtype=torch.bool))


def qa_model(layers: int, hidden: int, seed: int) -> transformers.BertForQuestionAnswering:
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                                     intermediate_size=2 * hidden, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    return transformers.BertForQuestionAnswering(config).double().eval()


@pytest.mark.parametrize("temperature", [1.0, 2.0, 10.0])
def test_one_example_has_one_loss_in_a_short_and_a_long_batch(temperature):
    """Through the Distiller, float64 models: the example alone (12 tokens) and padded to 40 (its batch's width
    when grouped with a longer one): TinyBERT eq. 10 in both reductions, BERT-PKD's L_CE + L_DS + L_PT."""
    teacher, student = qa_model(2, 16, 0), qa_model(1, 16, 1)
    ids = torch.randint(5, 50, (1, 12), generator=torch.Generator().manual_seed(3))
    short = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    long = {k: torch.nn.functional.pad(v, (0, 28)) for k, v in short.items()}
    gold = {"start_positions": torch.tensor([4]), "end_positions": torch.tensor([6])}
    specs = [({"prediction_loss": 1.0}, "paper", {}), ({"prediction_loss": 1.0}, "official", {}),
             ({"hard_label_loss": 0.5, "prediction_loss": 0.5, "patient_loss": 100.0}, "paper",
              {"layer_map": LayerMap(hidden=((1, 1),))})]
    for weights, reduction, extra in specs:
        spec = DistillSpec(weights, "prediction", options=LossOptions(temperature=temperature,
                                                                      prediction_reduction=reduction), **extra)
        distiller = Distiller(student, teacher, spec).train()
        student.eval()
        with torch.no_grad():
            a = distiller(**short, **gold).loss.item()
            b = distiller(**long, **gold).loss.item()
        assert b == pytest.approx(a, rel=1e-10), (weights, reduction)

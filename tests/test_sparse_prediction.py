"""Masked-LM training on the labelled positions alone (distillery.training.sparse_prediction): the loss and every
gradient are the full head's (float64, padding and unlabelled positions included), for each model type it covers;
evaluation forwards and other heads are left as they are; the hooks are gone after the block; a step counts the head
at the labelled positions only."""

from __future__ import annotations

import pytest
import torch
import transformers

from distillery.efficiency.ceiling import StepFlops
from distillery.efficiency.flops import flops_per_example
from distillery.training import sparse_prediction

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 32, "max_position_embeddings": 40, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0}


def _models() -> dict[str, torch.nn.Module]:
    return {"bert": transformers.BertForMaskedLM(transformers.BertConfig(**SMALL)),
            "roberta": transformers.RobertaForMaskedLM(transformers.RobertaConfig(**SMALL, pad_token_id=1)),
            "mobilebert": transformers.MobileBertForMaskedLM(transformers.MobileBertConfig(
                **{**SMALL, "hidden_size": 32}, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
                num_feedforward_networks=1))}


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for row, n in enumerate((9, 4, 6)):
        mask[row, :n] = 1
    ids = torch.randint(5, 60, (3, 9), generator=g) * mask + (1 - mask)  # padded with id 1
    labels = torch.full((3, 9), -100)
    for row, col in ((0, 2), (0, 7), (1, 1), (2, 3), (2, 5)):
        labels[row, col] = int(torch.randint(5, 60, (), generator=g))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _step(model: torch.nn.Module, sparse: bool):
    model.zero_grad(set_to_none=True)
    with sparse_prediction.used(model) if sparse else torch.enable_grad():
        out = model(**_batch())
        out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["bert", "roberta", "mobilebert"])
def test_the_head_on_the_labelled_positions_gives_the_full_heads_loss_and_gradients(kind):
    torch.manual_seed(0)
    model = _models()[kind].double().train()
    assert sparse_prediction.applies(model)
    full, grads = _step(model, sparse=False)
    sparse, grads_s = _step(model, sparse=True)
    assert sparse.logits.shape == (5, 60)  # the five labelled positions' logits only
    assert torch.allclose(full.loss, sparse.loss, rtol=1e-12, atol=0)
    assert grads.keys() == grads_s.keys() and len(grads) > 10
    for name in grads:
        assert torch.allclose(grads[name], grads_s[name], rtol=1e-10, atol=1e-14), name
    labelled = _batch()["labels"] != -100
    assert torch.allclose(full.logits[labelled], sparse.logits, rtol=1e-12, atol=1e-14)


def test_evaluation_and_other_models_are_left_as_they_are_and_the_hooks_go_after_the_block():
    torch.manual_seed(0)
    model = _models()["bert"].eval()
    with sparse_prediction.used(model) as on:
        assert on
        assert model(**_batch()).logits.shape == (3, 9, 60)  # evaluation: every position's logits
        model.train()
        assert model(**{k: v for k, v in _batch().items() if k != "labels"}).logits.shape == (3, 9, 60)  # no labels
    assert model(**_batch()).logits.shape == (3, 9, 60)  # after the block: as before
    assert not model._forward_hooks and not model._forward_pre_hooks and not model.cls._forward_pre_hooks
    classifier = transformers.BertForSequenceClassification(transformers.BertConfig(**SMALL))
    with sparse_prediction.used(classifier) as on:
        assert not on


def test_a_step_counts_the_head_at_the_labelled_positions_only():
    model = _models()["bert"]
    batch = _batch()
    mlm, encoder = (flops_per_example(model.config, 9, head=h) for h in ("mlm", "classifier"))
    assert StepFlops(model)(batch) == 3 * 3 * mlm  # the full head: every position
    assert StepFlops(model, sparse=True)(batch) == pytest.approx(3 * (3 * encoder + (mlm - encoder) * 5 / 9))

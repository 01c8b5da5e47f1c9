"""Unpadded batches (distillery.training.unpadding): the layers see the real tokens alone, every real token's value,
the loss and every gradient are the padded forward's (float32), for a model that trains and one that infers; which
trainings may run unpadded; the model put back as it was."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import transformers
from torch import nn

from distillery.training import cpu_kernels, unpadding

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(**kw) -> transformers.BertConfig:
    return transformers.BertConfig(**{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
                                      "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32,
                                      "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **kw})


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for row, n in enumerate((9, 4, 6)):
        mask[row, :n] = 1
    return {"input_ids": torch.randint(5, 50, (3, 9), generator=g) * mask, "attention_mask": mask,
            "token_type_ids": torch.zeros(3, 9, dtype=torch.long), "labels": torch.tensor([0, 1, 1])}


def _run(model: nn.Module, unpadded: bool):
    """loss, logits and {name: grad} of one forward and backward as the Trainer runs it, padded or unpadded; and the
    sequence lengths the first layer saw."""
    model.zero_grad(set_to_none=True)
    seen: list[tuple[int, ...]] = []
    hook = model.base_model.encoder.layer[0].register_forward_pre_hook(lambda m, a: seen.append(tuple(a[0].shape)))
    with cpu_kernels.used(model, "cpu"), (unpadding.used(model, "cpu") if unpadded else nullcontext()):
        out = model(**_batch())
        out.loss.backward()
    hook.remove()
    return out.loss, out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, seen


@pytest.mark.parametrize("trains", [True, False])
@pytest.mark.parametrize("group_cost", [float("inf"), 0.0])  # the attention in one group, in one per length
def test_the_layers_read_the_real_tokens_alone_and_the_loss_and_gradients_are_the_padded_ones(trains, group_cost,
                                                                                            monkeypatch):
    monkeypatch.setattr(unpadding, "GROUP_COST", group_cost)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config(num_labels=2)).train(trains)
    model.set_attn_implementation("sdpa")
    loss, logits, grads, seen = _run(model, unpadded=False)
    loss_u, logits_u, grads_u, seen_u = _run(model, unpadded=True)
    assert seen == [(3, 9, 16)] and seen_u == [(1, 64, 16)]  # 9 + 4 + 6 real tokens, then copies up to ROWS
    assert torch.allclose(loss, loss_u, atol=1e-6) and torch.allclose(logits, logits_u, atol=1e-6)
    assert grads.keys() == grads_u.keys() and len(grads) > 10
    for name in grads:
        assert torch.allclose(grads[name], grads_u[name], atol=1e-6), name
    assert model.config._attn_implementation == "sdpa"  # put back
    assert not model.base_model.encoder._forward_pre_hooks and not model.base_model.encoder._forward_hooks


def test_a_masked_lm_keeps_every_real_tokens_logits_and_a_batch_without_padding_runs_as_it_is():
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(_config()).eval()
    batch = _batch()
    with torch.no_grad():
        ref = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        with unpadding.used(model, "cpu"):
            got = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            full = model(input_ids=batch["input_ids"][:1], attention_mask=batch["attention_mask"][:1]).logits
        real = batch["attention_mask"].bool()
        assert torch.allclose(ref[real], got[real], atol=1e-5)
        assert torch.allclose(full, ref[:1], atol=1e-5)


def _brute_force(lengths: list[int], cost: float) -> float:
    """The least cost of any split of the sentences sorted longest first into consecutive groups."""
    order = sorted(lengths, reverse=True)
    best = float("inf")
    for cuts in range(1 << (len(order) - 1)):
        total, start = 0.0, 0
        for i in range(1, len(order) + 1):
            if i == len(order) or cuts >> (i - 1) & 1:
                total += (i - start) * order[start] ** 2 + cost
                start = i
        best = min(best, total)
    return best


def test_length_groups_are_the_cheapest_split_of_the_sorted_sentences():
    rng = torch.Generator().manual_seed(0)
    for cost in (0.0, 50.0, 400.0, 1e9):
        for _ in range(20):
            lengths = torch.randint(1, 30, (int(torch.randint(1, 9, (1,), generator=rng)),), generator=rng).tolist()
            got = unpadding.groups(lengths, cost)
            assert sorted(i for g in got for i in g) == list(range(len(lengths)))  # each sentence once
            assert all(lengths[g[0]] == max(lengths[i] for i in g) for g in got)  # led by its longest
            total = sum(len(g) * lengths[g[0]] ** 2 + cost for g in got)
            assert total == pytest.approx(_brute_force(lengths, cost))
    assert unpadding.groups([3, 9, 3, 5], float("inf")) == [[1, 3, 0, 2]]  # one group, longest first, ties in order
    assert unpadding.groups([3, 9, 3, 5], 0.0) == [[1], [3], [0, 2]]


def test_length_groups_lay_out_each_sentences_real_tokens_from_their_first_position():
    real = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 0, 0]], dtype=torch.bool)  # left, none, holes
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unpadding, "GROUP_COST", 0.0)
        mp.setattr(unpadding, "ROWS", 1)
        tokens = unpadding._Tokens.of(real)
    assert tokens.shapes == ((1, 5), (1, 3), (1, 2))
    x = torch.arange(1, 11, dtype=torch.float32).view(1, 1, 10, 1)  # the 10 real tokens, one head of width 1
    grouped = tokens.grouped(x)
    assert [g.flatten().tolist() for g in grouped] == [[4, 5, 6, 7, 8], [1, 2, 3], [9, 10]]
    assert [m.flatten().tolist() for m in tokens.masks] == [[True] * 5, [True] * 3, [True, True]]
    outs = [g.transpose(1, 2) for g in grouped]  # (n, L, H, d), as the attention gives them
    assert torch.equal(tokens.ungrouped(outs), x.transpose(1, 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unpadding, "GROUP_COST", float("inf"))
        tokens = unpadding._Tokens.of(real)  # one group; 10 real rows, then 54 copies of the first
    assert tokens.shapes == ((3, 5),) and tokens.rows.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 12] + [2] * 54
    rows = torch.cat([x, x[:, :, :1].expand(1, 1, 54, 1)], 2)  # what the layers give: copies of row 0 after
    grouped = tokens.grouped(rows)
    assert [g.flatten().tolist() for g in grouped[0]] == [[4, 5, 6, 7, 8], [1, 2, 3, 0, 0], [9, 10, 0, 0, 0]]
    assert torch.equal(tokens.ungrouped([g.transpose(1, 2) for g in grouped]), rows.transpose(1, 2))
    assert torch.equal(tokens.scattered(rows[:, 0].view(1, 64, 1)).view(3, 5)[real], x.flatten())


def test_a_left_padded_batch_runs_unpadded_as_it_runs_padded(monkeypatch):
    monkeypatch.setattr(unpadding, "GROUP_COST", 0.0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config(num_labels=2)).eval()
    batch = _batch()
    mask = batch["attention_mask"].flip(1)
    ids = batch["input_ids"].flip(1)
    with torch.no_grad():  # the real tokens' last hidden states (the [CLS] position is padding here)
        ref = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        with unpadding.used(model, "cpu"):
            got = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert torch.allclose(ref[real], got[real], atol=1e-5) and not got[~real].any()


def test_only_a_training_that_reads_no_padded_position_runs_unpadded():
    from distillery.layer_map import build_layer_map
    from distillery.training.distill import Distiller
    from distillery.training.spec import DistillSpec

    cfg = _config(num_labels=2)
    classifier = transformers.BertForSequenceClassification(cfg)
    assert not unpadding.reads_padding(classifier) and not unpadding.reads_padding(transformers.BertForMaskedLM(cfg))
    assert unpadding.reads_padding(transformers.BertForQuestionAnswering(cfg))  # its softmax runs over every position
    assert unpadding.reads_padding(transformers.BertForSequenceClassification(_config(output_hidden_states=True)))
    distil = transformers.DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    assert unpadding.reads_padding(transformers.DistilBertForSequenceClassification(distil))  # not in ENCODERS
    lm = build_layer_map("uniform", 1, 2)
    teacher = transformers.BertForSequenceClassification(cfg)
    student = transformers.BertForSequenceClassification(_config(num_labels=2, num_hidden_layers=1))
    prediction = Distiller(student, teacher, DistillSpec({"prediction_loss": 1.0}, "prediction", lm))
    assert not prediction.reads_internals and not unpadding.reads_padding(prediction)
    layer_wise = Distiller(student, teacher, DistillSpec({"attention_loss": 1.0, "hidden_loss": 1.0},
                                                         "intermediate", lm))
    assert layer_wise.reads_internals and unpadding.reads_padding(layer_wise)  # TinyBERT's official losses do


def test_nothing_changes_off_the_cpu_or_for_none():
    model = transformers.BertForSequenceClassification(_config(num_labels=2))
    model.set_attn_implementation("sdpa")
    with unpadding.used(model, "meta") as here, unpadding.used(None, "cpu") as none:
        assert model.config._attn_implementation == "sdpa" and not model.base_model.encoder._forward_pre_hooks
        assert not here and not none
    with unpadding.used(model, "cpu") as cpu:
        assert cpu and model.config._attn_implementation == unpadding.ATTENTION


def test_a_classifiers_inference_forwards_run_unpadded_and_give_its_padded_logits():
    from distillery import evaluation

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config(num_labels=2)).eval()
    batch = _batch()
    rows = [{"input_ids": ids[m.bool()].tolist(), "attention_mask": [1] * int(m.sum())}
            for ids, m in zip(batch["input_ids"], batch["attention_mask"])]
    import datasets

    class _Tok:  # pads as a tokenizer's collator does (DataCollatorWithPadding calls tokenizer.pad)
        def pad(self, features, **_):
            t = max(len(f["input_ids"]) for f in features)
            return {k: torch.tensor([f[k] + [0] * (t - len(f[k])) for f in features]) for k in features[0]}

    with torch.no_grad():
        ref = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    seen: list[tuple[int, ...]] = []
    model.base_model.encoder.layer[0].register_forward_pre_hook(lambda m, a: seen.append(tuple(a[0].shape)))
    got = evaluation.predict_logits(model, _Tok(), datasets.Dataset.from_list(rows))
    assert seen == [(1, 64, 16)] and torch.allclose(torch.from_numpy(got), ref, atol=1e-5)
    qa = transformers.BertForQuestionAnswering(_config())
    with unpadding.inferring(qa, "cpu") as unpadded:  # its softmax over positions reads every one
        assert not unpadded and qa.config._attn_implementation != unpadding.ATTENTION


def test_a_batch_without_a_real_token_runs_as_it_is():
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config(num_labels=2)).eval()
    ids, mask = torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        with unpadding.used(model, "cpu"):
            got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(ref, got, atol=1e-6)

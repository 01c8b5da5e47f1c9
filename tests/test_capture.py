"""capture(): hidden states, pre-softmax scores, attention probs and per-head vectors of mapped layers."""

import math

import pytest
import torch
import transformers as tr

from distillery.capture import CaptureError, capture


def _configs():
    return {
        "bert": tr.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64
        ),
        "distilbert": tr.DistilBertConfig(vocab_size=100, dim=32, n_layers=3, n_heads=4, hidden_dim=64),
        "mobilebert": tr.MobileBertConfig(
            vocab_size=100, hidden_size=64, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
            num_hidden_layers=3, num_attention_heads=4, intermediate_size=32, num_feedforward_networks=2,
        ),
    }


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    return ids, mask


def _pair(arch: str, head: str):
    torch.manual_seed(0)
    cls = tr.AutoModel if head == "base" else tr.AutoModelForSequenceClassification
    fast = cls.from_config(_configs()[arch], attn_implementation="sdpa").eval()
    eager = cls.from_config(_configs()[arch], attn_implementation="eager").eval()
    eager.load_state_dict(fast.state_dict())
    return fast, eager


@pytest.mark.parametrize("arch", ["bert", "distilbert", "mobilebert"])
@pytest.mark.parametrize("head", ["base", "sequence-classification"])
def test_capture_matches_eager_reference_and_keeps_sdpa(arch, head):
    fast, eager = _pair(arch, head)
    ids, mask = _batch()
    with capture(fast, hidden=[0, 1, 3], scores=[0, 2], probs=[0, 2], values=[1], queries=[2], keys=[2]) as c:
        fast(input_ids=ids, attention_mask=mask)
    assert fast.config._attn_implementation == "sdpa"
    ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert sorted(c.hidden) == [0, 1, 3] and sorted(c.probs) == [0, 2] and sorted(c.values) == [1]
    for layer in (0, 2):
        torch.testing.assert_close(c.probs[layer], ref.attentions[layer], atol=1e-5, rtol=0)
        # padded keys get (numerically) zero probability
        assert c.probs[layer][2, :, :, 2:].abs().max() < 1e-6
    for state in (0, 1, 3):
        torch.testing.assert_close(c.hidden[state], ref.hidden_states[state], atol=1e-5, rtol=1e-5)
    # scores = Q K^T / sqrt(d), unmasked: recompute from the captured queries/keys and by hand
    q, k = c.queries[2], c.keys[2]
    d = q.shape[-1]
    torch.testing.assert_close(c.scores[2], q @ k.transpose(-1, -2) / math.sqrt(d))
    base = fast.base_model
    if arch == "distilbert":
        attn = base.transformer.layer[0].attention
        lin_q, lin_k = attn.q_lin, attn.k_lin
        x = ref.hidden_states[0]
    elif arch == "bert":
        attn = base.encoder.layer[0].attention.self
        lin_q, lin_k = attn.query, attn.key
        x = ref.hidden_states[0]
    else:  # MobileBERT: q/k read the key-query-shared bottleneck of the block input
        layer = base.encoder.layer[0]
        attn = layer.attention.self
        lin_q, lin_k = attn.query, attn.key
        x = layer.bottleneck.attention(ref.hidden_states[0])
    h = c.scores[0].shape[1]
    qh = lin_q(x).view(3, 9, h, -1).transpose(1, 2)
    kh = lin_k(x).view(3, 9, h, -1).transpose(1, 2)
    manual = qh @ kh.transpose(-1, -2) / math.sqrt(qh.shape[-1])
    torch.testing.assert_close(c.scores[0], manual, atol=1e-5, rtol=1e-5)
    # unmasked: padded key columns are real scores, not -inf / dtype-min
    assert torch.isfinite(c.scores[0]).all() and c.scores[0].abs().max() < 1e3
    assert c.values[1].shape == (3, h, 9, qh.shape[-1])


def test_eager_model_mask_is_handled_too():
    fast, eager = _pair("bert", "base")
    ids, mask = _batch()
    with capture(eager, probs=[1]) as c:
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
    torch.testing.assert_close(c.probs[1], ref.attentions[1], atol=1e-5, rtol=0)


def test_no_mask_and_positional_call():
    fast, eager = _pair("bert", "base")
    ids, _ = _batch()
    with capture(fast, probs=[0]) as c:
        fast(ids)
    ref = eager(ids, output_attentions=True)
    torch.testing.assert_close(c.probs[0], ref.attentions[0], atol=1e-5, rtol=0)


def test_gradients_flow_and_hooks_are_removed():
    torch.manual_seed(0)
    model = tr.AutoModel.from_config(_configs()["bert"]).train()
    ids, mask = _batch()
    with capture(model, hidden=[2], scores=[1], probs=[0], values=[2]) as c:
        model(input_ids=ids, attention_mask=mask)
    loss = c.hidden[2].square().mean() + c.scores[1].square().mean() + c.probs[0].square().mean()
    loss = loss + c.values[2].square().mean()
    loss.backward()
    q_grad = model.encoder.layer[1].attention.self.query.weight.grad
    assert q_grad is not None and q_grad.abs().sum() > 0
    assert model.encoder.layer[0].attention.self.key.weight.grad.abs().sum() > 0
    assert model.encoder.layer[2].attention.self.value.weight.grad.abs().sum() > 0
    hooked = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooked == []


def test_only_requested_layers_are_captured_and_refilled_each_forward():
    fast, _ = _pair("bert", "base")
    ids, mask = _batch()
    with capture(fast, scores=[1]) as c:
        fast(input_ids=ids, attention_mask=mask)
        first = c.scores[1]
        fast(input_ids=ids[:2], attention_mask=mask[:2])
        assert c.scores[1].shape[0] == 2 and first.shape[0] == 3
    assert set(c.scores) == {1} and not c.probs and not c.hidden and not c.values


def test_out_of_range_and_unsupported_models_raise():
    fast, _ = _pair("bert", "base")
    with pytest.raises(CaptureError, match="hidden state index 4"):
        with capture(fast, hidden=[4]):
            pass
    with pytest.raises(CaptureError, match="scores layer index 3"):
        with capture(fast, scores=[3]):
            pass
    with pytest.raises(CaptureError, match="unsupported model"):
        with capture(torch.nn.Linear(2, 2), hidden=[0]):
            pass


def test_select_orders_by_layer_map_and_reports_missing():
    from distillery.layer_map import build_layer_map

    fast, _ = _pair("bert", "base")
    ids, mask = _batch()
    lm = build_layer_map("uniform", 1, 3)  # attention (0, 2); hidden (0, 0), (1, 3)
    with capture(fast, scores=lm.teacher_layers, hidden=lm.teacher_states) as c:
        fast(input_ids=ids, attention_mask=mask)
    states = c.select("hidden", reversed(lm.teacher_states))
    assert states[0] is c.hidden[3] and states[1] is c.hidden[0]
    assert c.select("scores", lm.teacher_layers)[0] is c.scores[2]
    with pytest.raises(CaptureError, match=r"probs not captured for index\(es\) \[2\]"):
        c.select("probs", [2])
    with pytest.raises(CaptureError, match="unknown kind"):
        c.select("clear", [0])

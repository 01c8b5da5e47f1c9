"""The CPU training kernels (distillery.training.cpu_kernels): the dropout's drop rate and scale, its seed, its
gradient; the attention equal to transformers' eager attention; the bias after a bf16 matmul equal to autocast's
linear; a model put back as it was after training with them."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn
from transformers.models.bert.modeling_bert import eager_attention_forward

from distillery.training import cpu_kernels

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_drop_rate_is_p_to_within_its_resolution_and_the_expectation_is_kept():
    assert cpu_kernels.drop_levels(0.1) == 6554 and cpu_kernels.drop_levels(0.0) == 0 and cpu_kernels.drop_levels(1.0) == 65536
    torch.manual_seed(0)
    n = 1 << 21
    keep = cpu_kernels.keep_mask((n,), 0.1)
    rate = 1 - keep.float().mean().item()
    assert abs(rate - 6554 / 65536) < 5 * (0.1 * 0.9 / n) ** 0.5  # five standard deviations
    halves = keep.view(2, -1).float().mean(1)  # the two halves of the words' draws alike
    assert abs(halves[0] - halves[1]) < 0.003
    out = cpu_kernels.dropout(torch.ones(n), 0.1)
    kept = out[out != 0]
    assert torch.equal(kept, torch.full_like(kept, 65536 / (65536 - 6554)))
    assert abs(out.mean().item() - 1.0) < 0.005
    with pytest.raises(ValueError, match="dropout probability"):
        cpu_kernels.keep_mask((4,), 1.5)
    for dtype in (torch.bfloat16, torch.float32):  # the mask dropout multiplies by: the same draws, as 1 and 0
        torch.manual_seed(3)
        flags = cpu_kernels.keep_mask((5, 7), 0.4)
        torch.manual_seed(3)
        ones = cpu_kernels.keep_mask((5, 7), 0.4, dtype=dtype)
        assert ones.dtype == dtype and torch.equal(ones, flags.to(dtype)) and 0 < ones.sum() < 35


def test_the_same_seed_gives_the_same_mask_and_the_gradient_is_the_mask_scaled():
    x = torch.randn(3, 5, 7, requires_grad=True)
    torch.manual_seed(1)
    a = cpu_kernels.dropout(x, 0.3)
    torch.manual_seed(1)
    b = cpu_kernels.dropout(x, 0.3)
    assert torch.equal(a, b) and not torch.equal(a, x)
    a.sum().backward()
    scale = 65536 / (65536 - cpu_kernels.drop_levels(0.3))
    assert torch.equal(x.grad, (a != 0).float() * scale)
    torch.manual_seed(1)
    assert torch.equal(a, x.detach() * cpu_kernels.keep_mask(x.shape, 0.3) * scale)  # the boolean mask's product
    assert cpu_kernels.dropout(x, 0.3, training=False) is x and cpu_kernels.dropout(x, 0.0) is x
    assert torch.equal(cpu_kernels.dropout(x, 1.0), torch.zeros_like(x))


def test_the_attention_is_berts_eager_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 6)
    mask[1, ..., 4:] = torch.finfo(torch.float32).min
    module = nn.Module().eval()
    theirs = eager_attention_forward(module, q, k, v, mask, scaling=0.5, dropout=0.1)
    for given in (mask, mask == 0):  # additive, or True where attended (the SDPA masks `used` asks for)
        for training in (True, False):  # in eval (fp32), PyTorch's SDPA: the output alone
            ours = cpu_kernels.attention(module.train(training), q, k, v, given, scaling=0.5,
                                         dropout=0.0 if training else 0.1)
            assert torch.allclose(ours[0], theirs[0], atol=1e-6)
            assert ours[1] is None if not training else torch.allclose(ours[1], theirs[1], atol=1e-6)
    module.train()
    torch.manual_seed(2)
    out, probs = cpu_kernels.attention(module, q, k, v, mask == 0, dropout=0.5)
    torch.manual_seed(2)
    keep = cpu_kernels.keep_mask(probs.shape, 0.5)
    reference = torch.softmax(q @ k.transpose(2, 3) * 0.5 + mask, -1) * keep * (65536 / 32768)
    assert torch.allclose(probs, reference) and torch.allclose(out, (reference @ v).transpose(1, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 scores stay bf16, within bf16's rounding of eager's
        low = cpu_kernels.attention(module, q, k, v, mask == 0)  # training, no dropout: its own computation
        additive = cpu_kernels.attention(module, q, k, v, mask)
        scores = torch.matmul(q * 0.5, k.transpose(2, 3))  # the padded keys filled with the minimum, which the
        filled = scores.masked_fill(mask != 0, torch.finfo(torch.bfloat16).min)  # bias's sum rounds to
    with torch.autocast("cpu", enabled=False):
        filled = torch.softmax(filled, -1)
    assert low[1].dtype == torch.bfloat16 and torch.allclose(low[0].float(), theirs[0], atol=0.05)
    assert torch.equal(low[1], additive[1]) and torch.equal(low[1], filled)


def test_the_bias_after_the_matmul_is_autocasts_linear():
    torch.manual_seed(0)
    layer, x = nn.Linear(24, 40), torch.randn(5, 24, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = layer(x)
        theirs.float().pow(2).sum().backward()
        grads = [t.grad.clone() for t in (x, layer.weight, layer.bias)]
        for t in (x, layer.weight, layer.bias):
            t.grad = None
        layer.__class__ = cpu_kernels.Linear
        ours = layer(x)
        ours.float().pow(2).sum().backward()
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), theirs.float(), rtol=0.01, atol=0.01)  # one more bf16 rounding
    assert all(torch.allclose(t.grad, g, rtol=0.02, atol=0.02) for t, g in zip((x, layer.weight, layer.bias), grads))
    assert torch.equal(layer(x.detach()), nn.functional.linear(x.detach(), layer.weight, layer.bias))  # fp32: nn.Linear


def _bert() -> transformers.BertForSequenceClassification:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, attn_implementation="sdpa")
    return transformers.BertForSequenceClassification(config)


def test_a_model_trains_with_it_on_a_cpu_and_is_put_back_after():
    model = _bert().train()
    ids = torch.randint(0, 50, (2, 8))
    padded = {"input_ids": ids, "attention_mask": torch.tensor([[1] * 8, [1] * 3 + [0] * 5])}
    model.eval()
    reference = model(**padded).logits
    model.train()
    with cpu_kernels.used(model, "cpu"):
        model.eval()
        assert torch.allclose(model(**padded).logits, reference, atol=1e-5)  # the padding mask reaches the attention
        model.train()
        assert model.config._attn_implementation == cpu_kernels.ATTENTION
        linear = cpu_kernels.Linear if cpu_kernels.bias_after_matmul() else nn.Linear  # without AMX: `Linear`
        assert all(type(m) is not nn.Dropout for m in model.modules())
        assert {type(m) for m in model.modules() if isinstance(m, nn.Linear)} == {linear}
        assert sum(type(m) is cpu_kernels.Dropout for m in model.modules()) == 2 * 3 + 2  # embeddings, classifier, layers
        torch.manual_seed(3)
        first = model(input_ids=ids).logits
        torch.manual_seed(3)
        assert torch.equal(model(input_ids=ids).logits, first)  # seeded: the same
        model.eval()
        inside = model(input_ids=ids).logits
    assert model.config._attn_implementation == "sdpa" and not model.training
    assert all(type(m) not in (cpu_kernels.Dropout, cpu_kernels.Linear) for m in model.modules())
    model.set_attn_implementation("eager")
    assert torch.allclose(model(input_ids=ids).logits, inside, atol=1e-5)  # eval: transformers' eager attention
    gpu = _bert()
    with cpu_kernels.used(gpu, "cuda"):  # on a GPU, PyTorch's fused dropout: nothing changes
        assert gpu.config._attn_implementation == "sdpa" and any(type(m) is nn.Dropout for m in gpu.modules())


def test_under_bf16_the_residual_stream_is_bf16():
    student, teacher = _bert().train(), _bert().eval()
    states: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _a, out: states.append(out if torch.is_tensor(out) else out[0]))
             for layer in student.bert.encoder.layer]
    ids = torch.randint(0, 50, (2, 8))
    with cpu_kernels.used(student, "cpu"), cpu_kernels.used(teacher, "cpu"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            student(input_ids=ids).logits.float().sum().backward()
            low = teacher(input_ids=ids).logits
        assert [s.dtype for s in states] == [torch.bfloat16] * 2  # every layer's output: no float32 stream
        states.clear()
        student(input_ids=ids)  # without autocast: float32 as before
        assert [s.dtype for s in states] == [torch.float32] * 2
    for h in hooks:
        h.remove()
    assert not student.bert.embeddings._forward_hooks and not teacher.bert.embeddings._forward_hooks
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the teacher's output within bf16 rounding of its float32 one
        reference = teacher(input_ids=ids).logits
    assert torch.allclose(low.float(), reference.float(), atol=0.05)


@pytest.mark.parametrize("amx", [True, False])
def test_a_model_that_infers_runs_sdpa_but_in_bf16_on_a_cpu_without_amx(monkeypatch, amx):
    """In eval, `attention` is PyTorch's SDPA as transformers calls it (fp32; bf16 with AMX), bit for bit; in bf16
    without AMX its own computation, the same attention within bf16 rounding."""
    from distillery import precision

    cpu_kernels.bias_after_matmul.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("avx512_bf16", "amx_bf16") if amx else ("avx512_bf16",))
    calls: list[str] = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, _f=torch.nn.functional.scaled_dot_product_attention, **k: calls.append("sdpa")
                        or _f(*a, **k))
    model = _bert().eval()
    padded = {"input_ids": torch.randint(0, 50, (2, 8)), "attention_mask": torch.tensor([[1] * 8, [1] * 3 + [0] * 5])}
    try:
        outputs = {}
        for form in ("fp32", "bf16"):
            for kernels in (False, True):
                calls.clear()
                with torch.inference_mode(), precision.autocast("cpu", form), \
                        cpu_kernels.used(model if kernels else None, "cpu"):
                    outputs[form, kernels] = model(**padded).logits.float()
                assert calls == (["sdpa"] * 2 if not kernels or form == "fp32" or amx else [])
    finally:
        cpu_kernels.bias_after_matmul.cache_clear()
    assert torch.equal(outputs["fp32", True], outputs["fp32", False])
    assert torch.allclose(outputs["bf16", True], outputs["fp32", False], atol=0.05)


@pytest.mark.parametrize("amx", [True, False])
def test_the_bias_goes_after_the_matmul_only_on_a_cpu_without_amx(monkeypatch, amx):
    from distillery import precision

    cpu_kernels.bias_after_matmul.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("avx512_bf16", "amx_bf16") if amx else ("avx512_bf16",))
    model = _bert()
    try:
        with cpu_kernels.used(model, "cpu"):
            kinds = {type(m) for m in model.modules() if isinstance(m, nn.Linear)}
    finally:
        cpu_kernels.bias_after_matmul.cache_clear()
    assert kinds == ({nn.Linear} if amx else {cpu_kernels.Linear})
    assert {type(m) for m in model.modules() if isinstance(m, nn.Linear)} == {nn.Linear}

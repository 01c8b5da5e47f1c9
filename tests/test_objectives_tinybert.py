"""TinyBERT objectives vs independent float64 loop implementations of eqs. 7-10 (padding included)."""

import math

import numpy as np
import pytest
import torch

from distillery.objectives import (
    HiddenProjection,
    attention_loss,
    embedding_loss,
    hidden_loss,
    prediction_loss,
    regression_prediction_loss,
)

LENGTHS = [5, 3, 2]
B, H, T = len(LENGTHS), 2, 5


def mask_of(lengths, t=T):
    return torch.tensor([[1] * n + [0] * (t - n) for n in lengths])


def rnd(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * 3


def ref_attention_official(s_list, t_list, lengths):
    total = 0.0
    for s, t in zip(s_list, t_list):
        s, t = s.numpy(), t.numpy()
        acc = 0.0
        for b in range(B):
            for h in range(H):
                for q in range(T):
                    for k in range(T):
                        add = -10000.0 if k >= lengths[b] else 0.0
                        sv, tv = s[b, h, q, k] + add, t[b, h, q, k] + add
                        sv = 0.0 if sv <= -100 else sv
                        tv = 0.0 if tv <= -100 else tv
                        acc += (sv - tv) ** 2
        total += acc / (B * H * T * T)
    return total


def ref_attention_paper(s_list, t_list, lengths):
    total = 0.0
    for s, t in zip(s_list, t_list):
        s, t = s.numpy(), t.numpy()
        per_b = []
        for b, n in enumerate(lengths):
            acc = 0.0
            for h in range(H):
                for q in range(n):
                    for k in range(n):
                        acc += (s[b, h, q, k] - t[b, h, q, k]) ** 2
            per_b.append(acc / (H * n * n))
        total += sum(per_b) / len(per_b)
    return total


def test_attention_loss_official_matches_reference():
    s = [rnd(B, H, T, T, seed=i) for i in range(3)]
    t = [rnd(B, H, T, T, seed=10 + i) for i in range(3)]
    s[0][0, 1, 2, 3] = -150.0  # a genuine valid score <= -100 is zeroed too in the official code
    got = attention_loss(s, t, mask_of(LENGTHS))
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(ref_attention_official(s, t, LENGTHS), rel=1e-10)


def test_attention_loss_paper_masking_matches_reference():
    s = [rnd(B, H, T, T, seed=i) for i in range(2)]
    t = [rnd(B, H, T, T, seed=10 + i) for i in range(2)]
    got = attention_loss(s, t, mask_of(LENGTHS), official_masking=False)
    assert got.item() == pytest.approx(ref_attention_paper(s, t, LENGTHS), rel=1e-10)
    # padding changes the official value but not the paper one
    off = attention_loss(s, t, mask_of(LENGTHS)).item()
    assert abs(off - got.item()) > 1e-3


def test_attention_loss_without_padding_both_modes_agree():
    s, t = [rnd(B, H, T, T, seed=1)], [rnd(B, H, T, T, seed=2)]
    full = mask_of([T] * B)
    a = attention_loss(s, t, full).item()
    b = attention_loss(s, t, full, official_masking=False).item()
    assert a == pytest.approx(b, rel=1e-12)
    assert attention_loss(s, t, None).item() == pytest.approx(a, rel=1e-12)


def test_attention_loss_zero_when_equal_and_grad_to_student_only():
    s = rnd(B, H, T, T, seed=3).requires_grad_(True)
    assert attention_loss([s], [s.detach().clone()], mask_of(LENGTHS)).item() == 0.0
    t = rnd(B, H, T, T, seed=4).requires_grad_(True)
    loss = attention_loss([s], [t], mask_of(LENGTHS))
    loss.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert t.grad is None
    # padded keys get no gradient under official masking
    assert s.grad[2, :, :, 2:].abs().sum() == 0


def test_attention_loss_heads_and_layers_mismatch_errors():
    with pytest.raises(ValueError, match="heads"):
        attention_loss([rnd(B, 2, T, T, seed=0)], [rnd(B, 4, T, T, seed=1)], mask_of(LENGTHS))
    with pytest.raises(ValueError, match="2 student tensors but 1 teacher"):
        attention_loss([rnd(B, H, T, T, seed=0)] * 2, [rnd(B, H, T, T, seed=1)], mask_of(LENGTHS))
    with pytest.raises(ValueError, match="attention_mask shape"):
        attention_loss([rnd(B, H, T, T, seed=0)], [rnd(B, H, T, T, seed=1)], mask_of([4, 3, 2], t=4))


def ref_linear(x, w, b):
    x = x.numpy()
    out = np.zeros(x.shape[:-1] + (w.shape[0],))
    for idx in np.ndindex(*x.shape[:-1]):
        for o in range(w.shape[0]):
            out[idx + (o,)] = sum(x[idx + (i,)] * w[o, i] for i in range(w.shape[1])) + b[o]
    return out


def ref_mse(a, b):
    return float(((a - b) ** 2).sum() / a.size)


def test_hidden_and_embedding_loss_shared_projection_matches_reference():
    ds, dt = 3, 4
    proj = HiddenProjection(ds, dt).double()
    assert len(list(proj.parameters())) == 2  # one shared Linear
    s = [rnd(B, T, ds, seed=i) for i in range(3)]
    t = [rnd(B, T, dt, seed=20 + i) for i in range(3)]
    w = proj.layers[0].weight.detach().numpy()
    bias = proj.layers[0].bias.detach().numpy()
    ref = sum(ref_mse(ref_linear(a, w, bias), b.numpy()) for a, b in zip(s, t))
    assert hidden_loss(s, t, proj).item() == pytest.approx(ref, rel=1e-10)
    emb = embedding_loss(s[0], t[0], proj).item()
    assert emb == pytest.approx(ref_mse(ref_linear(s[0], w, bias), t[0].numpy()), rel=1e-10)
    # eq. 9 is the index-0 term of the official hidden sum
    rest = hidden_loss(s[1:], t[1:], proj, indices=[1, 2]).item()
    assert emb + rest == pytest.approx(hidden_loss(s, t, proj).item(), rel=1e-10)


def test_hidden_loss_per_layer_projection_uses_index():
    ds, dt = 3, 4
    proj = HiddenProjection(ds, dt, n_states=3, shared=False).double()
    assert len(proj.layers) == 3
    s = [rnd(B, T, ds, seed=i) for i in range(3)]
    t = [rnd(B, T, dt, seed=20 + i) for i in range(3)]
    ref = 0.0
    for i, (a, b) in enumerate(zip(s, t)):
        lin = proj.layers[i]
        ref += ref_mse(ref_linear(a, lin.weight.detach().numpy(), lin.bias.detach().numpy()), b.numpy())
    assert hidden_loss(s, t, proj).item() == pytest.approx(ref, rel=1e-10)
    with pytest.raises(IndexError):
        proj(s[0], 3)


def test_hidden_loss_masked_option_matches_reference():
    s, t = [rnd(B, T, 4, seed=1)], [rnd(B, T, 4, seed=2)]
    per_b = []
    for b, n in enumerate(LENGTHS):
        d = (s[0][b, :n] - t[0][b, :n]).numpy()
        per_b.append((d**2).sum() / (n * 4))
    got = hidden_loss(s, t, None, attention_mask=mask_of(LENGTHS)).item()
    assert got == pytest.approx(sum(per_b) / B, rel=1e-10)


def test_hidden_loss_grad_reaches_student_and_projection_only():
    proj = HiddenProjection(3, 4).double()
    s = rnd(B, T, 3, seed=1).requires_grad_(True)
    t = rnd(B, T, 4, seed=2).requires_grad_(True)
    hidden_loss([s], [t], proj).backward()
    assert s.grad is not None and proj.layers[0].weight.grad is not None and t.grad is None
    with pytest.raises(ValueError, match="HiddenProjection"):
        hidden_loss([s], [t], None)


def ref_soft_ce(s, t, temp):
    out = []
    for b in range(len(s)):
        zs, zt = [v / temp for v in s[b]], [v / temp for v in t[b]]
        ps = [math.exp(v) for v in zs]
        pt = [math.exp(v) for v in zt]
        ls = [math.log(p / sum(ps)) for p in ps]
        pt = [p / sum(pt) for p in pt]
        out.append(-sum(a * c for a, c in zip(pt, ls)))
    return out


@pytest.mark.parametrize("temp", [1.0, 2.5])
def test_prediction_loss_matches_reference(temp):
    C = 3
    s, t = rnd(4, C, seed=1), rnd(4, C, seed=2)
    rows = ref_soft_ce(s.tolist(), t.tolist(), temp)
    paper = sum(rows) / len(rows)
    assert prediction_loss(s, t, temp).item() == pytest.approx(paper, rel=1e-10)
    assert prediction_loss(s, t, temp, reduction="official").item() == pytest.approx(paper / C, rel=1e-10)
    assert prediction_loss(s, t, temp, scale_by_t2=True).item() == pytest.approx(paper * temp**2, rel=1e-10)


def test_prediction_loss_minimised_at_teacher_and_errors():
    t = rnd(4, 3, seed=2)
    s = t.clone().requires_grad_(True)
    prediction_loss(s, t).backward()
    assert s.grad.abs().max() < 1e-12  # gradient of soft CE vanishes when student == teacher
    with pytest.raises(ValueError, match="reduction"):
        prediction_loss(s, t, reduction="sum")
    with pytest.raises(ValueError, match="temperature"):
        prediction_loss(s, t, 0.0)


def test_regression_prediction_loss_both_targets():
    s, t, g = rnd(6, 1, seed=1), rnd(6, 1, seed=2), rnd(6, seed=3)
    ref_t = sum((a - b) ** 2 for a, b in zip(s[:, 0].tolist(), t[:, 0].tolist())) / 6
    ref_g = sum((a - b) ** 2 for a, b in zip(s[:, 0].tolist(), g.tolist())) / 6
    assert regression_prediction_loss(s, t).item() == pytest.approx(ref_t, rel=1e-10)
    assert regression_prediction_loss(s, t, g, target="gold").item() == pytest.approx(ref_g, rel=1e-10)
    with pytest.raises(ValueError, match="needs gold"):
        regression_prediction_loss(s, t, target="gold")
    with pytest.raises(ValueError, match="needs teacher_pred"):
        regression_prediction_loss(s, gold=g)


def test_attention_loss_official_gradient_matches_finite_differences():
    """The official masking's loss and its own backward (no autograd graph through the masking) against float64
    finite differences, padded keys and a zeroed genuine score included."""
    s = rnd(B, H, T, T, seed=5)
    s[1, 0, 1, 1] = -150.0  # zeroed: no gradient there
    s.requires_grad_(True)
    t = rnd(B, H, T, T, seed=6)
    assert torch.autograd.gradcheck(lambda x: attention_loss([x], [t], mask_of(LENGTHS)), (s,))
    attention_loss([s], [t], mask_of(LENGTHS)).backward()
    assert s.grad[1, 0, 1, 1] == 0 and (s.grad[2, :, :, 2:] == 0).all()  # padded keys of the 2-token row

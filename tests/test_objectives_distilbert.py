"""DistilBERT objectives vs independent float64 loop implementations (non-pad tokens, batchmean, T^2)."""

import math

import pytest
import torch

from distillery.objectives import cosine_loss, mlm_loss, soft_target_loss

LENGTHS = [5, 3, 2]
B, T, V = len(LENGTHS), 5, 6


def mask_of(lengths, t=T):
    return torch.tensor([[1] * n + [0] * (t - n) for n in lengths])


def rnd(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def softmax(row):
    mx = max(row)
    e = [math.exp(v - mx) for v in row]
    return [v / sum(e) for v in e]


@pytest.mark.parametrize("temp", [1.0, 2.0])
def test_soft_target_loss_matches_reference(temp):
    s, t = rnd(B, T, V, seed=1, scale=2), rnd(B, T, V, seed=2, scale=2)
    acc, n_tok = 0.0, 0
    for b, n in enumerate(LENGTHS):
        for i in range(n):
            ps = softmax([v / temp for v in s[b, i].tolist()])
            pt = softmax([v / temp for v in t[b, i].tolist()])
            acc += sum(p * math.log(p / q) for p, q in zip(pt, ps))
            n_tok += 1
    ref = acc / n_tok * temp**2
    assert soft_target_loss(s, t, mask_of(LENGTHS), temp).item() == pytest.approx(ref, rel=1e-10)


def test_soft_target_loss_padding_zero_grads_and_2d():
    s, t = rnd(B, T, V, seed=1), rnd(B, T, V, seed=2)
    s2 = s.clone()
    s2[2, 2:] = 50.0
    m = mask_of(LENGTHS)
    assert soft_target_loss(s2, t, m, 2.0).item() == pytest.approx(soft_target_loss(s, t, m, 2.0).item(), rel=1e-12)
    assert soft_target_loss(s, s.clone(), m, 2.0).item() == pytest.approx(0.0, abs=1e-14)
    sg, tg = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    soft_target_loss(sg, tg, m, 2.0).backward()
    assert sg.grad[2, 2:].abs().sum() == 0 and sg.grad.abs().sum() > 0 and tg.grad is None
    flat_s, flat_t = s[:, 0], t[:, 0]  # (B, V) sequence-level logits
    ref = sum(
        sum(p * math.log(p / q) for p, q in zip(softmax(flat_t[b].tolist()), softmax(flat_s[b].tolist())))
        for b in range(B)
    ) / B
    assert soft_target_loss(flat_s, flat_t, None, 1.0).item() == pytest.approx(ref, rel=1e-10)


def test_mlm_loss_matches_reference():
    s = rnd(B, T, V, seed=3)
    labels = torch.full((B, T), -100)
    labels[0, 0], labels[0, 4], labels[2, 1] = 2, 5, 0
    acc, cnt = 0.0, 0
    for b in range(B):
        for i in range(T):
            y = int(labels[b, i])
            if y != -100:
                acc += -math.log(softmax(s[b, i].tolist())[y])
                cnt += 1
    assert mlm_loss(s, labels).item() == pytest.approx(acc / cnt, rel=1e-10)
    z = mlm_loss(s.clone().requires_grad_(True), torch.full((B, T), -100))
    assert z.item() == 0.0 and z.requires_grad
    with pytest.raises(ValueError, match="labels shape"):
        mlm_loss(s, labels[:, :3])


def test_cosine_loss_matches_reference_and_errors():
    D = 4
    s, t = rnd(B, T, D, seed=4), rnd(B, T, D, seed=5)
    acc, cnt = 0.0, 0
    for b, n in enumerate(LENGTHS):
        for i in range(n):
            a, c = s[b, i].tolist(), t[b, i].tolist()
            dot = sum(x * y for x, y in zip(a, c))
            acc += 1 - dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in c)))
            cnt += 1
    assert cosine_loss(s, t, mask_of(LENGTHS)).item() == pytest.approx(acc / cnt, rel=1e-10)
    assert cosine_loss(s, 2.5 * s, mask_of(LENGTHS)).item() == pytest.approx(0.0, abs=1e-12)
    sg, tg = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    cosine_loss(sg, tg, mask_of(LENGTHS)).backward()
    assert sg.grad.abs().sum() > 0 and tg.grad is None
    with pytest.raises(ValueError, match="equal hidden sizes"):
        cosine_loss(s, rnd(B, T, D + 2, seed=6), mask_of(LENGTHS))

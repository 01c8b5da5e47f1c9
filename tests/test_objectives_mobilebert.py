"""MobileBERT objectives vs independent float64 loop implementations of eqs. 2-4 (padding included)."""

import math

import pytest
import torch

from distillery.objectives import attention_transfer_loss, feature_map_loss, pretraining_distillation_loss

LENGTHS = [5, 3, 2]
B, T, N = len(LENGTHS), 5, 4


def mask_of(lengths, t=T):
    return torch.tensor([[1] * n + [0] * (t - n) for n in lengths])


def rnd(*shape, seed, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift


def stats(row):
    mu = sum(row) / len(row)
    return mu, sum((v - mu) ** 2 for v in row) / len(row)


def ref_feature_map(s, t, lengths, normalized=False, beta=0.0, gamma=0.0, eps=1e-3):
    s, t = s.tolist(), t.tolist()
    per_b = []
    for b, n in enumerate(lengths):
        acc = mean_acc = var_acc = 0.0
        for i in range(n):
            a, c = s[b][i], t[b][i]
            if normalized:
                (ma, va), (mc, vc) = stats(a), stats(c)
                an = [(v - ma) / math.sqrt(va + eps) for v in a]
                cn = [(v - mc) / math.sqrt(vc + eps) for v in c]
                acc += sum((x - y) ** 2 for x, y in zip(an, cn)) / len(a)
                mean_acc += (ma - mc) ** 2
                var_acc += abs(va - vc)
            else:
                acc += sum((x - y) ** 2 for x, y in zip(a, c)) / len(a)
        per_b.append((acc + beta * mean_acc + gamma * var_acc) / n)
    return sum(per_b) / len(per_b)


def test_feature_map_loss_matches_reference():
    s = [rnd(B, T, N, seed=i) for i in range(2)]
    t = [rnd(B, T, N, seed=10 + i, scale=2) for i in range(2)]
    m = mask_of(LENGTHS)
    ref = sum(ref_feature_map(a, b, LENGTHS) for a, b in zip(s, t))
    assert feature_map_loss(s, t, m).item() == pytest.approx(ref, rel=1e-10)


def test_feature_map_loss_normalized_matches_reference():
    s = rnd(B, T, N, seed=1, scale=0.5, shift=0.3)
    t = rnd(B, T, N, seed=2, scale=2.0, shift=-1.0)
    m = mask_of(LENGTHS)
    got = feature_map_loss(s, t, m, normalized=True).item()
    assert got == pytest.approx(ref_feature_map(s, t, LENGTHS, True, 50.0, 0.05), rel=1e-10)
    got2 = feature_map_loss(s, t, m, normalized=True, mean_var_weight=(2.0, 3.0)).item()
    assert got2 == pytest.approx(ref_feature_map(s, t, LENGTHS, True, 2.0, 3.0), rel=1e-10)
    # scale/shift invariance of the normalised term alone
    only_norm = feature_map_loss(s, 3 * s + 1, m, normalized=True, mean_var_weight=0.0).item()
    assert only_norm < 1e-3


def test_feature_map_loss_ignores_padding_and_grads():
    s, t = rnd(B, T, N, seed=1), rnd(B, T, N, seed=2)
    s2 = s.clone()
    s2[1, 3:] = 100.0
    m = mask_of(LENGTHS)
    for norm in (False, True):
        assert feature_map_loss(s2, t, m, normalized=norm).item() == pytest.approx(
            feature_map_loss(s, t, m, normalized=norm).item(), rel=1e-12
        )
    assert feature_map_loss(s, s.clone(), m, normalized=True).item() == 0.0
    sg, tg = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    feature_map_loss(sg, tg, m, normalized=True).backward()
    assert sg.grad.abs().sum() > 0 and tg.grad is None
    with pytest.raises(ValueError, match="shape"):
        feature_map_loss(s, rnd(B, T, N + 1, seed=3), m)


def test_attention_transfer_loss_matches_reference():
    A = 2
    mk = mask_of(LENGTHS)[:, None, None, :] == 0
    sp = rnd(B, A, T, T, seed=1, scale=2).masked_fill(mk, float("-inf")).softmax(-1)
    tp = rnd(B, A, T, T, seed=2, scale=2).masked_fill(mk, float("-inf")).softmax(-1)
    per_b = []
    for b, n in enumerate(LENGTHS):
        acc = 0.0
        for a in range(A):
            for q in range(n):
                acc += sum(tp[b, a, q, k].item() * math.log(tp[b, a, q, k].item() / sp[b, a, q, k].item()) for k in range(n))
        per_b.append(acc / (A * n))
    got = attention_transfer_loss([sp], [tp], mask_of(LENGTHS)).item()
    assert got == pytest.approx(sum(per_b) / B, rel=1e-10)
    with pytest.raises(ValueError, match="heads"):
        attention_transfer_loss([sp], [tp[:, :1]], mask_of(LENGTHS))


def ref_pd(s, t, labels, alpha, temp, nsp=None, nsp_labels=None):
    mlm = kd = 0.0
    cnt = 0
    for b in range(s.shape[0]):
        for i in range(s.shape[1]):
            y = int(labels[b, i])
            if y == -100:
                continue
            cnt += 1
            row = s[b, i].tolist()
            lse = math.log(sum(math.exp(v) for v in row))
            mlm += -(row[y] - lse)
            zs = [v / temp for v in row]
            zt = [v / temp for v in t[b, i].tolist()]
            lse_s = math.log(sum(math.exp(v) for v in zs))
            pt = [math.exp(v) for v in zt]
            pt = [v / sum(pt) for v in pt]
            kd += -sum(p * (v - lse_s) for p, v in zip(pt, zs))
    loss = alpha * mlm / cnt + (1 - alpha) * kd / cnt
    if nsp is not None:
        acc = 0.0
        for b in range(nsp.shape[0]):
            row = nsp[b].tolist()
            acc += -(row[int(nsp_labels[b])] - math.log(sum(math.exp(v) for v in row)))
        loss += acc / nsp.shape[0]
    return loss


@pytest.mark.parametrize("temp", [1.0, 2.0])
def test_pretraining_distillation_loss_matches_reference(temp):
    V = 7
    s, t = rnd(B, T, V, seed=1), rnd(B, T, V, seed=2)
    labels = torch.full((B, T), -100)
    labels[0, 1], labels[0, 3], labels[1, 0], labels[2, 1] = 3, 6, 0, 2
    nsp, nsp_labels = rnd(B, 2, seed=3), torch.tensor([0, 1, 1])
    got = pretraining_distillation_loss(s, t, labels, 0.5, temperature=temp).item()
    assert got == pytest.approx(ref_pd(s, t, labels, 0.5, temp), rel=1e-10)
    got = pretraining_distillation_loss(s, t, labels, 0.3, nsp, nsp_labels, temperature=temp).item()
    assert got == pytest.approx(ref_pd(s, t, labels, 0.3, temp, nsp, nsp_labels), rel=1e-10)


def test_pretraining_distillation_equals_official_mixed_target_and_errors():
    V = 7
    s, t = rnd(B, T, V, seed=1), rnd(B, T, V, seed=2)
    labels = torch.full((B, T), -100)
    labels[0, 2], labels[1, 1] = 4, 5
    sel = labels != -100
    target = 0.5 * torch.nn.functional.one_hot(labels[sel], V).double() + 0.5 * t[sel].softmax(-1)
    official = -(target * s[sel].log_softmax(-1)).sum(-1).mean()
    assert pretraining_distillation_loss(s, t, labels, 0.5).item() == pytest.approx(official.item(), rel=1e-10)
    none = torch.full((B, T), -100)
    sg = s.clone().requires_grad_(True)
    z = pretraining_distillation_loss(sg, t, none, 0.5)
    assert z.item() == 0.0 and z.requires_grad
    with pytest.raises(ValueError, match="alpha"):
        pretraining_distillation_loss(s, t, labels, 1.5)
    with pytest.raises(ValueError, match="nsp_labels"):
        pretraining_distillation_loss(s, t, labels, 0.5, rnd(B, 2, seed=4))

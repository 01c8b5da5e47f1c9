"""MiniLM objectives vs independent float64 loop implementations of eqs. 6-9 and the v2 relation KL."""

import math

import numpy as np
import pytest
import torch

from distillery.objectives import attention_kl, relation_kl, value_relation_kl

LENGTHS = [5, 3, 2]
B, H, T = len(LENGTHS), 2, 5


def mask_of(lengths, t=T):
    return torch.tensor([[1] * n + [0] * (t - n) for n in lengths])


def rnd(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def probs_from_scores(scores, lengths):
    """What capture returns: softmax over keys with padded keys masked (probability 0)."""
    m = mask_of(lengths)[:, None, None, :] == 0
    return scores.masked_fill(m, float("-inf")).softmax(-1)


def np_softmax(row):
    mx = max(row)
    e = [math.exp(v - mx) for v in row]
    return [v / sum(e) for v in e]


def np_kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


def ref_attention_kl(s_probs, t_probs, lengths):
    s, t = s_probs.numpy(), t_probs.numpy()
    per_b = []
    for b, n in enumerate(lengths):
        acc = 0.0
        for h in range(s.shape[1]):
            for q in range(n):
                acc += np_kl(list(t[b, h, q, :n]), list(s[b, h, q, :n]))
        per_b.append(acc / (s.shape[1] * n))
    return sum(per_b) / len(per_b)


def ref_relation(x, n):
    """x: (T, d) numpy -> rows softmax(x x^T / sqrt(d)) restricted to the first n tokens."""
    d = x.shape[1]
    rows = []
    for q in range(n):
        rows.append(np_softmax([sum(x[q, i] * x[k, i] for i in range(d)) / math.sqrt(d) for k in range(n)]))
    return rows


def ref_value_relation_kl(sv, tv, lengths):
    s, t = sv.numpy(), tv.numpy()
    per_b = []
    for b, n in enumerate(lengths):
        acc = 0.0
        for h in range(s.shape[1]):
            rs, rt = ref_relation(s[b, h], n), ref_relation(t[b, h], n)
            acc += sum(np_kl(rt[q], rs[q]) for q in range(n))
        per_b.append(acc / (s.shape[1] * n))
    return sum(per_b) / len(per_b)


def ref_regroup(x, r):
    """(B, H, T, d) -> list over b of list over relation heads of (T, D/r) arrays, via explicit concat."""
    x = x.numpy()
    bsz, h, t, d = x.shape
    out = []
    for b in range(bsz):
        concat = np.zeros((t, h * d))
        for hh in range(h):
            for i in range(d):
                concat[:, hh * d + i] = x[b, hh, :, i]
        w = (h * d) // r
        out.append([concat[:, j * w:(j + 1) * w] for j in range(r)])
    return out


def ref_relation_kl(sx, tx, lengths, r):
    s, t = ref_regroup(sx, r), ref_regroup(tx, r)
    per_b = []
    for b, n in enumerate(lengths):
        acc = 0.0
        for j in range(r):
            rs, rt = ref_relation(s[b][j], n), ref_relation(t[b][j], n)
            acc += sum(np_kl(rt[q], rs[q]) for q in range(n))
        per_b.append(acc / (r * n))
    return sum(per_b) / len(per_b)


def test_attention_kl_matches_reference_with_padding():
    sp = probs_from_scores(rnd(B, H, T, T, seed=1, scale=2), LENGTHS)
    tp = probs_from_scores(rnd(B, H, T, T, seed=2, scale=2), LENGTHS)
    got = attention_kl(sp, tp, mask_of(LENGTHS))
    assert got.item() == pytest.approx(ref_attention_kl(sp, tp, LENGTHS), rel=1e-10)
    # lists over layers are summed
    two = attention_kl([sp, tp], [tp, sp], mask_of(LENGTHS)).item()
    ref2 = ref_attention_kl(sp, tp, LENGTHS) + ref_attention_kl(tp, sp, LENGTHS)
    assert two == pytest.approx(ref2, rel=1e-10)


def test_attention_kl_ignores_padded_query_rows():
    sp = probs_from_scores(rnd(B, H, T, T, seed=1), LENGTHS)
    tp = probs_from_scores(rnd(B, H, T, T, seed=2), LENGTHS)
    sp2 = sp.clone()
    sp2[1, :, 4, :3] = torch.tensor([0.98, 0.01, 0.01], dtype=torch.float64)  # padded query row 4 of seq 1
    m = mask_of(LENGTHS)
    assert attention_kl(sp2, tp, m).item() == pytest.approx(attention_kl(sp, tp, m).item(), rel=1e-12)


def test_attention_kl_zero_when_equal_grad_student_only_and_head_mismatch():
    sc = rnd(B, H, T, T, seed=3).requires_grad_(True)
    sp = probs_from_scores(sc, LENGTHS)
    assert attention_kl(sp, sp.detach(), mask_of(LENGTHS)).item() == pytest.approx(0.0, abs=1e-14)
    tc = rnd(B, H, T, T, seed=4).requires_grad_(True)
    loss = attention_kl(sp, probs_from_scores(tc, LENGTHS), mask_of(LENGTHS))
    loss.backward()
    assert torch.isfinite(sc.grad).all() and sc.grad.abs().sum() > 0
    assert tc.grad is None
    with pytest.raises(ValueError, match="heads"):
        attention_kl(sp, probs_from_scores(rnd(B, 4, T, T, seed=5), LENGTHS), mask_of(LENGTHS))


def test_value_relation_kl_matches_reference_with_different_widths():
    sv = rnd(B, H, T, 3, seed=1, scale=1.5)  # student d_head 3
    tv = rnd(B, H, T, 5, seed=2, scale=1.5)  # teacher d_head 5
    got = value_relation_kl(sv, tv, mask_of(LENGTHS))
    assert got.item() == pytest.approx(ref_value_relation_kl(sv, tv, LENGTHS), rel=1e-10)


def test_value_relation_kl_padding_values_do_not_matter_and_errors():
    sv, tv = rnd(B, H, T, 3, seed=1), rnd(B, H, T, 5, seed=2)
    sv2 = sv.clone()
    sv2[2, :, 2:, :] = 1e3  # garbage in padded positions
    m = mask_of(LENGTHS)
    assert value_relation_kl(sv2, tv, m).item() == pytest.approx(value_relation_kl(sv, tv, m).item(), rel=1e-12)
    assert value_relation_kl(sv, sv.clone(), m).item() == pytest.approx(0.0, abs=1e-14)
    with pytest.raises(ValueError, match="heads"):
        value_relation_kl(sv, rnd(B, 3, T, 5, seed=3), m)
    s = sv.clone().requires_grad_(True)
    t = tv.clone().requires_grad_(True)
    value_relation_kl(s, t, m).backward()
    assert s.grad.abs().sum() > 0 and t.grad is None


def test_relation_kl_matches_reference_with_different_head_counts():
    sx = rnd(B, 2, T, 6, seed=1)  # student: 2 heads x 6 = 12
    tx = rnd(B, 4, T, 6, seed=2)  # teacher: 4 heads x 6 = 24
    got = relation_kl(sx, tx, mask_of(LENGTHS), 3)
    assert got.item() == pytest.approx(ref_relation_kl(sx, tx, LENGTHS, 3), rel=1e-10)
    # the (B, T, D) form gives the same result as the per-head form
    flat = tx.transpose(1, 2).reshape(B, T, 24)
    assert relation_kl(sx, flat, mask_of(LENGTHS), 3).item() == pytest.approx(got.item(), rel=1e-12)


def test_relation_kl_errors_and_zero():
    sx = rnd(B, 2, T, 6, seed=1)
    assert relation_kl(sx, sx.clone(), mask_of(LENGTHS), 4).item() == pytest.approx(0.0, abs=1e-14)
    with pytest.raises(ValueError, match="not divisible"):
        relation_kl(sx, rnd(B, 4, T, 6, seed=2), mask_of(LENGTHS), 5)
    with pytest.raises(ValueError, match="n_relation_heads"):
        relation_kl(sx, sx, mask_of(LENGTHS), 0)

"""Objectives on tensors captured from tiny BERT models: TinyBERT + MiniLM losses train the student only."""

import pytest
import torch
import transformers

from distillery.capture import capture
from distillery.objectives import (
    HiddenProjection,
    ObjectiveWeights,
    attention_kl,
    attention_loss,
    embedding_loss,
    hidden_loss,
    relation_kl,
    value_relation_kl,
)


def tiny_bert(layers, hidden, heads, seed):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=2 * hidden, max_position_embeddings=16, attn_implementation="sdpa",
    )
    return transformers.BertModel(cfg, add_pooling_layer=False)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (3, 7), generator=g)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    return ids, mask


def test_tinybert_losses_on_captured_tensors_train_student_only(batch):
    ids, mask = batch
    teacher = tiny_bert(4, 32, 2, seed=1).eval()
    student = tiny_bert(2, 16, 2, seed=2).train()
    proj = HiddenProjection(16, 32)
    with torch.no_grad(), capture(teacher, hidden=(0, 2, 4), scores=(1, 3)) as tc:
        teacher(input_ids=ids, attention_mask=mask)
    with capture(student, hidden=(0, 1, 2), scores=(0, 1)) as sc:
        student(input_ids=ids, attention_mask=mask)
    losses = {
        "attention_loss": attention_loss([sc.scores[0], sc.scores[1]], [tc.scores[1], tc.scores[3]], mask),
        "hidden_loss": hidden_loss([sc.hidden[1], sc.hidden[2]], [tc.hidden[2], tc.hidden[4]], proj, indices=[1, 2]),
        "embedding_loss": embedding_loss(sc.hidden[0], tc.hidden[0], proj),
    }
    total = ObjectiveWeights({"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}).combine(losses)
    assert torch.isfinite(total) and total.item() > 0
    total.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert proj.layers[0].weight.grad.abs().sum() > 0
    q = student.encoder.layer[0].attention.self.query.weight
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_minilm_losses_on_captured_tensors_zero_for_same_model(batch):
    ids, mask = batch
    teacher = tiny_bert(2, 32, 4, seed=3).eval()
    with torch.no_grad(), capture(teacher, probs=(1,), values=(1,)) as a:
        teacher(input_ids=ids, attention_mask=mask)
    p, v = a.probs[1].clone(), a.values[1].clone()
    with torch.no_grad(), capture(teacher, probs=(1,), values=(1,)) as b:
        teacher(input_ids=ids, attention_mask=mask)
    assert attention_kl(b.probs[1], p, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert value_relation_kl(b.values[1], v, mask).item() == pytest.approx(0.0, abs=1e-6)
    # a 2-head, 16-wide student against the 4-head teacher: only relation heads make them comparable
    student = tiny_bert(2, 16, 2, seed=4)
    with capture(student, probs=(1,), values=(1,)) as s:
        student(input_ids=ids, attention_mask=mask)
    with pytest.raises(ValueError, match="heads"):
        attention_kl(s.probs[1], p, mask)
    loss = relation_kl(s.values[1], v, mask, 4)
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    assert student.encoder.layer[1].attention.self.value.weight.grad.abs().sum() > 0

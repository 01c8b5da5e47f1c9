"""A MobileBERT student cut from its converted IB teacher (`distillery.ib_pruning`, `init: pruned`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers as tr

from distillery.ib_pruning import BlockImportance, measure_block_importance, prune_ib_teacher
from distillery.ib_teacher import convert_bert
from distillery.models import build_student
from distillery.pruning import PruningError
from distillery.recipes import MobileBertRecipe, RecipeError
from distillery.recipes.base import Shape
from distillery.shape import Dims

VOCAB = 60
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _shape(intra: int, intermediate: int, **extra):
    shape = Shape(preset="mobilebert-tiny-no-opt", layers=3, hidden=32, heads=2, intermediate=intermediate,
                  intra=intra, embedding=32, ffns=1).resolve()
    return replace(shape, extra={**shape.extra, **NO_DROPOUT, **extra})


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    model = tr.BertForMaskedLM(tr.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                             **NO_DROPOUT)).eval()
    with torch.no_grad():  # non-trivial LayerNorm affines, as a trained teacher's
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.2)
    return model


def _batches(n: int = 3):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(5, VOCAB, (4, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[0, -5:] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def _cut(bert, intra: int, intermediate: int):
    shape = _shape(intra, intermediate)
    ib = convert_bert(bert, shape).eval()
    importance = measure_block_importance(ib, _batches())
    student = build_student(shape, VOCAB, head="mlm", base=ib.config).eval()
    return ib, importance, prune_ib_teacher(ib, student, importance)


def test_cutting_nothing_gives_the_teacher_back(bert):
    """At the teacher's own widths the cut copies every weight: the student computes what the converted teacher (and
    so the BERT teacher) computes."""
    ib, _, student = _cut(bert, 32, 64)
    batch = _batches(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(student(**batch).logits, ib(**batch).logits, rtol=0, atol=1e-5)
        assert (student(**batch).logits - bert(**batch).logits).abs().max() < 2e-3


def test_kept_slices_are_the_teachers_most_important(bert):
    ib, imp, student = _cut(bert, 16, 24)
    ch = torch.sort(torch.topk(imp.channels, 16).indices).values
    for i in range(3):
        t, s = ib.mobilebert.encoder.layer[i], student.mobilebert.encoder.layer[i]
        neurons = torch.sort(torch.topk(imp.neurons[i], 24).indices).values
        torch.testing.assert_close(s.intermediate.dense.weight, t.intermediate.dense.weight[neurons][:, ch])
        torch.testing.assert_close(s.output.dense.weight, t.output.dense.weight[ch][:, neurons])
        torch.testing.assert_close(s.bottleneck.input.dense.weight, t.bottleneck.input.dense.weight[ch])
        torch.testing.assert_close(s.output.bottleneck.dense.weight, t.output.bottleneck.dense.weight[:, ch])
        # each head keeps 8 of its 16 dimensions; the queries scaled by sqrt(8 / 16)
        v = torch.cat([h * 16 + torch.sort(torch.topk(imp.v[i][h], 8).indices).values for h in range(2)])
        qk = torch.cat([h * 16 + torch.sort(torch.topk(imp.qk[i][h], 8).indices).values for h in range(2)])
        torch.testing.assert_close(s.attention.self.value.weight, t.attention.self.value.weight[v][:, ch])
        torch.testing.assert_close(s.attention.self.key.weight, t.attention.self.key.weight[qk][:, ch])
        torch.testing.assert_close(s.attention.self.query.weight, t.attention.self.query.weight[qk][:, ch] * 0.5 ** 0.5)
        torch.testing.assert_close(s.attention.output.dense.weight, t.attention.output.dense.weight[ch][:, v])
    torch.testing.assert_close(student.mobilebert.embeddings.word_embeddings.weight,
                               ib.mobilebert.embeddings.word_embeddings.weight)
    torch.testing.assert_close(student.cls.predictions.transform.dense.weight,
                               ib.cls.predictions.transform.dense.weight)


def test_importance_order_on_a_hand_made_case(bert):
    """Hand-set scores: the cut keeps exactly the channels, dimensions and neurons with the largest ones."""
    shape = _shape(16, 24)
    ib = convert_bert(bert, shape).eval()
    channels = torch.zeros(32)
    channels[[3, 7, 9, 11, 13, 17, 19, 21, 23, 25, 27, 28, 29, 30, 31, 0]] = 1.0
    qk = {i: torch.arange(32.0).reshape(2, 16).flip(1) for i in range(3)}   # the first 8 of each head
    v = {i: torch.arange(32.0).reshape(2, 16) for i in range(3)}            # the last 8 of each head
    neurons = {i: torch.arange(64.0) for i in range(3)}                     # the last 24
    imp = BlockImportance(channels, qk, v, neurons)
    student = prune_ib_teacher(ib, build_student(shape, VOCAB, head="mlm", base=ib.config), imp)
    t, s = ib.mobilebert.encoder.layer[1], student.mobilebert.encoder.layer[1]
    keep = torch.tensor(sorted([3, 7, 9, 11, 13, 17, 19, 21, 23, 25, 27, 28, 29, 30, 31, 0]))
    torch.testing.assert_close(s.attention.output.LayerNorm.weight, t.attention.output.LayerNorm.weight[keep])
    torch.testing.assert_close(s.attention.self.key.bias, t.attention.self.key.bias[[*range(8), *range(16, 24)]])
    torch.testing.assert_close(s.attention.self.value.bias, t.attention.self.value.bias[[*range(8, 16), *range(24, 32)]])
    torch.testing.assert_close(s.intermediate.dense.bias, t.intermediate.dense.bias[40:])


def test_measured_importance_reads_real_tokens_only(bert):
    """Padding does not count: the same sequences padded further give the same scores."""
    shape = _shape(16, 24)
    ib = convert_bert(bert, shape).eval()
    short = _batches(2)
    long = [{"input_ids": torch.cat([b["input_ids"], torch.full((4, 6), 7)], 1),
             "attention_mask": torch.cat([b["attention_mask"], torch.zeros(4, 6, dtype=torch.long)], 1)} for b in short]
    a, b = measure_block_importance(ib, short), measure_block_importance(ib, long)
    torch.testing.assert_close(a.channels, b.channels, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.neurons[2], b.neurons[2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.qk[0], b.qk[0], rtol=1e-5, atol=1e-6)


def test_cut_refuses_another_layout(bert):
    ib = convert_bert(bert, _shape(16, 24)).eval()
    imp = measure_block_importance(ib, _batches(1))
    other = build_student(_shape(16, 24, normalization_type="no_norm"), VOCAB, head="mlm", base=ib.config)
    with pytest.raises(PruningError, match="normalization_type no_norm != layer_norm"):
        prune_ib_teacher(ib, other, imp)
    with pytest.raises(PruningError, match="with bottlenecks"):
        measure_block_importance(bert, _batches(1))


def test_recipe_checks_a_pruned_mobilebert_student():
    teacher = Dims(6, 384, 12, 1536, 30522, "bert")
    good = {"preset": "mobilebert-tiny-no-opt", "layers": 6, "hidden": 384, "heads": 12, "intermediate": 768,
            "intra": 96, "embedding": 384, "ffns": 1}
    MobileBertRecipe(shape=good, init="pruned", general_distillation=True).check(teacher, "students.mb")
    for change, needs in [({"ffns": 2}, "ffns 1"), ({"preset": "mobilebert-tiny"}, "layer_norm"),
                          ({"hidden": 256}, "hidden 384"), ({"intra": 768}, "intra <= 384")]:
        with pytest.raises(RecipeError, match=rf"students\.mb\.init: pruned .*{needs}"):
            MobileBertRecipe(shape={**good, **change}, init="pruned", general_distillation=True).check(
                teacher, "students.mb")
    with pytest.raises(RecipeError, match="general_distillation: true"):
        MobileBertRecipe(shape=good, init="pruned").check(teacher, "students.mb")


def test_recipe_starts_the_transfer_and_the_direct_baseline_from_the_same_cut(bert, tmp_path):
    """The transfer stage cuts the MLM teacher (its directory); the direct baseline cuts the pre-trained teacher
    loaded with the task's head (no MLM head): on the same sample, the same encoder weights."""
    import datasets

    from distillery.recipes.base import StageContext

    bert.save_pretrained(tmp_path / "mlm")
    recipe = MobileBertRecipe(shape={"preset": "mobilebert-tiny-no-opt", "layers": 3, "hidden": 32, "heads": 2,
                                     "intermediate": 24, "intra": 16, "embedding": 32, "ffns": 1},
                              init={"pruned": {"samples": 8}}, general_distillation=True)
    recipe.check(Dims(3, 32, 2, 64, VOCAB, "bert"), "students.mb")
    rows = [{"input_ids": b["input_ids"][i].tolist(), "attention_mask": b["attention_mask"][i].tolist()}
            for b in _batches(2) for i in range(4)]
    data = datasets.Dataset.from_list(rows)
    tok = tr.BertTokenizerFast(vocab={t: i for i, t in enumerate(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)])})
    ctx = StageContext(student="mb", teacher=str(tmp_path / "mlm"), corpus=tmp_path / "c.txt", out=tmp_path / "out",
                       schedule=None, args={}, seed=0)
    transfer = recipe._transfer_start(ctx, None, tok, data)
    assert type(transfer).__name__ == "MobileBertForPreTraining"
    task_teacher = tr.BertForSequenceClassification.from_pretrained(tmp_path / "mlm", num_labels=3)
    direct = recipe.start_student(task_teacher, tok, head="sequence-classification", data=data, num_labels=3)
    assert direct.config.num_labels == 3
    a, b = transfer.mobilebert.state_dict(), direct.mobilebert.state_dict()
    for key in a:
        if "pooler" not in key:
            torch.testing.assert_close(a[key], b[key], msg=key)
    torch.testing.assert_close(transfer.cls.predictions.transform.dense.weight,
                               convert_bert(bert, recipe.shape.resolve()).cls.predictions.transform.dense.weight)

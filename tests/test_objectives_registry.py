"""The loss-term registry: every objective registered once next to its equation, valid levels, capture of only what
the active terms read, unknown names refused, and a new term (a function + one registration) trained end to end by
`distill` without touching the training code."""

from __future__ import annotations

import pytest
import torch
import transformers

import distillery.objectives as objectives
from distillery.layer_map import LayerMap, build_layer_map
from distillery.objectives import (
    TERMS,
    Batch,
    LossOptions,
    ObjectiveConfigError,
    ObjectiveWeights,
    capture_specs,
    register_term,
    level_terms,
    unregister_term,
)
from distillery.objectives.registry import LEVELS
from distillery.training.distill import Distiller, distill
from distillery.training.log import read_log
from distillery.training.spec import DistillSpec, TrainRun

from helpers import FAST, bert_config, classifier, encoded, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)

#: name -> (paper module, levels)
EXPECTED = {
    "attention_loss": ("tinybert", {"intermediate"}),
    "hidden_loss": ("tinybert", {"intermediate"}),
    "embedding_loss": ("tinybert", {"intermediate"}),
    "prediction_loss": ("tinybert", {"prediction"}),
    "regression_prediction_loss": ("tinybert", {"prediction"}),
    "attention_kl": ("minilm", {"intermediate"}),
    "value_relation_kl": ("minilm", {"intermediate"}),
    "relation_kl": ("minilm", {"intermediate"}),
    "feature_map_loss": ("mobilebert", {"intermediate", "pretraining"}),
    "attention_transfer_loss": ("mobilebert", {"intermediate", "pretraining"}),
    "pretraining_distillation_loss": ("mobilebert", {"pretraining"}),
    "soft_target_loss": ("distilbert", {"pretraining"}),
    "mlm_loss": ("distilbert", {"pretraining"}),
    "cosine_loss": ("distilbert", {"pretraining"}),
}


def test_every_term_is_registered_once_next_to_its_equation():
    import importlib

    assert set(EXPECTED) <= set(TERMS)
    computes = [t.compute for t in TERMS.values()]
    assert len(set(computes)) == len(computes)  # one adapter per term
    for name, term in TERMS.items():  # (papers added later included)
        module = importlib.import_module(term.compute.__module__)
        assert module.__name__.startswith("distillery.objectives.") and term.name == name and term.paper
        assert callable(getattr(module, name)) and getattr(module, name).__module__ == module.__name__  # its equation
    for name, (module, levels) in EXPECTED.items():
        term = TERMS[name]
        assert term.compute.__module__ == f"distillery.objectives.{module}"
        assert getattr(objectives, name).__module__ == f"distillery.objectives.{module}"  # exported
        assert set(term.levels) == levels
    with pytest.raises(ValueError, match="registered twice"):
        register_term("attention_loss", levels=("intermediate",))(lambda batch: torch.zeros(()))


def test_levels_and_features_are_valid():
    for term in TERMS.values():
        assert term.levels and set(term.levels) <= set(LEVELS), term.name
    # layer-wise terms read mapped layers, logit terms the teacher's logits
    for name in level_terms("intermediate"):
        assert TERMS[name].features, name
    four = {n: TERMS[n] for n in EXPECTED}  # the four papers'
    assert {n for n, t in four.items() if t.features} == set(level_terms("intermediate")) | {"cosine_loss"}
    options = LossOptions()
    student = classifier(40, 1)
    assert {n for n, t in four.items() if t.reads_teacher_logits(options, student)} == {
        "prediction_loss", "regression_prediction_loss", "pretraining_distillation_loss", "soft_target_loss"}
    assert {n for n, t in four.items() if t.projection} == {"hidden_loss", "embedding_loss"}
    assert {n for n, t in four.items() if t.head_wise} == {
        "attention_loss", "attention_kl", "value_relation_kl", "attention_transfer_loss"}
    with pytest.raises(ValueError, match="levels"):
        register_term("toy", levels=("both",))
    with pytest.raises(ValueError, match="feature"):
        register_term("toy", levels=("intermediate",), features=(("attentions", "attention"),))
    assert "toy" not in TERMS


def test_capture_specs_ask_only_for_what_the_active_terms_read():
    lm = build_layer_map("uniform", 2, 4)  # hidden (0,0) (1,2) (2,4); attention (0,1) (1,3)
    assert capture_specs(["attention_loss"], lm) == ({"scores": (0, 1)}, {"scores": (1, 3)})
    assert capture_specs(["hidden_loss"], lm) == ({"hidden": (1, 2)}, {"hidden": (2, 4)})
    assert capture_specs(["embedding_loss"], lm) == ({"hidden": (0,)}, {"hidden": (0,)})
    assert capture_specs(["attention_loss", "hidden_loss", "embedding_loss"], lm) == (
        {"scores": (0, 1), "hidden": (0, 1, 2)}, {"scores": (1, 3), "hidden": (0, 2, 4)})
    assert capture_specs(["attention_kl", "value_relation_kl"], lm) == (
        {"probs": (0, 1), "values": (0, 1)}, {"probs": (1, 3), "values": (1, 3)})
    qkv = capture_specs(["relation_kl"], LayerMap(attention=((1, 3),)))
    assert qkv == ({k: (1,) for k in ("queries", "keys", "values")}, {k: (3,) for k in ("queries", "keys", "values")})
    assert capture_specs(["prediction_loss", "soft_target_loss", "mlm_loss"], lm) == ({}, {})
    # DistilBERT's cosine loss reads the last hidden states through the layer map
    assert capture_specs(["soft_target_loss", "cosine_loss"], LayerMap(hidden=((2, 4),))) == (
        {"hidden": (2,)}, {"hidden": (4,)})
    # the Distiller captures exactly that
    spec = DistillSpec({"attention_kl": 1.0}, "intermediate", lm)
    model = Distiller(classifier(40, 2), classifier(40, 4), spec)
    assert (model._student_cap, model._teacher_cap) == ({"probs": (0, 1)}, {"probs": (1, 3)})


def test_unknown_names_are_refused():
    with pytest.raises(ObjectiveConfigError, match="unknown key 'toy'"):
        ObjectiveWeights({"toy": 1.0})
    with pytest.raises(ObjectiveConfigError, match="unknown key 'toy'"):
        DistillSpec({"toy": 1.0}, "intermediate")
    with pytest.raises(KeyError, match="toy"):  # internal: its names come from validated weights
        capture_specs(["toy"], LayerMap())
    with pytest.raises(KeyError, match="toy"):
        unregister_term("toy")


class Counter:
    """Counts the teacher's forwards."""

    def __init__(self, model):
        self.n = 0
        model.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))


def test_the_teacher_runs_only_when_a_term_needs_it():
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(5, 40, (4, 8), generator=g), "attention_mask": torch.ones(4, 8, dtype=torch.long)}
    teacher = classifier(40, 4, seed=1).eval()
    counter = Counter(teacher)
    # layer-wise terms read the teacher's internals
    Distiller(classifier(40, 2), teacher, DistillSpec({"hidden_loss": 1.0}, "intermediate",
                                                      build_layer_map("uniform", 2, 4))).train()(**batch)
    assert counter.n == 1
    # logits from a cached column: no teacher forward
    prediction = DistillSpec({"prediction_loss": 1.0}, "prediction")
    out = Distiller(classifier(40, 2), teacher, prediction).train()(**batch, teacher_logits=torch.zeros(4, 2))
    assert counter.n == 1 and torch.isfinite(out.loss)
    Distiller(classifier(40, 2), teacher, prediction).train()(**batch)
    assert counter.n == 2
    # a regression head trained on gold labels reads no teacher (the official code's STS-B step 2)
    torch.manual_seed(0)
    reg = transformers.BertForSequenceClassification(bert_config(40, 2, num_labels=1))
    gold = prediction.with_(options=LossOptions(regression_target="gold"))
    out = Distiller(reg, teacher, gold).train()(**batch, labels=torch.rand(4))
    assert counter.n == 2 and set(out.terms) == {"prediction_loss"}
    with pytest.raises(ObjectiveConfigError, match="one-output"):
        Distiller(classifier(40, 2), teacher, DistillSpec({"regression_prediction_loss": 1.0}, "prediction")).train()(
            **batch)


@pytest.fixture
def toy_term():
    """MAE between mapped hidden states: a loss the training code has never heard of, registered for one test."""

    @register_term("toy_hidden_mae", levels=("intermediate",), features=(("hidden", "states"),), paper="a test")
    def compute(batch: Batch) -> torch.Tensor:
        s, t = batch.select("hidden", "states")
        return sum((a - b.detach()).abs().mean() for a, b in zip(s, t))

    yield compute
    unregister_term("toy_hidden_mae")
    assert "toy_hidden_mae" not in TERMS


def test_a_new_term_is_summed_by_distill_end_to_end(toy_term, tmp_path):
    tok = tokenizer(tmp_path)
    teacher = classifier(tok.vocab_size, 4, seed=1).eval()
    lm = build_layer_map("uniform", 2, 4)
    # the weighted sum, on one batch: 2 x toy + 1 x hidden_loss
    student = classifier(tok.vocab_size, 2, seed=2)
    spec = DistillSpec({"toy_hidden_mae": 2.0, "hidden_loss": 1.0}, "intermediate", lm)
    data = encoded(tok, 64, seed=3)
    batch = {k: torch.tensor(data[:8][k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    out = Distiller(student, teacher, spec).eval()(**batch)
    assert set(out.terms) == {"toy_hidden_mae", "hidden_loss"}
    with torch.no_grad():
        s = student(**batch, output_hidden_states=True).hidden_states
        t = teacher(**batch, output_hidden_states=True).hidden_states
    mae = sum((s[a] - t[b]).abs().mean() for a, b in ((1, 2), (2, 4)))
    torch.testing.assert_close(out.terms["toy_hidden_mae"], mae)
    torch.testing.assert_close(out.loss, 2 * out.terms["toy_hidden_mae"] + out.terms["hidden_loss"])
    # and trained by `distill`: logged per term, the loss going down
    run = TrainRun(tmp_path / "toy", data, tokenizer=tok,
                   args=dict(max_steps=12, learning_rate=5e-3, per_device_train_batch_size=16, save_strategy="no",
                             **{**FAST, "logging_steps": 1}))
    final = distill(teacher, classifier(tok.vocab_size, 2, seed=2), DistillSpec({"toy_hidden_mae": 1.0},
                                                                               "intermediate", lm), run)
    log = [r for r in read_log(final / "train_log.csv") if "loss" in r]
    toy = [r["train_toy_hidden_mae"] for r in log]
    assert len(toy) == 12 and toy[-1] < toy[0]
    assert all(r["loss"] == pytest.approx(r["train_toy_hidden_mae"], rel=1e-4) for r in log)
    assert transformers.AutoModelForSequenceClassification.from_pretrained(final) is not None

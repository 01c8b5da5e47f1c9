"""MobileBERT end to end (Sun et al., 2020): IB-BERT teacher, progressive / joint transfer, pre-training
distillation (eq. 4), the recipe's checks, and the paper's parameter counts. Tiny configs, CPU, seconds."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import datasets
import pytest
import torch
import transformers as tr

from distillery.corpus import sentence_pairs
from distillery.ib_teacher import IBShapeError, convert_bert, converted_shape, scratch_shape
from distillery.models import build_student, load_model, num_parameters
from distillery.objectives import LossOptions, attention_transfer_loss, feature_map_loss
from distillery.shape import Dims
from distillery.recipes import MobileBertRecipe, RecipeError
from distillery.shape import resolve_shape
from distillery.training.distill import Distiller, distill
from distillery.training.log import read_log
from distillery.training.pretraining_distillation import nsp_dataset
from distillery.training.progressive_transfer import (
    layer_wise_map,
    progressive_param_groups,
    progressive_transfer,
    student_from_teacher,
)
from distillery.training.spec import DistillSpec, TrainRun

VOCAB = 60
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
#: A 3-layer bottleneck student: inter-block 32, intra-block 8, 2 heads, 2 stacked FFNs (MobileBERT-tiny style).
STUDENT = resolve_shape({"preset": "mobilebert-tiny", "layers": 3, "hidden": 32, "heads": 2, "intermediate": 16,
                         "extra": {"intra_bottleneck_size": 8, "embedding_size": 32, **NO_DROPOUT}})


@pytest.fixture(scope="module")
def bert_teacher():
    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, **NO_DROPOUT)
    return tr.BertForMaskedLM(cfg).eval()


@pytest.fixture(scope="module")
def ib_teacher(bert_teacher):
    return convert_bert(bert_teacher, STUDENT).eval()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    words = [f"w{i}" for i in range(VOCAB - 5)]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
    tok = tr.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    assert len(tok) == VOCAB
    return tok


def _batch(seed: int = 0, batch: int = 4, length: int = 12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -4:] = 0  # one padded sequence
    return {"input_ids": ids, "attention_mask": mask}


# ------------------------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("name, paper_m", [("mobilebert", 25.3), ("mobilebert-tiny", 15.1), ("ib-bert-large", 293.0)])
def test_preset_parameter_counts_match_the_paper(name, paper_m):
    with torch.device("meta"):
        model = build_student(name, 30522)
    assert abs(num_parameters(model) / 1e6 - paper_m) / paper_m <= 0.05, (name, num_parameters(model))


def test_ib_bert_large_reads_the_inter_block_maps():
    """Official IB-BERT: query/key/value read the 512-d inter-block maps and project to the 1024-d intra block."""
    with torch.device("meta"):
        model = build_student("ib-bert-large", 30522)
    cfg, attn = model.config, model.encoder.layer[0].attention.self
    assert (cfg.hidden_size, cfg.true_hidden_size, cfg.num_attention_heads, cfg.num_feedforward_networks) == (
        512, 1024, 4, 1)
    for lin in (attn.query, attn.key, attn.value):
        assert (lin.in_features, lin.out_features) == (512, 1024)


def test_inter_block_attention_model_saves_and_loads(tmp_path):
    shape = scratch_shape(STUDENT)  # intra 64 = 2 x inter: query/key/value read the 32-d inter-block maps
    assert shape.extra["intra_bottleneck_size"] == 64 and not shape.extra["use_bottleneck_attention"]
    model = build_student(shape, VOCAB, head="mlm").eval()
    model.save_pretrained(tmp_path)
    with pytest.raises(Exception):  # transformers alone builds query/key for intra-block inputs
        tr.AutoModelForMaskedLM.from_pretrained(tmp_path)
    loaded = load_model(tmp_path, head="mlm")
    batch = _batch()
    torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)


# ------------------------------------------------------------------------------------------------ IB teacher


def test_converted_teacher_has_the_students_inter_block_width(bert_teacher, ib_teacher):
    cfg = ib_teacher.config
    student = build_student(STUDENT, VOCAB)
    assert cfg.hidden_size == student.config.hidden_size == 32  # inter-block: compared directly by eq. 2
    assert cfg.true_hidden_size == bert_teacher.config.hidden_size  # intra-block: the BERT layer, unchanged
    assert (cfg.num_hidden_layers, cfg.num_attention_heads) == (3, 2)
    b, i = bert_teacher.bert.encoder.layer[1], ib_teacher.mobilebert.encoder.layer[1]
    torch.testing.assert_close(i.attention.self.query.weight, b.attention.self.query.weight)
    torch.testing.assert_close(i.output.dense.weight, b.output.dense.weight)
    torch.testing.assert_close(ib_teacher.mobilebert.embeddings.word_embeddings.weight,
                               bert_teacher.bert.embeddings.word_embeddings.weight)


def test_converted_teacher_computes_what_the_bert_teacher_computes():
    """Inter-block width = the BERT width: the same MLM logits (to ~1 / GAIN), and inter-block maps that are the
    BERT hidden states normalised without their LayerNorm's affine. LayerNorm affines made non-trivial, as a trained
    teacher's are (the defaults, weight 1 and bias 0, would hide a misplaced affine)."""
    from distillery.ib_teacher import GAIN

    torch.manual_seed(0)
    bert = tr.BertForMaskedLM(tr.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                            **NO_DROPOUT)).eval()
    with torch.no_grad():
        for m in bert.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.2)
    ib = convert_bert(bert, STUDENT).eval()
    batch = _batch()
    with torch.no_grad():
        b = bert(**batch, output_hidden_states=True)
        i = ib(**batch, output_hidden_states=True)
    assert GAIN >= 1000
    assert (i.logits - b.logits).abs().max() < 2e-3 < 0.05 * b.logits.std()
    norm = bert.bert.encoder.layer[0].output.LayerNorm  # layer 1's output = gamma * z + beta
    torch.testing.assert_close(i.hidden_states[1], (b.hidden_states[1] - norm.bias) / norm.weight, rtol=0, atol=2e-3)


def test_converted_teacher_with_a_narrower_inter_block():
    torch.manual_seed(0)
    bert = tr.BertForMaskedLM(tr.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, intermediate_size=64))
    narrow = resolve_shape({"preset": "mobilebert-tiny", "layers": 2, "hidden": 16, "heads": 2, "intermediate": 16,
                            "extra": {"intra_bottleneck_size": 8, "embedding_size": 16}})
    ib = convert_bert(bert, narrow)
    assert (ib.config.hidden_size, ib.config.true_hidden_size) == (16, 32)
    assert ib(**_batch()).logits.shape == (4, 12, VOCAB)


def test_ib_shape_errors():
    teacher = Dims(3, 32, 2, 64, VOCAB, "distilbert")
    with pytest.raises(IBShapeError, match="BERT teacher"):
        converted_shape(STUDENT, teacher)
    other_embedding = resolve_shape({"preset": "ib-bert-large", "layers": 3, "hidden": 32, "heads": 2,
                                     "intermediate": 128, "extra": {"intra_bottleneck_size": 64}})
    with pytest.raises(IBShapeError, match="embedding"):
        scratch_shape(STUDENT, other_embedding)


def test_recipe_checks_name_the_key():
    teacher = Dims(4, 128, 4, 512, 500, "bert")
    ok = MobileBertRecipe(shape={"preset": "mobilebert-tiny", "layers": 4, "hidden": 128, "intermediate": 128,
                                 "intra": 32, "embedding": 128})
    ok.check(teacher, "students.mb")
    for layers in (3, 6):
        other = ok.model_copy(update={"shape": ok.shape.model_copy(update={"layers": layers})})
        with pytest.raises(RecipeError, match=r"students\.mb\.shape: layer-wise transfer needs the IB teacher's dep"):
            other.check(teacher, "students.mb")
    bert_shape = MobileBertRecipe(shape={"layers": 4, "hidden": 128, "heads": 4, "intermediate": 128})
    with pytest.raises(RecipeError, match="mobilebert shape"):
        bert_shape.check(teacher, "students.mb")
    with pytest.raises(ValueError, match="scratch"):
        MobileBertRecipe(shape={"preset": "mobilebert"}, ib_teacher={"shape": {"preset": "ib-bert-large"}})
    with pytest.raises(ValueError, match="MobileBERT widths"):
        MobileBertRecipe(shape={"layers": 4, "hidden": 128, "heads": 4, "intermediate": 128, "intra": 32})
    paper = MobileBertRecipe(shape={"preset": "mobilebert"},
                             ib_teacher={"init": "scratch", "shape": {"preset": "ib-bert-large"}})
    paper.check(Dims(12, 768, 12, 3072, 30522, "bert"), "students.paper")  # the IB teacher sets the depth


# ------------------------------------------------------------------------------------------------ transfer


@pytest.mark.parametrize("preset", ["mobilebert-tiny", "mobilebert-tiny-no-opt"])
def test_copied_embedding_and_classifier_equal_the_teachers(ib_teacher, preset):
    shape = replace(STUDENT, extra={**resolve_shape(preset).extra, **{k: v for k, v in STUDENT.extra.items()
                                                                        if k not in ("normalization_type", "hidden_act")}})
    student = student_from_teacher(shape, ib_teacher, head="pretraining")
    t_emb, s_emb = ib_teacher.mobilebert.embeddings.state_dict(), student.mobilebert.embeddings.state_dict()
    same_norm = ib_teacher.config.normalization_type == student.config.normalization_type
    assert same_norm == preset.endswith("no-opt")  # a NoNorm student keeps its own embedding normalisation
    for name, value in t_emb.items():
        if same_norm or not name.startswith("LayerNorm."):
            torch.testing.assert_close(s_emb[name], value, rtol=0, atol=0)
    for name, value in ib_teacher.cls.predictions.state_dict().items():
        torch.testing.assert_close(student.cls.predictions.state_dict()[name], value, rtol=0, atol=0)
    if same_norm:  # the whole embedding module is the teacher's
        ids = _batch()["input_ids"]
        torch.testing.assert_close(student.mobilebert.embeddings(input_ids=ids),
                                   ib_teacher.mobilebert.embeddings(input_ids=ids), rtol=0, atol=0)


#: MobileBERT's layer-wise knowledge transfer: eq. 2 + eq. 3
LAYER_WISE = {"feature_map_loss": 1.0, "attention_transfer_loss": 1.0}


def _spec(objectives, level="intermediate", layers=(1, 2, 3), alpha=0.5):
    return DistillSpec(objectives, level, layer_wise_map(layers), LossOptions(mlm_alpha=alpha))


def test_layer_wise_losses_compare_without_projection(ib_teacher):
    student = student_from_teacher(STUDENT, ib_teacher, head="mlm")
    model = Distiller(student, ib_teacher, _spec(LAYER_WISE)).train()
    assert model.projection is None
    batch = _batch()
    out = model(**batch)
    eager_s, eager_t = copy.deepcopy(student), copy.deepcopy(ib_teacher)  # attention maps need eager attention
    for m in (eager_s, eager_t):
        m.set_attn_implementation("eager")
    ref_s = eager_s(**batch, output_hidden_states=True, output_attentions=True)
    ref_t = eager_t(**batch, output_hidden_states=True, output_attentions=True)
    assert len(ref_s.hidden_states) == 4 and len(ref_s.attentions) == 3
    assert ref_s.hidden_states[1].shape == ref_t.hidden_states[1].shape  # equal widths: nothing in between
    mask = batch["attention_mask"]
    fmt = feature_map_loss(list(ref_s.hidden_states[1:]), list(ref_t.hidden_states[1:]), mask)
    at = attention_transfer_loss(list(ref_s.attentions), list(ref_t.attentions), mask)
    torch.testing.assert_close(out.terms["feature_map_loss"], fmt, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.terms["attention_transfer_loss"], at, rtol=1e-4, atol=1e-6)


def _corpus(n: int = 32) -> datasets.Dataset:
    g = torch.Generator().manual_seed(1)
    ids = [[2] + torch.randint(5, VOCAB, (10,), generator=g).tolist() + [3] for _ in range(n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 12] * n})


def _one_step_args(lr: float):
    return {"max_steps": 1, "learning_rate": lr, "lr_scheduler_type": "constant", "warmup_steps": 0,
            "weight_decay": 0.0, "per_device_train_batch_size": 8, "report_to": "none", "save_strategy": "no",
            "use_cpu": True, "disable_tqdm": True}


@pytest.mark.parametrize("scale", [0.1, 0.0])
def test_progressive_stage_trains_layer_l_at_the_full_rate(ib_teacher, tmp_path, scale):
    """Stage l = 2 of 3: layer 2 moves by ~lr per element (Adam's first step), the embedding and layer 1 by
    ~scale x lr (nothing with scale 0), layer 3 and the heads not at all."""
    torch.manual_seed(0)
    student = student_from_teacher(STUDENT, ib_teacher, head="mlm")
    before = {k: v.detach().clone() for k, v in student.state_dict().items()}
    lr = 1e-3
    groups = progressive_param_groups(student, 2, scale)
    distill(ib_teacher, student, _spec(LAYER_WISE, layers=[2]),
            TrainRun(tmp_path / "stage", _corpus(), args=_one_step_args(lr), param_groups=groups))
    student.requires_grad_(True)
    after = student.state_dict()

    def step(prefix: str) -> float:
        deltas = torch.cat([(after[k] - before[k]).abs().flatten() for k in before if k.startswith(prefix)])
        return float(deltas.median()) / lr

    assert step("mobilebert.encoder.layer.1.") == pytest.approx(1.0, rel=0.1)
    for below in ("mobilebert.encoder.layer.0.", "mobilebert.embeddings.embedding_transformation"):
        assert step(below) == pytest.approx(scale, rel=0.1, abs=1e-9), below
    # (the MLM decoder is the word-embedding matrix, tied: it moves with the embedding)
    for untouched in ("mobilebert.encoder.layer.2.", "cls.predictions.transform", "cls.predictions.bias"):
        assert step(untouched) == 0.0, untouched


def test_progressive_transfer_runs_every_layer_stage(ib_teacher, tmp_path, tokenizer):
    student = student_from_teacher(STUDENT, ib_teacher, head="mlm")
    final = progressive_transfer(
        ib_teacher, student, DistillSpec(LAYER_WISE), TrainRun(
            tmp_path / "pkt", _corpus(16), tokenizer=tokenizer,
            args={"per_device_train_batch_size": 8, "learning_rate": 1e-3, "logging_steps": 1, "use_cpu": True,
                  "disable_tqdm": True}),
        epochs=3)
    layers = {row["layer"] for row in read_log(final / "train_log.csv")}
    assert layers == {1.0, 2.0, 3.0} and not (tmp_path / "pkt" / "layers").exists()
    reloaded = tr.AutoModelForMaskedLM.from_pretrained(final)  # the student is a plain HF model
    assert reloaded.config.hidden_size == 32


# ------------------------------------------------------------------------------------------------ eq. 4


def _reference_pd(s_logits, t_logits, labels, nsp_logits, nsp_labels, alpha):
    """Eq. 4 in float64, written out: alpha CE(student, gold) + (1 - alpha) CE(student, teacher softmax) over the
    masked positions, + CE(NSP)."""
    s, t = s_logits.double(), t_logits.double()
    log_p = s - s.logsumexp(-1, keepdim=True)
    q = (t - t.logsumexp(-1, keepdim=True)).exp()
    mlm = kd = 0.0
    positions = (labels != -100).nonzero().tolist()
    for b, i in positions:
        mlm += -float(log_p[b, i, labels[b, i]])
        kd += -float((q[b, i] * log_p[b, i]).sum())
    n = len(positions)
    n_log_p = nsp_logits.double() - nsp_logits.double().logsumexp(-1, keepdim=True)
    nsp = -sum(float(n_log_p[k, nsp_labels[k]]) for k in range(len(nsp_labels))) / len(nsp_labels)
    return alpha * mlm / n + (1 - alpha) * kd / n + nsp


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_pretraining_distillation_matches_a_float64_reference(ib_teacher, tokenizer, alpha):
    torch.manual_seed(0)
    student = student_from_teacher(STUDENT, ib_teacher, head="pretraining")
    docs = [[" ".join(f"w{(7 * d + 3 * s + k) % 50}" for k in range(4)) for s in range(5)] for d in range(6)]
    data = nsp_dataset(sentence_pairs(docs, tokenizer, 24, seed=0), tokenizer, 24)
    collator = tr.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3, seed=0)
    batch = collator([data[i] for i in range(min(6, len(data)))])
    assert {"labels", "next_sentence_label", "token_type_ids"} <= set(batch)
    model = Distiller(student, ib_teacher, _spec({"pretraining_distillation_loss": 1.0}, "pretraining", (),
                                                 alpha)).train()
    loss = model(**batch).loss
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        s_out, t_out = student(**inputs), ib_teacher(**inputs)
    ref = _reference_pd(s_out.prediction_logits, t_out.logits, batch["labels"], s_out.seq_relationship_logits,
                        batch["next_sentence_label"], alpha)
    assert math.isclose(float(loss.detach()), ref, rel_tol=1e-5)


def test_sentence_pairs_respect_document_boundaries(tokenizer):
    docs = [[f"w{10 * d + s} w{10 * d + s}" for s in range(6)] for d in range(4)]
    pairs = sentence_pairs(docs, tokenizer, 12, seed=3)
    assert {label for *_, label in pairs} == {0, 1}

    def doc_of(text: str) -> set[int]:
        return {int(w[1:]) // 10 for w in text.split()}

    for a, b, label in pairs:
        assert len(doc_of(a)) == 1 and len(doc_of(b)) == 1  # no segment crosses a document boundary
        if label == 0:  # B continues A in the same document
            assert doc_of(a) == doc_of(b) and int(b.split()[0][1:]) == int(a.split()[-1][1:]) + 1
        else:
            assert doc_of(a) != doc_of(b)


def test_joint_and_auxiliary_transfer(ib_teacher, tokenizer, tmp_path):
    """Joint: every layer's terms at once; auxiliary: those terms and eq. 4 in one pre-training loss."""
    from distillery.training.pretraining_distillation import pretraining_distillation
    from distillery.training.progressive_transfer import joint_transfer

    args = {"per_device_train_batch_size": 8, "learning_rate": 1e-3, "logging_steps": 1, "use_cpu": True,
            "disable_tqdm": True, "max_steps": 2}
    student = student_from_teacher(STUDENT, ib_teacher, head="pretraining")
    run = TrainRun(tmp_path / "jkt", _corpus(16), tokenizer=tokenizer, args=args)
    joint = joint_transfer(ib_teacher, student, DistillSpec(LAYER_WISE), run)
    assert "train_feature_map_loss" in (joint / "train_log.csv").read_text()
    docs = [[" ".join(f"w{(5 * d + s + k) % 50}" for k in range(3)) for s in range(4)] for d in range(5)]
    data = nsp_dataset(sentence_pairs(docs, tokenizer, 20, seed=1), tokenizer, 20)
    auxiliary = _spec({"pretraining_distillation_loss": 1.0, **LAYER_WISE}, "pretraining")
    aux = pretraining_distillation(ib_teacher, student, auxiliary, run.with_(output_dir=tmp_path / "akt",
                                                                            train_dataset=data))
    header = (aux / "train_log.csv").read_text().splitlines()[0]
    for term in ("train_pretraining_distillation_loss", "train_feature_map_loss", "train_attention_transfer_loss"):
        assert term in header


def test_stage_items_follow_the_transfer_strategy():
    from pathlib import Path

    import yaml

    from distillery.config import parse_params
    from flows.stages import STAGES, items

    _general_deps = STAGES["general_distillation"].deps
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    data["students"]["mobilebert-demo"]["transfer"] = "auxiliary"
    p = parse_params(data)
    assert items("ib_teacher", p) == ["mobilebert-demo"] and items("knowledge_transfer", p) == []
    deps = [str(d) for d in _general_deps(p, "mobilebert-demo")]
    assert any("ib-teacher" in d for d in deps) and not any("/transfer/" in d for d in deps)

"""Student presets, configs, teacher loading, DistilBERT-style init, and save/load without project code."""

import pytest
import torch
import transformers as tr

from distillery.models import (
    build_student,
    hidden_size,
    init_from_teacher_layers,
    load_teacher,
    num_heads,
    num_layers,
    num_parameters,
    set_dropout,
    student_config,
)
from distillery.shape import PAPER_PARAMS_M, PRESETS, ModelConfigError, resolve_shape

TOLERANCE = {"tinybert4": 0.02, "tinybert6": 0.02, "mobilebert": 0.02, "mobilebert-tiny": 0.05, "mobilebert-no-opt": 0.02,
             "ib-bert-large": 0.05,
             "ib-bert-large-intra512": 0.05}


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS_M))
def test_preset_parameter_counts_match_papers(name):
    with torch.device("meta"):
        model = build_student(name, 30522)
    n = num_parameters(model) / 1e6
    assert abs(n - PAPER_PARAMS_M[name]) / PAPER_PARAMS_M[name] <= TOLERANCE[name], (name, n)


def test_mobilebert_preset_structure():
    cfg = student_config("mobilebert", 30522)
    assert isinstance(cfg, tr.MobileBertConfig)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.true_hidden_size, cfg.embedding_size) == (24, 512, 128, 128)
    assert cfg.num_feedforward_networks == 4 and cfg.normalization_type == "no_norm" and cfg.hidden_act == "relu"
    assert cfg.trigram_input
    tiny = student_config("mobilebert-tiny", 30522)
    assert tiny.num_feedforward_networks == 2 and tiny.use_bottleneck_attention


def test_presets_expressible_as_numbers():
    for name in ("tinybert4", "minilm-l6-h384", "distilbert6"):
        shape = resolve_shape(name)
        explicit = resolve_shape(shape.as_dict())
        assert explicit == shape
    explicit = resolve_shape({"layers": 4, "hidden": 312, "heads": 12, "intermediate": 1200})
    assert explicit == PRESETS["tinybert4"]
    cfg = student_config("minilm-l3-h384", 100)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == (3, 384, 12, 1536)
    over = resolve_shape({"preset": "tinybert4", "layers": 2})
    assert over.layers == 2 and over.hidden == 312


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("tinybert5", "unknown shape preset"),
        ({"layers": 4, "hidden": 312, "heads": 12}, "missing key"),
        ({"layers": 4, "hidden": 312, "heads": 12, "intermediate": 1200, "depth": 3}, "unknown key"),
        ({"layers": 4, "hidden": 310, "heads": 12, "intermediate": 1200}, "not divisible by 12 heads"),
        ({"layers": 0, "hidden": 312, "heads": 12, "intermediate": 1200}, "'layers'"),
        ({"layers": 4, "hidden": 312, "heads": 12, "intermediate": 1200, "arch": "gpt"}, "unknown arch"),
    ],
)
def test_bad_shapes_raise(spec, needle):
    with pytest.raises(ModelConfigError, match=needle):
        resolve_shape(spec)


def test_student_inherits_from_teacher_config():
    base = tr.BertConfig(vocab_size=123, max_position_embeddings=64, type_vocab_size=3, pad_token_id=1)
    cfg = student_config("tinybert4", None, base=base, num_labels=3)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size, cfg.pad_token_id) == (123, 64, 3, 1)
    assert cfg.num_labels == 3
    d = student_config("distilbert6", None, base=base)
    assert isinstance(d, tr.DistilBertConfig) and d.vocab_size == 123 and d.max_position_embeddings == 64
    with pytest.raises(ModelConfigError, match="vocab_size"):
        student_config("tinybert4", None)


def test_accessors_across_architectures():
    small = {"layers": 2, "hidden": 32, "heads": 4, "intermediate": 64}
    for arch in ("bert", "distilbert"):
        m = build_student({**small, "arch": arch}, 50, head="sequence-classification", num_labels=3)
        assert (num_layers(m), num_heads(m), hidden_size(m)) == (2, 4, 32)
        assert m.config.num_labels == 3 and m.config._attn_implementation == "sdpa"
    mb = build_student(
        {"preset": "mobilebert", "layers": 2, "extra": {"intra_bottleneck_size": 16, "embedding_size": 16}}, 50,
        head="mlm",
    )
    assert isinstance(mb, tr.MobileBertForMaskedLM)
    assert (num_layers(mb), num_heads(mb), hidden_size(mb)) == (2, 4, 512)
    with pytest.raises(ModelConfigError, match="unknown head"):
        build_student(small, 50, head="qa")


def _tiny_bert_teacher(cls=tr.BertForMaskedLM, layers=4):
    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    return cls(cfg).eval()


def test_distilbert_init_copies_selected_teacher_layers_exactly():
    teacher = _tiny_bert_teacher()
    ids = torch.randint(5, 99, (2, 7))
    full = init_from_teacher_layers(teacher, [0, 1, 2, 3], fold_token_type=True).eval()
    assert isinstance(full, tr.DistilBertForMaskedLM)
    torch.testing.assert_close(full(ids).logits, teacher(ids).logits, atol=1e-5, rtol=1e-5)
    # official behaviour (token types dropped) differs from the teacher
    plain = init_from_teacher_layers(teacher, [0, 1, 2, 3]).eval()
    assert not torch.allclose(plain(ids).logits, teacher(ids).logits, atol=1e-3)
    sub = init_from_teacher_layers(teacher, [0, 3])
    assert num_layers(sub) == 2
    t_layer, s_layer = teacher.bert.encoder.layer[3], sub.distilbert.transformer.layer[1]
    assert torch.equal(s_layer.attention.q_lin.weight, t_layer.attention.self.query.weight)
    assert torch.equal(s_layer.ffn.lin2.bias, t_layer.output.dense.bias)
    assert torch.equal(sub.vocab_projector.bias, teacher.cls.predictions.bias)
    assert not hasattr(sub.distilbert.embeddings, "token_type_embeddings")


def test_same_arch_subset_and_errors():
    teacher = _tiny_bert_teacher(tr.BertForSequenceClassification)
    same = init_from_teacher_layers(teacher, [1, 3], arch="same")
    assert isinstance(same, tr.BertForSequenceClassification) and num_layers(same) == 2
    assert torch.equal(same.bert.encoder.layer[0].output.dense.weight, teacher.bert.encoder.layer[1].output.dense.weight)
    assert torch.equal(same.classifier.weight, teacher.classifier.weight)
    distil = init_from_teacher_layers(teacher, [1, 3])
    assert isinstance(distil, tr.DistilBertForSequenceClassification)
    with pytest.raises(ModelConfigError, match="teacher layer 4 out of range"):
        init_from_teacher_layers(teacher, [0, 4])
    with pytest.raises(ModelConfigError, match="duplicate"):
        init_from_teacher_layers(teacher, [1, 1])


def test_load_teacher_local_dir_and_clear_errors(tmp_path):
    teacher = _tiny_bert_teacher(tr.BertForSequenceClassification)
    teacher.save_pretrained(tmp_path / "t")
    loaded = load_teacher(tmp_path / "t", num_labels=2)
    assert not loaded.training
    ids = torch.randint(5, 99, (2, 5))
    torch.testing.assert_close(loaded(ids).logits, teacher(ids).logits)
    reg = load_teacher(str(tmp_path / "t"), head="base")
    assert isinstance(reg, tr.BertModel)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_teacher(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        (tmp_path / "empty").mkdir()
        load_teacher(tmp_path / "empty")


def test_load_teacher_regression_head(tmp_path):
    _tiny_bert_teacher(tr.BertModel).save_pretrained(tmp_path / "b")
    reg = load_teacher(tmp_path / "b", regression=True)
    assert reg.config.num_labels == 1 and reg.config.problem_type == "regression"
    assert reg(torch.randint(5, 99, (2, 5))).logits.shape == (2, 1)


@pytest.mark.parametrize("name", ["tinybert4", "mobilebert-tiny", "distilbert6"])
def test_saved_preset_student_loads_with_auto_classes_only(tmp_path, name):
    torch.manual_seed(0)
    shape = resolve_shape(name)
    if name == "mobilebert-tiny":  # keep the test fast: fewer layers, same structure
        shape = resolve_shape({"preset": name, "layers": 2})
    student = build_student(shape, 200, head="sequence-classification", num_labels=3).eval()
    student.save_pretrained(tmp_path / "s")
    ids = torch.randint(5, 200, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    again = tr.AutoModelForSequenceClassification.from_pretrained(tmp_path / "s").eval()
    assert type(again) is type(student)
    torch.testing.assert_close(again(input_ids=ids, attention_mask=mask).logits,
                               student(input_ids=ids, attention_mask=mask).logits)
    encoder = tr.AutoModel.from_pretrained(tmp_path / "s")
    assert num_layers(encoder) == shape.layers
    assert (tmp_path / "s" / "model.safetensors").is_file()


def test_init_with_head_override():
    teacher = _tiny_bert_teacher(tr.BertForMaskedLM)
    cls_student = init_from_teacher_layers(teacher, [1, 2], head="sequence-classification")
    assert isinstance(cls_student, tr.DistilBertForSequenceClassification)
    assert torch.equal(cls_student.distilbert.transformer.layer[0].attention.v_lin.weight,
                       teacher.bert.encoder.layer[1].attention.self.value.weight)
    same = init_from_teacher_layers(teacher, [0, 3], arch="same", head="sequence-classification")
    assert isinstance(same, tr.BertForSequenceClassification)
    assert torch.equal(same.bert.encoder.layer[1].intermediate.dense.weight,
                       teacher.bert.encoder.layer[3].intermediate.dense.weight)
    assert torch.equal(same.bert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight)
    with pytest.raises(ModelConfigError, match="unknown head"):
        init_from_teacher_layers(teacher, [0], head="qa")


@pytest.mark.parametrize("spec", [{"preset": "tinybert4", "layers": 2}, {"preset": "mobilebert-tiny", "layers": 2},
                                  {"arch": "distilbert", "layers": 2, "hidden": 64, "heads": 4, "intermediate": 128}])
def test_set_dropout_reaches_every_dropout_and_survives_saving(tmp_path, spec):
    torch.manual_seed(0)
    shape = resolve_shape(spec)
    student = build_student(shape, 200, head="sequence-classification")
    ids = torch.randint(5, 200, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    student.train()
    assert not torch.equal(student(input_ids=ids, attention_mask=mask).logits,
                           student(input_ids=ids, attention_mask=mask).logits)  # dropout on: two draws differ
    set_dropout(student, 0.0)
    torch.testing.assert_close(student(input_ids=ids, attention_mask=mask).logits,
                               student(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)
    student.save_pretrained(tmp_path / "s")
    again = tr.AutoModelForSequenceClassification.from_pretrained(tmp_path / "s").train()
    assert {m.p for m in again.modules() if isinstance(m, torch.nn.Dropout)} == {0.0}
    torch.testing.assert_close(again(input_ids=ids, attention_mask=mask).logits,
                               student(input_ids=ids, attention_mask=mask).logits)

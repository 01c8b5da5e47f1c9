"""FLOPs against the papers' #FLOPs columns; parameter counts; bytes on disk."""

import pytest
import transformers

from distillery.efficiency import FlopsConfigError, disk_size_bytes, flops_breakdown, flops_per_example, parameter_counts

BERT_BASE = transformers.BertConfig()
TINYBERT4 = transformers.BertConfig(num_hidden_layers=4, hidden_size=312, num_attention_heads=12, intermediate_size=1200)


def test_bert_base_flops_match_tinybert_table1_within_3_percent():
    assert flops_per_example(BERT_BASE, 128) == pytest.approx(22.5e9, rel=0.03)


def test_tinybert4_flops_match_table1_at_its_printed_precision():
    # Table 1 prints 1.2B (two significant digits, i.e. [1.15B, 1.25B)); we count 1.247B (+3.9%).
    got = flops_per_example(TINYBERT4, 128)
    assert round(got / 1e9, 1) == 1.2
    assert got == pytest.approx(1.2e9, rel=0.04)


@pytest.mark.parametrize("layers,hidden,inter,paper", [(6, 768, 3072, 11.3e9), (4, 768, 3072, 7.6e9),
                                                       (3, 768, 3072, 5.7e9), (4, 512, 2048, 3.4e9)])
def test_other_table_rows_within_3_percent(layers, hidden, inter, paper):
    cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter)
    assert flops_per_example(cfg, 128) == pytest.approx(paper, rel=0.03)


def test_breakdown_parts_and_scaling():
    b = flops_breakdown(BERT_BASE, 128)
    assert b.linear == 2 * 12 * 128 * (4 * 768 * 768 + 2 * 768 * 3072)
    assert b.attention == 2 * 12 * 2 * 128 * 128 * 768
    assert b.total == b.embedding + b.linear + b.attention + b.head
    assert flops_breakdown(BERT_BASE, 128, head="none").head == 0
    assert flops_breakdown(BERT_BASE, 128, head="mlm").head > 2e9  # 30522-way decoder on every token
    # attention grows quadratically with length, dense layers linearly
    assert flops_breakdown(BERT_BASE, 256).attention == 4 * b.attention
    assert flops_breakdown(BERT_BASE, 256).linear == 2 * b.linear


def test_distilbert_equals_six_layer_bert_and_dict_config_works():
    distil = transformers.DistilBertConfig()
    bert6 = transformers.BertConfig(num_hidden_layers=6)
    assert flops_per_example(distil, 128) == flops_per_example(bert6, 128)
    assert flops_per_example(bert6.to_dict(), 128) == flops_per_example(bert6, 128)


def test_mobilebert_counts_bottlenecks_and_stacked_ffns():
    cfg = transformers.MobileBertConfig()
    b = flops_breakdown(cfg, 128, head="none")
    h, t, di = 512, 128, 512
    per_token = h * t * 3 + 3 * t * t + h * t + 4 * 2 * t * di
    assert b.linear == 2 * 24 * 128 * per_token
    assert b.embedding == 2 * 128 * 3 * 128 * 512
    assert 5.0e9 < b.total < 5.7e9  # paper: 5.7B


def test_flops_rejects_bad_input():
    with pytest.raises(FlopsConfigError, match="model_type"):
        flops_per_example(transformers.GPT2Config(), 128)
    with pytest.raises(FlopsConfigError, match="seq_len"):
        flops_per_example(BERT_BASE, 0)
    with pytest.raises(FlopsConfigError, match="num_hidden_layers"):
        flops_per_example({"model_type": "bert", "hidden_size": 8}, 16)


def test_parameter_counts_split_embeddings():
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64, type_vocab_size=2)
    counts = parameter_counts(transformers.BertModel(cfg))
    assert counts["embedding"] == (100 + 64 + 2) * 16
    assert counts["total"] == counts["embedding"] + counts["non_embedding"]
    # tied MLM decoder shares the word embedding: not counted twice
    mlm = transformers.BertForMaskedLM(cfg)
    assert parameter_counts(mlm)["embedding"] == (100 + 64 + 2) * 16
    with pytest.raises(TypeError):
        parameter_counts("not a model")


def test_bert_base_has_109m_parameters():
    with transformers.modeling_utils.no_init_weights() if hasattr(transformers.modeling_utils, "no_init_weights") else _null():
        model = transformers.BertModel(BERT_BASE)
    assert parameter_counts(model)["total"] / 1e6 == pytest.approx(109.5, abs=0.1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_disk_size(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 5)
    assert disk_size_bytes(tmp_path) == 15
    assert disk_size_bytes(tmp_path / "a.bin") == 10
    with pytest.raises(FileNotFoundError, match="missing"):
        disk_size_bytes(tmp_path / "missing")

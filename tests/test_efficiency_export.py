"""ONNX export with dynamic axes matches PyTorch; int8 quantisation stays close; batched prediction."""

import json

import numpy as np
import pytest
import torch
import transformers

from distillery.efficiency import (ExportError, OnnxModel, check_onnx, export_onnx, int8_export,
                                   load_model_for_export, predict_torch, quantize_onnx, quantize_torch)


def tiny_bert_classifier(num_labels=3):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64, num_labels=num_labels)
    return transformers.BertForSequenceClassification(cfg).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("student")
    model = tiny_bert_classifier()
    model.save_pretrained(d / "model")
    result = export_onnx(d / "model", d / "model.onnx")  # from a saved directory, as the pipeline does
    return model, result, d


def test_onnx_matches_pytorch_logits_with_dynamic_axes(exported):
    model, result, d = exported
    assert result.output_name == "logits" and result.input_names == ("input_ids", "attention_mask", "token_type_ids")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    onnx_model = OnnxModel(result.path)
    for batch, seq in [(1, 5), (4, 23)]:  # shapes other than the traced (2, 8)
        ids = torch.randint(1, 120, (batch, seq))
        mask = torch.ones_like(ids)
        mask[0, seq // 2:] = 0
        with torch.inference_mode():
            ref = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits.numpy()
        got = onnx_model(input_ids=ids.numpy(), attention_mask=mask.numpy())
        assert got.shape == (batch, 3)
        assert np.abs(got - ref).max() <= 1e-4


def test_int8_weights_get_one_scale_per_output_channel(tmp_path):
    """A layer whose output channels have very different ranges (as trained BERT layers do) loses little with a scale
    per channel; with one scale per tensor its small channels round to a few levels."""
    model = tiny_bert_classifier()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.out_features > 3:
                module.weight[: module.out_features // 2] *= 0.02  # half the channels ~50x smaller
    model.save_pretrained(tmp_path / "model")
    fp32 = export_onnx(tmp_path / "model", tmp_path / "model.onnx").path
    feats = {"input_ids": [[2, 5, 6, 7, 8, 9, 10, 11], [3, 4, 5]]}
    ref = OnnxModel(fp32).predict(feats)
    err = {}
    for per_channel in (True, False):
        q = quantize_onnx(fp32, tmp_path / f"int8-{per_channel}.onnx", per_channel=per_channel)
        err[per_channel] = float(np.abs(OnnxModel(q).predict(feats) - ref).max())
    assert 0 < err[True] < err[False] / 2, err
    deployed = OnnxModel(quantize_onnx(fp32, tmp_path / "int8.onnx")).predict(feats)  # what evaluate and serving use
    assert float(np.abs(deployed - ref).max()) == err[True]


def test_check_onnx_detects_a_different_model(exported):
    _, result, _ = exported
    other = tiny_bert_classifier()
    with torch.no_grad():
        other.classifier.bias += 1.0
    assert check_onnx(other, result.path) > 0.5


def test_batched_predict_pads_like_a_collator(exported):
    model, result, _ = exported
    feats = {"input_ids": [[2, 5, 6, 7], [3, 4], [9] * 9, [11, 12, 13]]}
    a = OnnxModel(result.path).predict(feats, batch_size=3)
    b = predict_torch(model, feats, batch_size=2)
    assert a.shape == (4, 3)
    assert np.abs(a - b).max() <= 1e-4
    # a row's output does not depend on its batch-mates (padding is masked)
    single = OnnxModel(result.path).predict({"input_ids": [[3, 4]]})
    assert np.abs(single[0] - a[1]).max() <= 1e-4


def test_int8_onnx_and_torch_quantisation_stay_close(exported, tmp_path):
    model, result, _ = exported
    q = quantize_onnx(result.path, tmp_path / "model.int8.onnx")
    import onnx

    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops  # int8 weight matmuls
    assert q.stat().st_size < result.bytes
    feats = {"input_ids": [[2, 5, 6, 7, 8, 9], [3, 4, 5]]}
    ref = predict_torch(model, feats)
    onnx_int8 = OnnxModel(q).predict(feats)
    torch_int8 = predict_torch(quantize_torch(model), feats)
    for got in (onnx_int8, torch_int8):
        diff = np.abs(got - ref).max()
        assert 0 < diff < 0.05  # quantised (not identical) yet close
    assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in quantize_torch(model).modules())


def _ops(path):
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("arch", ["bert", "distilbert", "mobilebert"])
def test_served_int8_is_fused_where_the_optimiser_recognises_the_model(arch, tmp_path):
    """`int8_export` quantises the graph ONNX Runtime's optimiser fused (one Attention kernel per layer) for BERT and
    DistilBERT; a MobileBERT graph fuses nothing and is quantised as exported. Either way int8 stays close to PyTorch
    and matches quantising the graph it started from."""
    torch.manual_seed(0)
    cfg = {"bert": lambda: transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, intermediate_size=64),
           "distilbert": lambda: transformers.DistilBertConfig(vocab_size=120, dim=32, n_layers=2, n_heads=2,
                                                               hidden_dim=64),
           "mobilebert": lambda: transformers.MobileBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                               num_attention_heads=2, intermediate_size=32,
                                                               embedding_size=16, intra_bottleneck_size=16,
                                                               true_hidden_size=16)}[arch]()
    model = transformers.AutoModelForSequenceClassification.from_config(cfg).eval()
    fp32 = export_onnx(model, tmp_path / "model.onnx").path
    fused = int8_export(model, fp32, tmp_path / "model.int8.onnx")
    ops = _ops(tmp_path / "model.int8.onnx")
    if arch == "mobilebert":
        assert fused == {}
        assert "QAttention" not in ops
    else:
        assert fused["Attention"] == 2 and fused["SkipLayerNormalization"] == 4, fused
        assert "QAttention" in ops or "Attention" in ops
        assert "Softmax" not in ops  # the attention runs in the fused kernel
    feats = {"input_ids": [[2, 5, 6, 7, 8, 9], [3, 4, 5]]}
    ref = predict_torch(model, feats)
    got = OnnxModel(tmp_path / "model.int8.onnx").predict(feats)
    assert 0 < np.abs(got - ref).max() < 0.05


def test_served_int8_falls_back_to_the_unfused_graph_when_fusion_changes_outputs(exported, tmp_path, monkeypatch,
                                                                                 caplog):
    from distillery.efficiency import export

    model, result, _ = exported
    monkeypatch.setattr(export, "check_onnx", lambda *a, **k: 1.0)  # the fused graph disagrees with PyTorch
    fused = int8_export(model, result.path, tmp_path / "model.int8.onnx")
    assert fused == {} and "quantising the unfused graph" in caplog.text
    assert "Softmax" in _ops(tmp_path / "model.int8.onnx")
    plain = quantize_onnx(result.path, tmp_path / "plain.onnx")
    feats = {"input_ids": [[2, 5, 6, 7, 8, 9], [3, 4, 5]]}
    assert np.array_equal(OnnxModel(tmp_path / "model.int8.onnx").predict(feats), OnnxModel(plain).predict(feats))


def test_distilbert_exports_without_token_types(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                        max_position_embeddings=64)
    result = export_onnx(transformers.DistilBertForSequenceClassification(cfg), tmp_path / "d.onnx")
    assert result.input_names == ("input_ids", "attention_mask")
    assert result.max_abs_diff <= 1e-4


def test_dynamo_exporter(tmp_path):
    result = export_onnx(tiny_bert_classifier(2), tmp_path / "m.onnx", exporter="dynamo", opset=18)
    assert result.max_abs_diff <= 1e-4


def test_export_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        export_onnx(tmp_path / "nowhere", tmp_path / "x.onnx")
    with pytest.raises(ExportError, match="exporter"):
        export_onnx(tiny_bert_classifier(), tmp_path / "x.onnx", exporter="tf")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ExportError, match="config.json"):
        load_model_for_export(bad)
    with pytest.raises(FileNotFoundError):
        quantize_onnx(tmp_path / "missing.onnx", tmp_path / "q.onnx")
    assert not (tmp_path / "x.onnx").exists()


def test_load_uses_saved_architecture(tmp_path):
    model = tiny_bert_classifier()
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    assert type(load_model_for_export(tmp_path)).__name__ == "BertForSequenceClassification"


def test_question_answering_models_export_their_span_logits(tmp_path):
    """A span head's start and end logits leave the graph as one (batch, 2, sequence) output with a dynamic sequence
    axis, equal to PyTorch's; int8 stays close."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertForQuestionAnswering(cfg).eval()
    model.save_pretrained(tmp_path / "model")
    result = export_onnx(tmp_path / "model", tmp_path / "model.onnx")
    assert result.output_name == "span_logits" and result.max_abs_diff <= 1e-4
    ids = torch.randint(1, 120, (3, 17))
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    for path, tol in ((result.path, 1e-4), (quantize_onnx(result.path, tmp_path / "model.int8.onnx"), 0.5)):
        got = OnnxModel(path)(input_ids=ids.numpy(), attention_mask=np.ones((3, 17), dtype=np.int64))
        assert got.shape == (3, 2, 17)
        np.testing.assert_allclose(got[:, 0], out.start_logits.numpy(), atol=tol)
        np.testing.assert_allclose(got[:, 1], out.end_logits.numpy(), atol=tol)

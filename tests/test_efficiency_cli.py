"""`distillery export` and `distillery speed` on a tiny saved student."""

import json

import torch
import transformers

from distillery.cli import main


def test_export_and_speed_commands(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32)
    transformers.BertForSequenceClassification(cfg).save_pretrained(tmp_path / "student")
    (tmp_path / "student" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    assert main(["export", str(tmp_path / "student"), str(tmp_path / "onnx")]) == 0
    info = json.loads((tmp_path / "onnx" / "export.json").read_text())
    assert info["onnx"]["max_abs_diff"] <= 1e-4
    assert sorted(info["bytes_on_disk"]) == ["model.int8.onnx", "model.onnx"]
    assert (tmp_path / "onnx" / "vocab.txt").is_file()
    assert info["parameters"]["total"] > info["parameters"]["non_embedding"] > 0
    capsys.readouterr()
    out_json = tmp_path / "speed.json"
    assert main(["speed", str(tmp_path / "student"), str(tmp_path / "onnx" / "model.int8.onnx"), "--seq", "8",
                 "--reps", "2", "--warmup", "1", "--device", "cpu", "--json", str(out_json)]) == 0
    table = capsys.readouterr().out
    assert "| student | 1 | 8 |" in table and "| model.int8.onnx | 1 | 8 |" in table
    data = json.loads(out_json.read_text())
    assert data["student"]["speedup"] == 1.0 and data["model.int8.onnx"]["median_ms"] > 0

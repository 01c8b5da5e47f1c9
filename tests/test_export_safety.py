"""`distillery export` never deletes or replaces what it did not write.

OUT_DIR must be new, empty, or an earlier export (its export.json lists the files it wrote and nothing else is
there); OUT_DIR == MODEL_DIR, OUT_DIR inside MODEL_DIR, MODEL_DIR inside OUT_DIR and an existing file are
refused with one `error:` line and exit code 2, and everything stays as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from distillery.cli import main

WORDS = "the a movie film good bad great plot acting story dull charming it was is not".split()


def save_tiny_classifier(out: Path, *, extra_tokens: int = 0) -> Path:
    """A 1-layer BERT classifier and its WordPiece tokenizer in `out` (vocab_size = tokenizer size - extra_tokens)."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "."] + WORDS + [f"w{i}" for i in range(extra_tokens)]
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = transformers.BertTokenizerFast(vocab=str(out / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tok) - extra_tokens, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    transformers.BertForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under `path` (or `path` itself) with its bytes."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()  # what building the test's models printed
    rc = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return rc, err


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("export") / "student")


def assert_refused(rc: int, err: list[str], *needles: str) -> None:
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: export: "), err
    for needle in needles:
        assert needle in err[0], err[0]


def test_user_file_in_a_non_empty_out_dir_is_kept(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, err = run_cli(["export", str(model_dir), str(out), "--no-int8"], capsys)
    assert_refused(rc, err, str(out), "not an earlier `distillery export` output")
    assert snapshot(out) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary sibling left behind


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_out_dir_overlapping_the_model_dir_is_refused(where, tmp_path, capsys):
    model = save_tiny_classifier(tmp_path / "parent" / "model")
    before = snapshot(tmp_path)
    out = {"same": model, "inside": model / "onnx", "contains": tmp_path / "parent"}[where]
    rc, err = run_cli(["export", str(model), str(out), "--no-int8"], capsys)
    assert_refused(rc, err, "MODEL_DIR")
    assert snapshot(tmp_path) == before  # model.safetensors and everything else untouched, nothing added


def test_existing_file_out_is_refused(model_dir, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    out.write_text("not a directory")
    rc, err = run_cli(["export", str(model_dir), str(out), "--no-int8"], capsys)
    assert_refused(rc, err, "is not a directory")
    assert out.read_text() == "not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_an_earlier_export_is_replaced_but_not_with_a_user_file_in_it(model_dir, tmp_path, capsys):
    out = tmp_path / "onnx"
    assert main(["export", str(model_dir), str(out), "--no-int8"]) == 0
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["written_by"] == "distillery export"
    assert set(manifest["files"]) == {p.name for p in out.iterdir()}
    assert main(["export", str(model_dir), str(out), "--no-int8"]) == 0  # its own output: replaced atomically
    capsys.readouterr()
    (out / "mine.txt").write_text("keep me")
    before = snapshot(out)
    rc, err = run_cli(["export", str(model_dir), str(out), "--no-int8"], capsys)
    assert_refused(rc, err, "mine.txt")
    assert snapshot(out) == before

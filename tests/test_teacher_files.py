"""A fine-tuned teacher's directory checked whole before anything loads it: config, code, weight format and extent,
tokenizer and its vocabulary; its weights complete for its config when it loads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from distillery.models import ModelFilesError, check_model_files, load_teacher

from helpers import classifier, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def teacher_dir(tmp_path):
    tok = tokenizer(tmp_path)
    model = classifier(tok.vocab_size, 2)
    d = tmp_path / "teacher"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _config(d, **change):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))


def test_a_whole_teacher_passes_and_each_fault_is_one_line_naming_the_key_and_file(teacher_dir, tmp_path):
    check_model_files(teacher_dir, "teacher.finetuned.sst2")
    faults = {}

    def case(name, damage):
        d = tmp_path / name
        shutil.copytree(teacher_dir, d)
        damage(d)
        with pytest.raises(ModelFilesError) as err:
            check_model_files(d, "teacher.finetuned.sst2")
        faults[name] = str(err.value)

    case("no-tokenizer", lambda d: [f.unlink() for f in d.iterdir() if f.name.startswith(("vocab", "tokenizer"))])
    case("not-json", lambda d: (d / "config.json").write_text("{layers: 6"))
    case("own-code", lambda d: _config(d, auto_map={"AutoModel": "modeling_x.XModel"}))
    case("pickle", lambda d: (torch.save({}, d / "pytorch_model.bin"), (d / "model.safetensors").unlink()))
    case("truncated", lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:200]))
    case("small-embeddings", lambda d: _config(d, vocab_size=5))
    for name, line in faults.items():
        assert line.startswith("teacher.finetuned.sst2: ") and "\n" not in line, (name, line)
    assert "has no tokenizer" in faults["no-tokenizer"]
    assert "is not a JSON model config" in faults["not-json"]
    assert "asks for its own model code (auto_map: AutoModel)" in faults["own-code"]
    assert "holds only pickled weights" in faults["pickle"] and "safe_serialization=True" in faults["pickle"]
    assert "truncated or damaged" in faults["truncated"]
    assert "the embeddings hold 5" in faults["small-embeddings"]


def test_weights_that_do_not_fit_the_config_are_refused_when_the_teacher_must_be_complete(teacher_dir):
    _config(teacher_dir, num_hidden_layers=4)  # a config of 4 layers with weights for 2: two random layers
    load_teacher(teacher_dir, num_labels=2)  # the pre-trained teacher's load: a fresh head is expected there
    with pytest.raises(ModelFilesError, match=r"its weights do not fit its config.json \(missing keys: "
                                              r"bert\.encoder\.layer\.2\."):
        load_teacher(teacher_dir, num_labels=2, complete=True)

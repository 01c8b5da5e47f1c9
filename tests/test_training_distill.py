"""Distillation loops: the end-to-end TinyBERT test of issue 2, resume, logits cache, saving, teacher mode."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

from distillery.layer_map import LayerMapError, build_layer_map
from distillery.objectives import ObjectiveConfigError
from distillery.training.distill import Distiller, distill, make_projection
from distillery.training.distill_state import STATE_NAME, load_projection
from distillery.training.finetune import finetune
from distillery.training.grid import prediction_grid
from distillery.training.log import read_log
from distillery.training.logits_cache import cache_teacher_logits, teacher_fingerprint
from distillery.training.metrics import accuracy
from distillery.training.spec import DistillSpec, Grid, TrainRun

from helpers import FAST, classifier, encoded, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A 4-layer teacher fine-tuned here on the generated task, the tokenizer and the splits."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("task")
    tok = tokenizer(d)
    train, dev = encoded(tok, 320, seed=10), encoded(tok, 128, seed=11)
    teacher_dir = finetune(classifier(tok.vocab_size, 4, seed=1), TrainRun(
        d / "teacher", train, dev, compute_metrics=accuracy, main_score="accuracy",
        args=dict(num_train_epochs=4, learning_rate=3e-3, per_device_train_batch_size=16, save_strategy="no",
                  eval_strategy="epoch", load_best_model_at_end=False, **FAST),
    ))
    teacher = transformers.AutoModelForSequenceClassification.from_pretrained(teacher_dir)
    acc = json.loads((teacher_dir / "metrics.json").read_text())["eval_accuracy"]
    return {"tok": tok, "train": train, "dev": dev, "teacher": teacher, "teacher_acc": acc, "dir": d}


#: TinyBERT's intermediate stage (eqs. 7-9) and prediction stage (eq. 10)
TINYBERT = {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}
PREDICTION = DistillSpec({"prediction_loss": 1.0}, "prediction")


def intermediate(layer_map, **kw) -> DistillSpec:
    return DistillSpec(TINYBERT, "intermediate", layer_map, **kw)


def student(vocab_size: int, seed: int = 2):
    # narrower than the teacher (24 vs 32) so the hidden projection is exercised; same head count (2)
    return classifier(vocab_size, 2, seed=seed, hidden=24, inter=48)


def test_tinybert_two_stage_student_reaches_90_percent_of_teacher(task, tmp_path):
    assert task["teacher_acc"] >= 0.9, "the teacher must learn the generated task for this test to mean anything"
    lm = build_layer_map("uniform", 2, 4)
    step1 = distill(task["teacher"], student(task["tok"].vocab_size), intermediate(lm), TrainRun(
        tmp_path / "step1", task["train"],
        args=dict(num_train_epochs=6, learning_rate=5e-3, per_device_train_batch_size=32, save_strategy="no", **FAST),
    ))
    log = read_log(step1 / "train_log.csv")
    att = [r["train_attention_loss"] for r in log if "train_attention_loss" in r]
    hid = [r["train_hidden_loss"] for r in log if "train_hidden_loss" in r]
    assert att[-1] < att[0] and hid[-1] < hid[0]
    assert all("train_embedding_loss" in r for r in log if "loss" in r)
    step2 = distill(
        task["teacher"], transformers.AutoModelForSequenceClassification.from_pretrained(step1), PREDICTION,
        TrainRun(tmp_path / "step2", task["train"], task["dev"], compute_metrics=accuracy, main_score="accuracy",
                 args=dict(num_train_epochs=4, learning_rate=3e-3, per_device_train_batch_size=16, **FAST)),
    )
    acc = json.loads((step2 / "metrics.json").read_text())["eval_accuracy"]
    assert acc >= 0.9 * task["teacher_acc"], (acc, task["teacher_acc"])


def test_projection_saved_beside_not_inside_and_student_loads_plainly(task, tmp_path):
    lm = build_layer_map("uniform", 2, 4)
    out = distill(task["teacher"], student(task["tok"].vocab_size), intermediate(lm),
                  TrainRun(tmp_path / "gd", task["train"].select(range(64)), tokenizer=task["tok"],
                           args=dict(max_steps=2, per_device_train_batch_size=32, **FAST)))
    with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
        keys = list(fh.keys())
    assert keys and not any("projection" in k or k.startswith("layers.") for k in keys)
    proj = load_projection(out)
    assert (proj.d_student, proj.d_teacher) == (24, 32)
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert isinstance(transformers.AutoModel.from_pretrained(out), transformers.BertModel)
    assert transformers.AutoTokenizer.from_pretrained(out) is not None
    # task distillation continues from the general student's projection
    cont = make_projection(model, task["teacher"], lm, init_from=out)
    assert torch.equal(cont.layers[0].weight, proj.layers[0].weight)
    with pytest.raises(FileNotFoundError, match=STATE_NAME):
        make_projection(model, task["teacher"], lm, init_from=tmp_path)


def test_resume_restores_student_and_projection(task, tmp_path):
    lm = build_layer_map("uniform", 2, 4)
    kw = dict(per_device_train_batch_size=16, save_strategy="steps", save_steps=3, logging_steps=1,
              **{k: v for k, v in FAST.items() if k != "logging_steps"})
    run = TrainRun(tmp_path / "r", task["train"].select(range(96)), args=kw)
    first = distill(task["teacher"], student(task["tok"].vocab_size, 3), intermediate(lm),
                    run.with_(args={"max_steps": 3}))
    # a checkpoint is the Distiller's state: the student and its projection in one file
    saved = load_file(str(tmp_path / "r" / "checkpoints" / "checkpoint-3" / "model.safetensors"))
    assert torch.equal(saved["projection.layers.0.weight"], load_projection(first).layers[0].weight)
    # a new run with fresh (different) student and projection resumes from checkpoint-3 and continues
    second = distill(task["teacher"], student(task["tok"].vocab_size, 4), intermediate(lm),
                     run.with_(args={"max_steps": 6}))
    steps = [int(r["step"]) for r in read_log(second / "train_log.csv") if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    # resuming a finished run trains nothing: the export is exactly the checkpoint (student AND projection)
    third = distill(task["teacher"], student(task["tok"].vocab_size, 5), intermediate(lm),
                    run.with_(args={"max_steps": 6}))
    ck = load_file(str(tmp_path / "r" / "checkpoints" / "checkpoint-6" / "model.safetensors"))
    assert torch.equal(load_projection(third).layers[0].weight, ck["projection.layers.0.weight"])
    a = transformers.AutoModel.from_pretrained(third).embeddings.word_embeddings.weight
    assert torch.equal(a, ck["student.bert.embeddings.word_embeddings.weight"])


class CountingTeacher:
    """Counts the examples the teacher's forward sees."""

    def __init__(self, model):
        self.n = 0
        model.register_forward_hook(lambda m, args, kwargs, out: self._add(kwargs), with_kwargs=True)

    def _add(self, kwargs):
        self.n += int(kwargs["input_ids"].shape[0])


def test_logits_cache_teacher_runs_once_per_example_across_grid(task, tmp_path):
    teacher = transformers.AutoModelForSequenceClassification.from_pretrained(task["dir"] / "teacher" / "model")
    counter = CountingTeacher(teacher)
    train, dev = task["train"].select(range(64)), task["dev"].select(range(32))
    make = lambda: student(task["tok"].vocab_size)  # noqa: E731
    run = TrainRun(tmp_path / "grid", train, dev, compute_metrics=accuracy, main_score="accuracy",
                   args=dict(save_strategy="no", eval_strategy="epoch", load_best_model_at_end=False, **FAST))
    grid = prediction_grid(teacher, make, PREDICTION, run,
                           Grid((1e-3, 3e-3), (16, 32), epochs=2, cache_dir=tmp_path / "cache"))
    assert counter.n == len(train)  # 4 runs x 2 epochs, one teacher pass
    assert len(grid.results) == 4 and grid.best["main"] == max(r["main"] for r in grid.results)
    assert json.loads((tmp_path / "grid" / "grid.json").read_text())["best"] == grid.best["name"]
    # the cache is reused from disk; the logits are the eval-mode teacher's
    ds = cache_teacher_logits(teacher, train, tmp_path / "cache", progress=False)
    assert counter.n == len(train)
    batch = train.with_format("torch")[:4]
    with torch.no_grad():
        ref = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"]).logits
    counter.n = 0
    assert torch.allclose(torch.tensor(ds["teacher_logits"][:4]), ref, atol=1e-5)
    # another dataset -> another key -> computed again
    cache_teacher_logits(teacher, train.select(range(10)), tmp_path / "cache", progress=False)
    assert counter.n == 10
    # without the cache: one teacher pass per run per epoch
    counter.n = 0
    prediction_grid(teacher, make, PREDICTION, run.with_(output_dir=tmp_path / "grid2"),
                    Grid((1e-3,), (32,), epochs=2, cache_teacher_logits=False))
    assert counter.n == 2 * len(train)


def test_teacher_fingerprint_follows_weights_not_the_directory(task, tmp_path):
    """The logits cache survives a moved project (two copies of one teacher share a key); other weights do not."""
    task["teacher"].save_pretrained(tmp_path / "a")
    task["teacher"].save_pretrained(tmp_path / "b")
    a, b = (transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / d) for d in "ab")
    assert a.config._name_or_path != b.config._name_or_path
    assert teacher_fingerprint(a) == teacher_fingerprint(b)
    with torch.no_grad():
        b.classifier.bias.add_(1e-3)
    assert teacher_fingerprint(a) != teacher_fingerprint(b)


def _trainer(task, tmp_path, teacher, train_mode):
    s = student(task["tok"].vocab_size)
    return Distiller(s, teacher, PREDICTION.with_(layer_map=build_layer_map("uniform", 2, 4),
                                                  teacher_train_mode=train_mode))


def test_teacher_eval_mode_by_default_train_mode_option(task, tmp_path):
    teacher = classifier(task["tok"].vocab_size, 2, hidden_dropout_prob=0.5)
    batch = {k: v for k, v in task["dev"].with_format("torch")[:8].items() if k in ("input_ids", "attention_mask")}
    tr = _trainer(task, tmp_path, teacher, False)
    a, b = tr.teacher_forward(batch)[0].logits, tr.teacher_forward(batch)[0].logits
    assert not teacher.training and torch.equal(a, b) and not a.requires_grad
    tr = _trainer(task, tmp_path, teacher, True)
    a, b = tr.teacher_forward(batch)[0].logits, tr.teacher_forward(batch)[0].logits
    assert teacher.training and not torch.equal(a, b) and not a.requires_grad


def test_configuration_errors_before_training(task, tmp_path):
    lm = build_layer_map("uniform", 2, 4)
    run = TrainRun(tmp_path, task["train"], args=FAST)
    with pytest.raises(LayerMapError):
        distill(task["teacher"], classifier(task["tok"].vocab_size, 2, heads=4), intermediate(lm), run)
    with pytest.raises(ObjectiveConfigError, match="at the 'prediction' level"):
        DistillSpec({"attention_loss": 1.0}, "prediction")
    with pytest.raises(ObjectiveConfigError, match="cosine_loss"):
        DistillSpec({"cosine_loss": 1.0}, "intermediate", lm)
    with pytest.raises(ObjectiveConfigError, match="no objective has a weight > 0"):
        DistillSpec({"attention_loss": 0.0}, "intermediate", lm)
    with pytest.raises(ValueError, match="level must be one of"):
        DistillSpec(TINYBERT, "both", lm)
    with pytest.raises(ValueError, match="needs a teacher"):
        distill(None, student(task["tok"].vocab_size), intermediate(lm), run)
    with pytest.raises(ValueError, match="teacher_logits"):  # no teacher and no cached logits column
        distill(None, student(task["tok"].vocab_size), PREDICTION, run)
    with pytest.raises(ValueError, match="need a layer_map"):
        distill(task["teacher"], student(task["tok"].vocab_size), DistillSpec(TINYBERT, "intermediate"), run)
    assert not (tmp_path / "model").exists()


def test_projection_file_bytes_are_stable(tmp_path):
    """The same projection saved twice gives the same bytes (a content fingerprint must not see a change)."""
    from distillery.objectives import HiddenProjection
    from distillery.training.distill_state import save_projection

    torch.manual_seed(0)
    proj = HiddenProjection(4, 8, n_states=2, shared=False)
    files = [save_projection(proj, tmp_path / str(i)).read_bytes() for i in range(5)]
    assert all(f == files[0] for f in files)
    loaded = load_projection(tmp_path / "0")
    assert (loaded.d_student, loaded.d_teacher, loaded.n_states, loaded.shared) == (4, 8, 2, False)

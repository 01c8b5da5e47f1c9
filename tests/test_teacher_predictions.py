"""A teacher known only by its predictions (`distillery.teacher_predictions`, ``teacher.predictions.<task>``): the file
read exactly or refused in one line, a student taught by it exactly as by the runnable teacher whose logits it holds,
the students that need a runnable teacher refused before any work, and a micro pipeline distilling from a file
alone."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers import FAST, ONE_STUDENT, finetuned_teacher, make_project, reviews, run, task_of, task_sections, tokenizer


def _spec(task: str = "sst2"):
    from distillery.glue.tasks import get_task

    return get_task(task)


def _rows(texts, pairs=None, split_idx=None):
    from distillery.glue.loaders import _rows_to_dataset

    out = {"text_a": list(texts), "label": [0] * len(texts), "idx": list(split_idx or range(len(texts)))}
    if pairs is not None:
        out["text_b"] = list(pairs)
    return _rows_to_dataset(_spec("mrpc" if pairs is not None else "sst2"), out)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_probabilities_keyed_by_text_become_logits_softmax_gives_back(tmp_path):
    from distillery.teacher_predictions import logits_for, read

    f = _jsonl(tmp_path / "p.jsonl", [{"text": "good film", "0": 0.2, "1": 0.8},
                                       {"text": "bad film", "0": 1.0, "1": 0.0},
                                       {"text": "good film", "0": 0.2, "1": 0.8},  # the same twice: fine
                                       {"text": "not in the task", "0": 0.5, "1": 0.5}])
    got = logits_for(read(f, _spec()), _rows(["bad film", "good film"]), "train")
    assert got.dtype == np.float32 and got.shape == (2, 2)
    probs = torch.softmax(torch.from_numpy(got).double(), -1)
    assert torch.allclose(probs, torch.tensor([[1.0, 0.0], [0.2, 0.8]], dtype=torch.float64), atol=1e-7)
    assert np.isfinite(got).all()  # a probability of 0 is the float32's smallest logit, not -inf


def test_logits_keyed_by_split_and_idx_in_csv_and_a_pair_task_by_both_texts(tmp_path):
    from distillery.teacher_predictions import logits_for, read

    f = tmp_path / "p.csv"
    f.write_text("split,idx,0,1\ntrain,4,-1.5,2\ndev,4,3,0.25\n")
    p = read(f, _spec(), "logits")
    assert logits_for(p, _rows(["x"], split_idx=[4]), "dev").tolist() == [[3.0, 0.25]]
    assert logits_for(p, _rows(["x"], split_idx=[4]), "train").tolist() == [[-1.5, 2.0]]
    pair = _jsonl(tmp_path / "pair.jsonl", [{"text": "a", "text_pair": "b", "0": 0.5, "1": 0.5}])
    assert logits_for(read(pair, _spec("mrpc")), _rows(["a"], ["b"]), "dev").shape == (1, 2)
    score = _jsonl(tmp_path / "score.jsonl", [{"text": "a", "text_pair": "b", "score": -2.5}])  # any sign
    assert logits_for(read(score, _spec("stsb")), _rows(["a"], ["b"]), "dev").tolist() == [[-2.5]]


@pytest.mark.parametrize("content, values, match", [
    ('{"text": "a", "0": 0.5}\n', "probabilities", r"p.jsonl:1: no column '1'; the file needs '0', '1'"),
    ('{"text": "a", "0": 0.5, "1": 0.6}\n', "probabilities", r"p.jsonl:1: probabilities \[0.5, 0.6\] are not in"),
    ('{"text": "a", "0": -0.1, "1": 1.1}\n', "probabilities", r"p.jsonl:1: probabilities"),
    ('{"text": "a", "0": "NaN", "1": 1}\n', "logits", r"p.jsonl:1: column '0' holds 'NaN', not a finite number"),
    ('{"text": "a", "0": 1e39, "1": 1}\n', "logits", r"column '0' holds 1e\+39, not a finite number a float32"),
    ('{"text": "a", "0": [0.5], "1": 1}\n', "logits", r"column '0' holds \[0.5\]"),
    ('{"text": "a", "0": 1, "1": 0}\n{"text": "a", "0": 0, "1": 1}\n', "probabilities",
     r"p.jsonl:2: the text 'a' has other values at .*p.jsonl:1"),
    ('{"split": "test", "idx": 1, "0": 1, "1": 0}\n', "probabilities", r"split 'test': a file keyed by idx"),
    ('{"split": "dev", "idx": 1.5, "0": 1, "1": 0}\n', "probabilities", r"idx 1.5 is not a row id"),
    ('{"review": "a", "0": 1, "1": 0}\n', "probabilities", r"no text in column 'text'"),
    ('[1, 2]\n', "probabilities", r"teacher.predictions.sst2: .*p.jsonl:1: a JSON list, not an object"),
    ('', "probabilities", r"p.jsonl: no rows"),
])
def test_a_bad_predictions_file_is_one_line_naming_the_key_file_and_line(tmp_path, content, values, match):
    from distillery.teacher_predictions import PredictionsError, read

    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(PredictionsError, match=match) as info:
        read(f, _spec(), values, "teacher.predictions.sst2")
    assert str(info.value).startswith("teacher.predictions.sst2: ") and "\n" not in str(info.value)


def test_a_row_the_file_does_not_cover_is_named_with_how_many_are_missing(tmp_path):
    from distillery.teacher_predictions import PredictionsError, logits_for, read

    f = _jsonl(tmp_path / "p.jsonl", [{"text": "a", "0": 1, "1": 0}])
    with pytest.raises(PredictionsError, match=r"no prediction for the dev row 7 \(the text 'b'\); 2 of the task's 3"):
        logits_for(read(f, _spec()), _rows(["a", "b", "c"], split_idx=[5, 7, 9]), "dev")


def test_a_student_taught_by_the_file_is_the_student_taught_by_the_runnable_teacher(tmp_path):
    """The soft targets of a predicted teacher are the logits the runnable teacher's cache would give its grid: the
    same plan from either task trains the same student, bit for bit."""
    from distillery.recipes.pkd import PKDRecipe
    from distillery.training.logits_cache import compute_teacher_logits
    from distillery.training.plan import Plan, Start, run_plan
    from distillery.recipes.steps import predict

    (tmp_path / "tok").mkdir()
    tok = tokenizer(tmp_path / "tok")
    teacher, train, dev = finetuned_teacher(tok, tmp_path / "teacher")
    teacher.save_pretrained(tmp_path / "saved")
    recipe = PKDRecipe(shape={"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64}, init="random", beta=0)
    sections = task_sections(epochs=1)
    plan = Plan((predict(recipe, Start("init", recipe), sections),))
    args = {**FAST, "logging_steps": 2}
    torch.manual_seed(0)  # the student's random init (computing the teacher's logits first draws nothing from it)
    runnable = run_plan(plan, task_of(teacher, tok, train, dev, train_args=args), sections, tmp_path / "a")
    logits = compute_teacher_logits(teacher, train, tokenizer=tok, progress=False)
    predicted = task_of(None, tok, train, dev, train_args=args, soft_targets=dict(zip(train["idx"][:], logits)),
                        pretrained=str(tmp_path / "saved"))
    torch.manual_seed(0)
    from_file = run_plan(plan, predicted, sections, tmp_path / "b")
    from safetensors.torch import load_file

    a, b = (load_file(str(r.grid.best_dir / "model.safetensors")) for r in (runnable, from_file))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_saved_classifier_writes_the_file_its_logits_cache_would_give(tmp_path):
    """`distillery predict`'s writer: every row of the prepared task keyed by split and idx; read back, its logits are
    the teacher's (probabilities: up to a constant per row, which no softmax sees)."""
    import datasets

    from helpers import classifier
    from distillery.teacher_predictions import logits_for, read, write
    from distillery.training.logits_cache import compute_teacher_logits

    (tmp_path / "tok").mkdir()
    tok = tokenizer(tmp_path / "tok")
    model = classifier(len(tok), 2)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    texts = ["good film", "awful plot", "a great and fine day", "bad"]
    data = datasets.DatasetDict({"train": _rows(texts[:3], split_idx=[0, 1, 2]), "dev": _rows(texts[3:], split_idx=[0])})
    inputs = datasets.Dataset.from_dict(dict(tok(texts[:3], truncation=True, max_length=16)))
    want = compute_teacher_logits(model, inputs, tokenizer=tok, progress=False)
    for values in ("logits", "probabilities"):
        out = tmp_path / f"{values}.jsonl"
        assert write(tmp_path / "m", "sst2", data, out, 16, values) == 4
        got = torch.from_numpy(logits_for(read(out, _spec(), values), data["train"], "train"))
        if values == "logits":
            assert torch.equal(got, want)
        else:
            assert torch.allclose(torch.softmax(got, -1), torch.softmax(want, -1), atol=1e-6)
        assert json.loads(out.read_text().splitlines()[-1])["split"] == "dev"


def _params(tmp_path, **over):
    custom = reviews(tmp_path / "reviews", n_train=120, n_dev=40)
    params = {**ONE_STUDENT, "data": {**ONE_STUDENT["data"], "tasks": ["reviews"], "custom": {"reviews": custom}},
              "augment": {"enabled": False},
              "teacher": {**ONE_STUDENT["teacher"], "predictions": {"reviews": str(tmp_path / "reviews" / "p.jsonl")}},
              "students": {"kd": {"recipe": "pkd", "beta": 0,
                                  "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}}}}
    for k, v in over.items():
        params[k] = {**params[k], **v} if isinstance(v, dict) and isinstance(params.get(k), dict) else v
    return params


@pytest.mark.parametrize("over, match", [
    ({"students": {"tiny": {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2,
                                                           "intermediate": 32}}}},
     r"students.tiny: its task step intermediate reads the teacher's internals \(attention_loss, hidden_loss, "
     r"embedding_loss\), and task reviews's teacher is known by its predictions only \(teacher.predictions.reviews\)"),
    ({"students": {"pkd": {"recipe": "pkd", "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}}}},
     r"students.pkd: its task step grid reads the teacher's internals \(patient_loss\)"),
    ({"students": {"p": {"recipe": "pkd", "beta": 0, "layers_from": "finetuned",
                         "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}}}},
     r"students.p: its task step grid starts from the fine-tuned teacher's layers \(init teacher_layers\)"),
    ({"students": {"d": {"recipe": "distilbert", "task_distillation": True, "init": {"teacher_layers": [1]},
                         "shape": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "arch": "distilbert"}}}},
     None),
    ({"augment": {"enabled": True}}, r"augment.enabled: augmentation labels its new rows with the task's fine-tuned"),
    ({"students": {"b": {"recipe": "pkd", "beta": 0, "budget": {"latency_ms": 10}}}},
     r"students.b.budget: a budget is a speedup over the teacher"),
    ({"teacher": {**ONE_STUDENT["teacher"], "predictions": {"sst2": "p.jsonl"}}},
     r"teacher: .*predictions: 'sst2' is not in data.tasks"),
    ({"teacher": {**ONE_STUDENT["teacher"], "predictions": {"reviews": "p.jsonl"}, "finetuned": {"reviews": "t"}}},
     r"predictions: 'reviews' has a teacher in teacher.finetuned too"),
    ({"teacher": {**ONE_STUDENT["teacher"], "predictions": {}, "ensemble": {"reviews": [{"file": "p.jsonl"}]}}},
     r"ensemble.reviews: an ensemble has two teachers or more, got 1"),
    ({"teacher": {**ONE_STUDENT["teacher"], "predictions": {},
                  "ensemble": {"reviews": [{"file": "p.jsonl", "model": "m"}, {"file": "q.jsonl"}]}}},
     r"give either `file` \(a predictions file\) or `model` \(a fine-tuned classifier\)"),
    ({"teacher": {**ONE_STUDENT["teacher"], "predictions": {},
                  "ensemble": {"reviews": [{"file": "p.jsonl"}, {"file": "q.jsonl"}]}},
      "students": {"pkd": {"recipe": "pkd", "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}}}},
     r"students.pkd: its task step grid reads the teacher's internals \(patient_loss\), and task reviews's teacher is "
     r"known by its predictions only \(teacher.ensemble.reviews\)"),
])
def test_students_that_need_a_runnable_teacher_are_refused_before_any_work(tmp_path, over, match):
    from distillery.config import ConfigError
    from distillery.preflight import load_params

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_params(tmp_path, **over)))
    if match is None:  # a general stage's teacher layers come from the pre-trained teacher: fine
        load_params(tmp_path / "params.yaml")
        return
    with pytest.raises(ConfigError, match=match):
        load_params(tmp_path / "params.yaml")


def test_a_bad_predictions_file_stops_the_run_before_any_work(tmp_path):
    from distillery.config import ConfigError
    from distillery.preflight import load_params

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_params(tmp_path)))
    with pytest.raises(ConfigError, match=r"teacher.predictions.reviews: .*p.jsonl not found"):
        load_params(tmp_path / "params.yaml", inputs=True)
    _jsonl(tmp_path / "reviews" / "p.jsonl", [{"text": "a", "pan": 0.5, "praise": 0.6}])
    with pytest.raises(ConfigError, match=r"teacher.predictions.reviews: .*p.jsonl:1: probabilities \[0.5, 0.6\]"):
        load_params(tmp_path / "params.yaml", inputs=True)


def test_a_student_distils_from_a_predictions_file_alone_end_to_end(tmp_path):
    """A micro pipeline whose teacher is a file of probabilities keyed by text (an LLM's, say: right on 90% of the
    rows): the teacher stage scores dev from it and passes the gate, BERT-PKD's KD row (beta 0) distils from it at
    prediction level, the summary has no speedup over a teacher that cannot be timed, the card names the file."""
    params = _params(tmp_path, evaluation={**ONE_STUDENT["evaluation"], "baselines": True, "latency": True})
    project = make_project(tmp_path / "project", params, dvc_yaml=False)
    rows = []
    for split in ("train", "dev"):
        with (tmp_path / "reviews" / f"{split}.csv").open(encoding="utf-8") as f:
            for i, r in enumerate(csv.DictReader(f)):
                right = 0.9 if i % 10 else 0.3  # every tenth row wrong
                p = right if r["verdict"] == "praise" else 1 - right
                rows.append({"text": r["review"], "pan": round(1 - p, 6), "praise": round(p, 6)})
    _jsonl(tmp_path / "reviews" / "p.jsonl", rows)
    run([sys.executable, "-m", "flows.stage", "all"], project)
    teacher = project / "models" / "teacher" / "reviews" / "model"
    assert not (teacher / "config.json").exists() and (teacher / "soft_targets.safetensors").is_file()
    summary = json.loads((project / "metrics" / "summary.json").read_text())["reviews"]
    assert math.isclose(summary["teacher"]["accuracy"], 36 / 40)  # the file's own accuracy on dev
    assert summary["teacher"]["predictions"].endswith("p.jsonl") and summary["teacher"]["passed_gate"]
    assert "params" not in summary["teacher"]
    kd = summary["kd"]
    assert kd["retention"] > 0 and kd["train_rows_gold"] == 120 and "latency_ms_b1" in kd
    assert not any(k.startswith("speedup") for k in kd), kd
    assert "kd-direct" in summary


def test_an_ensemble_is_the_weighted_mean_of_its_teachers_probabilities_float64():
    from distillery.teacher_predictions import mean

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(5, 3, dtype=torch.float64, generator=g) for _ in range(2))
    got = mean([({"dev": a.float().numpy()}, 1.0), ({"dev": b.float().numpy()}, 3.0)], _spec("mnli"))["dev"]
    want = (0.25 * a.float().double().softmax(-1) + 0.75 * b.float().double().softmax(-1))
    assert torch.allclose(torch.from_numpy(got).double().softmax(-1), want, atol=1e-6, rtol=0)
    s1, s2 = np.array([[1.0], [-2.0]], np.float32), np.array([[3.0], [0.0]], np.float32)
    assert mean([({"dev": s1}, 1.0), ({"dev": s2}, 1.0)], _spec("stsb"))["dev"].tolist() == [[2.0], [-1.0]]


def _roberta(directory, train: Path | None = None):
    """A RoBERTa-type classifier with a tokenizer of its own (the test vocabulary, not the students' WordPiece); with
    `train` (a reviews() train.csv), a vocabulary of its words (ids of its own) and fine-tuned on it."""
    import transformers

    directory.mkdir(parents=True)
    if train is None:
        tok = tokenizer(directory)
    else:
        with train.open(encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        words = sorted({w for r in rows for w in re.findall(r"\w+|[^\w\s]", r["review"].lower())})
        (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
        tok = transformers.BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    roberta = transformers.RobertaForSequenceClassification(transformers.RobertaConfig(
        vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=40, pad_token_id=0, num_labels=2))
    if train is not None:
        enc = tok([r["review"] for r in rows], truncation=True, max_length=24, padding=True, return_tensors="pt")
        labels = torch.tensor([["pan", "praise"].index(r["verdict"]) for r in rows])
        optimizer = torch.optim.AdamW(roberta.parameters(), lr=3e-3)
        for _ in range(20):
            for i in range(0, len(rows), 16):
                batch = slice(i, i + 16)
                roberta(input_ids=enc["input_ids"][batch], attention_mask=enc["attention_mask"][batch],
                        labels=labels[batch]).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        roberta.eval()
    roberta.save_pretrained(directory)
    tok.save_pretrained(directory)
    return roberta, tok


def test_a_teacher_of_another_tokenizer_and_type_gives_its_predictions_to_the_students(tmp_path):
    """``teacher.predictions.<task>: {model: ...}``: a RoBERTa-type classifier, its own tokenizer: the teacher stage
    runs it on every row's text with its tokenizer, scores dev by it and keeps its logits as the soft targets, beside the
    students' BERT WordPiece tokenizer (the pre-trained teacher's); a BERT student distils from them through every
    stage."""
    from distillery.teacher_predictions import load_soft_targets

    params = _params(tmp_path)
    roberta, tok = _roberta(tmp_path / "roberta", train=tmp_path / "reviews" / "train.csv")
    params["teacher"] = {**ONE_STUDENT["teacher"], "predictions": {"reviews": {"model": str(tmp_path / "roberta")}}}
    project = make_project(tmp_path / "project", params, dvc_yaml=False)
    run([sys.executable, "-m", "flows.stage", "all"], project)
    summary = json.loads((project / "metrics" / "summary.json").read_text())["reviews"]
    assert summary["teacher"]["predictions"] == str(tmp_path / "roberta") and "retention" in summary["kd"], summary
    student = json.loads((project / "models" / "students" / "kd-reviews" / "model" / "config.json").read_text())
    assert student["model_type"] == "bert"
    teacher = project / "models" / "teacher" / "reviews" / "model"
    targets = load_soft_targets(teacher)
    assert len(targets) == 120 and not (teacher / "config.json").exists()
    with (tmp_path / "reviews" / "train.csv").open(encoding="utf-8") as f:
        first = next(csv.DictReader(f))["review"]
    import datasets

    rows = datasets.load_from_disk(str(project / "data" / "tasks" / "reviews"))["train"]
    i = rows["text_a"][:].index(first)
    with torch.no_grad():  # its own tokenizer on the raw text, as the stage ran it (bf16 or fp32: within bf16's step)
        want = roberta.eval()(**tok(first, truncation=True, max_length=24, return_tensors="pt")).logits[0]
    assert torch.allclose(targets[rows["idx"][i]], want, atol=2e-2), (targets[rows["idx"][i]], want)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(teacher)).get_vocab() != tok.get_vocab()  # the students' own


def test_an_ensemble_of_a_roberta_classifier_and_a_predictions_file_distils_end_to_end(tmp_path):
    """Two teachers of different kinds: a RoBERTa-type classifier with a tokenizer of its own (not the students') and a
    predictions file, weighted 1 and 3: the teacher stage scores each and their mean, the report has a row per
    teacher and the ensemble's, the student distils from the mean of their probabilities."""
    _roberta(tmp_path / "roberta")
    params = _params(tmp_path)
    params["teacher"] = {**ONE_STUDENT["teacher"], "ensemble": {"reviews": [
        {"model": str(tmp_path / "roberta"), "name": "roberta"},
        {"file": str(tmp_path / "reviews" / "p.jsonl"), "weight": 3, "name": "llm"}]}}
    project = make_project(tmp_path / "project", params, dvc_yaml=False)
    rows = []
    for split in ("train", "dev"):
        with (tmp_path / "reviews" / f"{split}.csv").open(encoding="utf-8") as f:
            for i, r in enumerate(csv.DictReader(f)):
                rows.append({"text": r["review"], "pan": float(r["verdict"] == "pan"),
                             "praise": float(r["verdict"] == "praise")})
    _jsonl(tmp_path / "reviews" / "p.jsonl", rows)
    run([sys.executable, "-m", "flows.stage", "all"], project)
    summary = json.loads((project / "metrics" / "summary.json").read_text())["reviews"]
    assert summary["teacher-llm"]["accuracy"] == 1.0 and summary["teacher-llm"]["member_of"] == "teacher"
    assert summary["teacher-roberta"]["weight"] == 1.0 and summary["teacher"]["predictions"] == "ensemble"
    # weighted 3 to 1, a one-hot teacher outvotes any other: the mean's argmax is the file's on every row
    assert summary["teacher"]["accuracy"] == 1.0 and summary["kd"]["train_rows_gold"] == 120
    table = (project / "reports" / "table.md").read_text()
    assert "| teacher-roberta |" in table and "| teacher-llm |" in table, table

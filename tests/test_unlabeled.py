"""Unlabelled in-domain text as distillation data (`distillery.unlabeled`, ``data.unlabeled``): the rows, their
checks, the gold-label losses that skip them, and a micro pipeline whose soft-target steps read them while fine-tuning
and the direct baseline do not."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import ONE_STUDENT, MICRO, make_project, run


def _demo_train(n: int = 50):
    import datasets

    from distillery.glue.loaders import _rows_to_dataset
    from distillery.glue.tasks import get_task

    rows = {"text_a": [f"sentence {i}" for i in range(n)], "label": [i % 2 for i in range(n)], "idx": list(range(n))}
    return _rows_to_dataset(get_task("demo"), rows), datasets


def test_rest_is_exactly_what_the_training_subset_leaves_out():
    from distillery.unlabeled import rest_rows
    from tasks.data import _subset

    train, _ = _demo_train(50)
    kept = _subset(train, 20, seed=3)
    rest = rest_rows(train, "demo", 20, 3, None)
    assert sorted(kept["idx"][:] + rest["idx"][:]) == list(range(50)) and not set(kept["idx"][:]) & set(rest["idx"][:])
    assert set(rest["label"][:]) == {-1} and len(rest) == 30
    assert rest_rows(train, "demo", 20, 3, 7)["idx"][:] == rest["idx"][:7]


def test_rest_of_a_whole_split_is_refused_naming_the_key():
    from distillery.unlabeled import UnlabeledError, rest_rows

    train, _ = _demo_train(10)
    with pytest.raises(UnlabeledError, match=r"data.unlabeled \(task demo\): rest: the training split has 10 rows"):
        rest_rows(train, "demo", 10, 3, None, "data.unlabeled (task demo)")


def test_a_file_gives_its_texts_unlabelled_with_keys_of_their_own(tmp_path):
    from distillery.unlabeled import UnlabeledError, read_file

    f = tmp_path / "u.jsonl"
    f.write_text("\n".join(json.dumps({"text": f"a text {i}", "other": 1}) for i in range(5)) + "\n")
    rows = read_file(f, "demo", None, None)
    assert rows["text_a"][:] == [f"a text {i}" for i in range(5)] and rows["idx"][:] == [-1, -2, -3, -4, -5]
    assert set(rows["label"][:]) == {-1}
    assert len(read_file(f, "demo", None, 2)) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("review\nfine\n")
    with pytest.raises(UnlabeledError, match=r"bad.csv:2: no column 'text'"):
        read_file(bad, "demo", None, None)
    empty = tmp_path / "empty.csv"
    empty.write_text('text\nfine\n""\n')
    with pytest.raises(UnlabeledError, match=r"empty.csv:3: column 'text' holds ''"):
        read_file(empty, "demo", None, None)


@pytest.mark.parametrize("data, match", [
    ({"unlabeled": "texts.docx"}, r"data.unlabeled: .*'texts.docx': give rest"),
    ({"unlabeled": "rest"}, r"data.unlabeled: rest is the training rows data.max_train_examples leaves out"),
])
def test_bad_unlabeled_settings_name_the_key(tmp_path, data, match):
    import yaml

    from distillery.config import ConfigError
    from distillery.preflight import load_params

    params = {**ONE_STUDENT, "data": {**ONE_STUDENT["data"], **data}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=match):
        load_params(tmp_path / "params.yaml")


def test_gold_label_losses_skip_unlabelled_rows_float64():
    from distillery.objectives.pkd import hard_label_loss
    from distillery.objectives.tinybert import regression_prediction_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.tensor([2, -1, 0, -1, 1, 1])
    keep = labels >= 0
    # reference: -log softmax at the gold class, mean over the labelled rows
    ref = -(logits[keep] - logits[keep].exp().sum(-1, keepdim=True).log()).gather(1, labels[keep, None]).mean()
    assert torch.allclose(hard_label_loss(logits, labels), ref, atol=1e-12, rtol=0)
    none = hard_label_loss(logits, torch.full((6,), -1))
    assert none.item() == 0.0
    none.backward()
    assert logits.grad is not None and torch.count_nonzero(logits.grad) == 0
    scores = torch.randn(6, 1, dtype=torch.float64, generator=g)
    gold = torch.tensor([0.5, math.nan, 2.0, math.nan, -1.0, 3.0], dtype=torch.float64)
    ok = ~gold.isnan()
    want = ((scores.squeeze(-1)[ok] - gold[ok]) ** 2).mean()
    assert torch.allclose(hard_label_loss(scores, gold), want, atol=1e-12, rtol=0)
    assert torch.allclose(regression_prediction_loss(scores, None, gold, target="gold"), want, atol=1e-12, rtol=0)
    assert torch.equal(hard_label_loss(logits.detach(), labels.clamp(min=0)),
                       F.cross_entropy(logits.detach(), labels.clamp(min=0)))  # all labelled: as before


def test_soft_target_steps_read_the_rest_and_fine_tuning_does_not(tmp_path):
    """A micro run with `unlabeled: rest`: TinyBERT's steps (augmented step 1, prediction step 2) and BERT-PKD's task
    stage read the 150 rows max_train_examples left out; DistilBERT's fine-tuning and every direct baseline read the 50
    gold rows only, and the prepared task keeps them apart."""
    import datasets

    params = {**ONE_STUDENT,
              "data": {**ONE_STUDENT["data"], "max_train_examples": 50, "unlabeled": "rest"},
              "augment": {"n_aug": 2, "max_examples": 10},
              "students": {"micro": MICRO["students"]["micro"], "micro-pkd": MICRO["students"]["micro-pkd"],
                           "micro-distilbert": MICRO["students"]["micro-distilbert"]},
              "evaluation": {**ONE_STUDENT["evaluation"], "baselines": True}}
    project = make_project(tmp_path, params, dvc_yaml=False)
    run([sys.executable, "-m", "flows.stage", "all"], project)
    data = datasets.load_from_disk(str(project / "data" / "tasks" / "demo"))
    assert len(data["train"]) == 50 and len(data["unlabeled"]) == 150 and set(data["unlabeled"]["label"][:]) == {-1}

    def rows(student):
        return json.loads((project / "models" / "students" / f"{student}-demo" / "rows.json").read_text())

    tiny, pkd, distilbert = (rows(s) for s in ("micro", "micro-pkd", "micro-distilbert"))
    assert tiny["train_rows_unlabeled"] == 150 and tiny["train_rows_gold"] == 50 and tiny["train_rows_augmented"] > 0
    assert pkd["train_rows_unlabeled"] == 150 and pkd["train_rows_augmented"] == 0
    assert distilbert["train_rows_unlabeled"] == 0 and distilbert["train_rows_gold"] == 50
    # the summary and the report say what each student and each direct baseline read
    summary = json.loads((project / "metrics" / "summary.json").read_text())["demo"]
    assert summary["micro"]["train_rows_unlabeled"] == 150
    assert {k: v for k, v in summary["micro-direct"].items() if k.startswith("train_rows_")} == {
        "train_rows_gold": 50, "train_rows_augmented": 0, "train_rows_unlabeled": 0}
    line = next(x for x in (project / "reports" / "table.md").read_text().splitlines()
                if x.startswith("- Training rows on demo (gold / augmented / unlabelled): "))
    assert "; micro-pkd 50 / 0 / 150;" in line and "micro-pkd-direct 50 / 0 / 0" in line, line

"""Continual distillation: each run compares itself with the last (reports/changes.md, one console line), re-runs only
what changed, and promotes a challenger only over a champion measured on the same dev data."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import ONE_STUDENT, make_project, reviews, run, stage_lines


def _changes(project) -> str:
    return (project / "reports" / "changes.md").read_text()


def _line(console: str) -> str:
    return next(line for line in stage_lines(console) if line.startswith("changes: "))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("changes")
    (tmp / "reviews").mkdir()
    params = {**ONE_STUDENT, "augment": {"enabled": False},
              "data": {**ONE_STUDENT["data"], "tasks": ["reviews"], "custom": {"reviews": reviews(tmp / "reviews")}}}
    return make_project(tmp / "project", params, dvc_yaml=False)


def _registry(project) -> dict:
    return json.loads((project / "metrics" / "registry" / "micro-reviews.json").read_text())


def test_a_run_says_what_changed_reruns_only_that_and_compares_champions_on_the_same_data(project):
    all_ = [sys.executable, "-m", "flows.stage", "all"]
    first = run(all_, project).stdout
    assert _line(first).startswith("changes: First run")
    assert _registry(project)["alias"] == "champion"

    # (a) nothing changed: every stage cached, one line says so
    again = run(all_, project).stdout
    assert _line(again).startswith("changes: No change since the last run")
    assert "started" not in again and _changes(project).count("\n") <= 3

    # (b) rows appended to the training file: that task's stages run again; the report says what and how much
    train = project.parent / "reviews" / "train.csv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join(lines + ["the script was truly wonderful,praise", "the acting was dull,pan",
                                        "the ending felt so lovely,praise"]) + "\n")
    changed = run(all_, project).stdout
    assert _line(changed) == "changes: reports/changes.md (inputs, rows, params, stages, champions)"
    report = _changes(project)
    assert "`reviews` train: 3 rows added, 0 removed (200 -> 203)" in report
    assert f"`{train}`" in report  # the input file, old -> new hash
    ran = next(line for line in report.splitlines() if line.startswith("- ran ("))
    assert "prepare_task[reviews]" in ran and "finetune_teacher[reviews]" in ran and "prepare_corpus" not in ran
    assert "| micro-reviews | v1 " in report

    # (c) a challenger that cannot beat the champion by the margin: the champion stays, the version says why
    params = project / "params.yaml"
    params.write_text(params.read_text() + "registry: {promote_margin: 1.0}\n")
    dev = project.parent / "reviews" / "dev.csv"
    dev.write_text("\n".join(dev.read_text().splitlines()[:-10]) + "\n")  # and the dev split changes
    run(all_, project)
    record = _registry(project)
    assert record["alias"] == "candidate" and not record["promoted"] and record["champion"]["version"] == 1
    # the old champion was measured on the new dev split before the comparison
    assert record["reason"].startswith("the task data changed since the champion (version 1) was registered: "
                                       "re-evaluated on the new dev split")
    assert "does not beat the champion (version 1)" in record["reason"]
    report = _changes(project)
    assert "`reviews` dev: 0 rows added, 10 removed (60 -> 50)" in report
    assert "`registry.promote_margin`: 0.0 -> 1.0" in report
    assert "re-evaluated on the new dev split" in report

"""A task whose teacher fails the gate is skipped, not the run (issue 27, item 9): the pieces, fast. The whole
pipeline with one failing task of two is tests/test_pipeline_e2e.py::test_a_failed_teacher_gate_skips_only_its_task.

- a stage body that raises SkipStage (TeacherGateError is one) succeeds without running: its outputs become skip
  records, it is stamped (fresh on a re-run), and the console says so in one line;
- the trivial predictions the submission files get for such a task;
- the report: one line per failed task, and no average over fewer tasks than the table has.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from distillery import glue
from distillery.config import parse_params
from distillery.report import build_rows, render_markdown
from tasks import execute as execute_mod
from tasks import stage as stage_mod
from tasks.stage import SkipStage, Stage, is_fresh, skipped
from tasks.teacher import TeacherGateError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def params():
    return parse_params(yaml.safe_load((ROOT / "params.yaml").read_text()))


@pytest.mark.parametrize("error", [SkipStage, TeacherGateError])
def test_a_skipped_stage_succeeds_with_skip_records_and_one_line(tmp_path, params, monkeypatch, capsys, error):
    monkeypatch.setattr(stage_mod, "STAMPS", tmp_path / "stamps")
    monkeypatch.setattr(execute_mod, "STAMPS", tmp_path / "stamps")
    monkeypatch.setattr(execute_mod.tracking, "run", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(execute_mod.tracking, "log_result", lambda result, untracked=None: None)
    monkeypatch.setattr("mlflow.set_tag", lambda *a: None)
    monkeypatch.setattr(execute_mod.paths, "curves", lambda name: tmp_path / "curves" / f"{name}.csv")
    model, augmented = tmp_path / "students" / "s-t" / "model", tmp_path / "augmented" / "t.tsv"
    calls = []

    def body(p, item):
        calls.append(item)
        raise error("t: the fine-tuned teacher scores 0.5 ... (the long line)", "the t teacher failed the gate")

    s = Stage("toy", run=body, deps=lambda p, i: [], outs=lambda p, i: [model, augmented], params=lambda p, i: {})
    result = execute_mod.execute(s, params, "s:t")
    assert result["skipped"] == "the t teacher failed the gate"
    assert skipped(model) == "the t teacher failed the gate" and not (model / "config.json").exists()
    assert json.loads(augmented.read_text()) == {"skipped": "the t teacher failed the gate"}
    assert (tmp_path / "curves" / "toy-s-t.csv").read_text() == "step,loss\n"  # no step; DVC's declared plot exists
    assert is_fresh(s, params, "s:t")  # stamped: the flow, `flows.stage` and `dvc repro` find it done
    assert execute_mod.execute(s, params, "s:t")["cached"] is True and calls == ["s:t"]
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["toy[s:t]: started", "toy[s:t]: skipped: the t teacher failed the gate", "toy[s:t]: cached"]


def test_a_trained_output_is_not_a_skip_record(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert skipped(tmp_path / "model") is None and skipped(tmp_path / "missing") is None


def test_trivial_predictions_are_the_majority_class_or_the_mean_score(tmp_path):
    ids = glue.trivial_predictions("sst2", [1, 0, 1, 1], 3)
    assert ids.dtype == np.int64 and ids.tolist() == [1, 1, 1]
    assert glue.trivial_predictions("stsb", [1.0, 2.0, 4.5], 2).tolist() == pytest.approx([2.5, 2.5])
    path = glue.write_submission("sst2", ids, tmp_path, indices=[7, 8, 9])
    assert path.read_text() == "index\tprediction\n7\t1\n8\t1\n9\t1\n"
    assert glue.trivial_baseline("sst2", [1, 0, 1], [1, 0]) == glue.compute_metrics("sst2", [1, 1], [1, 0])


def test_the_prepared_task_keeps_its_trivial_baseline_which_the_gate_reads(tmp_path, params, monkeypatch):
    """`prepare_task` saves the trivial baseline's dev metrics beside the task's splits; the gate and the evaluation
    read that file (no stage computes it again)."""
    import datasets

    from tasks import paths
    from tasks.data import save_task
    from tasks.teacher import trivial_baseline

    monkeypatch.setattr(paths, "DATA", tmp_path / "data")

    def split(labels):
        return datasets.Dataset.from_dict({"sentence": ["a film"] * len(labels), "label": labels,
                                           "idx": list(range(len(labels)))})

    save_task(params, "sst2", datasets.DatasetDict({"train": split([0, 1, 0, 0]), "dev": split([0, 1, 1])}))
    assert trivial_baseline("sst2") == {**glue.compute_metrics("sst2", [0, 0, 0], [0, 1, 1]), "main": 1 / 3}
    assert datasets.load_from_disk(str(paths.task_data("sst2")))["dev"]["label"][:] == [0, 1, 1]
    assert sorted(f.name for f in (tmp_path / "data" / "tasks").iterdir()) == ["sst2"]  # nothing left half-written


def test_report_lists_each_failed_task_and_averages_only_complete_rows():
    summary = {"sst2": {"teacher": {"accuracy": 0.9, "passed_gate": True}, "trivial": {"accuracy": 0.5},
                        "s": {"accuracy": 0.88, "retention": 0.88 / 0.9}},
               "rte": {"teacher": {"accuracy": 0.52, "passed_gate": False, "gate": "rte: ..."},
                       "trivial": {"accuracy": 0.53}}}
    tasks, rows = build_rows(summary, teacher="teacher")
    by_name = {r["model"]: r for r in rows}
    assert by_name["teacher"]["avg"] == pytest.approx((0.9 + 0.52) / 2)
    assert by_name["s"]["avg"] is None  # not distilled for rte: no average over sst2 alone beside the teacher's
    assert by_name["s"]["retention"] == pytest.approx(0.88 / 0.9)  # over the tasks both have
    md = render_markdown(tasks, rows, [], ["rte: the fine-tuned teacher scores 0.5200 ..."])
    assert "\n\n- rte: the fine-tuned teacher scores 0.5200 ...\n\n| System |" in md
    assert "| s | - | - | - | 88.0 | - | - | 97.8% |" in md
